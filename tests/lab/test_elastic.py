"""Elastic restarts with real ranks on emulated hosts (network namespaces this test creates and removes):
``--max-restarts N --min-np M`` asks the hosts before a restart and continues on those that answer, from
the checkpoint (launch/elastic.py).

The emulated hosts are only the transport: in the first test the product launcher itself (``python -m
launch -H h1:1,h2:1,h3:1``) runs them as a user runs plain ssh hosts, with the namespaces' agent
(rsh_netns.sh) as Open MPI's ``plm_rsh_agent``, which the launcher's probe uses too; the second goes
through ``python -m lab.emulation``, which builds the hosts around the same launcher."""

import json
import os
import re
import shutil
import subprocess
import sys
import time

import pytest
import torch

from lab.emulation import netns

from helpers import QUICK, Job, load_params

pytestmark = pytest.mark.mpi

# helpers.QUICK with --scale-lr: the LR follows the worker count, which a lost host changes (the resumed job says so)
ELASTIC = [*QUICK, "--scale-lr"]
STALL, GRACE = 6, 3  # --stall-timeout and --grace-period here (defaults: 120 and 30 s)


def wait_for(job: Job, found, timeout: float = 240) -> None:
    deadline = time.monotonic() + timeout
    while not found():
        assert job.proc.poll() is None and time.monotonic() < deadline, job.text()
        time.sleep(0.05)


@pytest.mark.timeout(900)  # three jobs on emulated hosts: slow on a loaded machine
def test_python_m_launch_on_hosts_behind_an_agent_continues_on_those_that_answer_after_a_cut_link(
    tmp_path, namespaces_permitted
):
    """3 hosts, h3's cable pulled after the first checkpoint: the job stalls (exit 69), the launcher's probe
    finds h3 silent and restarts 2 ranks on h1 and h2 from the checkpoint; they end bit-identical to a
    2-rank job started on h1 and h2 from that checkpoint."""
    cluster = netns.ClusterSpec(hosts=3, link_rate="1gbit")
    mca = [word for key, value in cluster.mca() for word in ("--mca", key, value)]
    ifaces = [f"{k}={v}" for k, v in cluster.env().items()]
    steps = ["--steps", "60", "--stall-timeout", str(STALL)]

    def launcher(np: int, hosts: str, flags: list[str], args: list[str]) -> list[str]:
        # what a user types on a head node, run in the head namespace where the switch is
        return [
            *cluster.exec_prefix(),
            "env",
            *ifaces,
            sys.executable,
            "-m",
            "launch",
            "-np",
            str(np),
            "-H",
            hosts,
            "--grace-period",
            str(GRACE),
            *mca,
            *flags,
            "--",
            *ELASTIC,
            "--run-dir",
            str(tmp_path),
            *args,
        ]

    resumed_from = tmp_path / "resumed-from.pt"
    with netns.EmulatedCluster(cluster, log=lambda msg: None):
        job = Job(
            3,
            [],
            f"{os.getpid()}-product-elastic",
            command=launcher(
                3,
                "h1:1,h2:1,h3:1",
                ["--max-restarts", "1", "--min-np", "2"],
                ["--name", "el", *steps, "--checkpoint-every", "10", "--dump-params", str(tmp_path / "el-{rank}.pt")],
            ),
        )
        try:
            wait_for(job, lambda: (tmp_path / "el" / "checkpoint.pt").exists())
            subprocess.run(
                ["ip", "netns", "exec", cluster.netns(3), "ip", "link", "set", "emu0", "down"], check=True, timeout=30
            )
            # the launcher names the lost host before it starts the smaller job: the checkpoint on disk now
            # is the one that job resumes (the step is checked below)
            wait_for(job, lambda: any("elastic: host(s) h3 lost" in ln for ln in job.err), STALL + GRACE + 120)
            shutil.copy(tmp_path / "el" / "checkpoint.pt", resumed_from)
            rc = job.finish(timeout=400)
        finally:
            job.kill_leftovers()
        err, out = "".join(job.err), "".join(job.out)
        assert rc == 0, job.text()
        assert "exit 69 (stalled); restart 1 of 1" in err, err
        assert (
            "elastic: host(s) h3 lost (h3: rsh_netns.sh: connect to host h3: its link is down" in err
            and "continuing on 2 host(s) (h1:1,h2:1): world size 3 -> 2" in err
        ), err
        lines = [ln for ln in out.splitlines() if ln.startswith("+ ") and " mpirun " in ln]
        assert len(lines) == 2 and "-np 2 -H h1:1,h2:1 " in lines[1] and lines[1].endswith("--resume auto"), lines
        start = torch.load(resumed_from, weights_only=True)["step"]
        assert [int(n) for n in re.findall(r", from step (\d+)", out)][-1] == start, (start, job.text())

        ref = Job(
            2,
            [],
            f"{os.getpid()}-product-elastic-ref",
            command=launcher(
                2,
                "h1:1,h2:1",
                [],
                [
                    "--name",
                    "ref",
                    *steps,
                    "--resume",
                    str(resumed_from),
                    "--dump-params",
                    str(tmp_path / "ref-{rank}.pt"),
                ],
            ),
        )
        try:
            assert ref.finish(timeout=400) == 0, ref.text()
        finally:
            ref.kill_leftovers()
    assert not any(n.startswith(cluster.prefix + "-") for n in netns.list_namespaces())
    for rank in (0, 1):
        got, want = load_params(tmp_path / f"el-{rank}.pt"), load_params(tmp_path / f"ref-{rank}.pt")
        for k in want:
            assert torch.equal(got[k], want[k]), f"rank {rank}: {k} differs from the job started on h1, h2 there"


@pytest.mark.timeout(900)  # two jobs on emulated hosts: slow on a loaded machine
def test_a_lost_host_shrinks_the_job_onto_the_remaining_ones(tmp_path, namespaces_permitted):
    args = ELASTIC + ["--run-dir", str(tmp_path), "--name", "el", "--steps", "300", "--checkpoint-every", "10"]
    job = Job(
        2,
        args,
        f"{os.getpid()}-elastic",
        launcher=["--emulate-hosts", "2", "--link-rate", "1gbit", "--max-restarts", "1", "--min-np", "1"],
    )
    prefix = f"art-{job.proc.pid}-0"
    try:
        wait_for(job, lambda: (tmp_path / "el" / "checkpoint.pt").exists())
        netns.remove([f"{prefix}-h2"], grace=1.0)  # host h2 is gone: its processes, its link, its namespace
        rc = job.finish(timeout=600)
    finally:
        job.kill_leftovers()
    err, out = "".join(job.err), "".join(job.out)
    assert rc == 0, job.text()
    assert "elastic: host(s) h2 lost (h2: rsh_netns.sh: no emulated host h2" in err, job.text()
    assert "continuing on 1 host(s) (h1:1): world size 2 -> 1" in err, job.text()
    # the trainer says what the smaller world changes (LR scaled by the workers: --scale-lr is on)
    assert "elastic: resumed with 1 workers from a checkpoint of 2: global batch 32 -> 16, LR 0.1 -> 0.05" in out, (
        job.text()
    )
    metrics = json.loads((tmp_path / "el" / "metrics.json").read_text())
    assert (metrics["world_size"], metrics["steps"]) == (1, 300)
    assert not any(n.startswith(prefix + "-") for n in netns.list_namespaces())
