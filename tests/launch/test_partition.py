"""Network partitions on the emulated cluster, with real ranks: a host's link cut mid-job
(``ip netns exec <ns> ip link set emu0 down``, a pulled cable).

mpirun learns that a rank exited from that rank's host daemon, and ends a job by telling every
daemon to kill its ranks; a daemon it cannot reach leaves it waiting forever, with no rank left.
The watchdog ends the ranks that can still run (exit 69, naming the rank and host that did not
arrive), and the launcher, which hears of their exits through $ALLREDUCE_TRAIN_EXIT_DIR, gives
mpirun --grace-period seconds and then kills it and removes the hosts (docs/faults.md).
"""

import os
import signal
import subprocess
import time
from collections.abc import Sequence

import pytest
import torch

from lab.emulation import netns

from helpers import QUICK, Job, job_pids, load_params

pytestmark = pytest.mark.mpi

STALL, GRACE = 6, 3  # --stall-timeout and --grace-period here (defaults: 120 and 30 s)


def emulated_job(tmp_path, hosts: int, np: int, args: list[str], tag: str, launcher: Sequence[str] = ()) -> Job:
    return Job(
        np,
        QUICK + ["--run-dir", str(tmp_path), "--checkpoint-every", "10", *args],
        f"{os.getpid()}-{tag}",
        launcher=["--emulate-hosts", str(hosts), "--grace-period", str(GRACE), *launcher],
    )


def wait_for_checkpoint(job: Job, path) -> None:
    """Training is under way on every host: the first checkpoint is on disk."""
    deadline = time.monotonic() + 240
    while not path.exists():
        assert job.proc.poll() is None and time.monotonic() < deadline, job.text()
        time.sleep(0.1)


def set_link(prefix: str, host: str, state: str) -> None:
    subprocess.run(
        ["ip", "netns", "exec", f"{prefix}-{host}", "ip", "link", "set", "emu0", state], check=True, timeout=30
    )


def host_inodes(prefix: str, hosts: int) -> set[int]:
    return {ino for ino in (netns._ns_inode(f"{prefix}-h{i}") for i in range(1, hosts + 1)) if ino}


def assert_nothing_left(job: Job, prefix: str, inodes: set[int]) -> None:
    assert not any(n.startswith(prefix + "-") for n in netns.list_namespaces()), netns.list_namespaces()
    assert netns._holders(inodes) == [], "processes survive inside the emulated hosts"
    assert job_pids(job.tag) == {}, "ranks survive the job"


@pytest.mark.timeout(400)
@pytest.mark.parametrize("cut, missing, sigterm", [("h2", 1, False), ("h1", 0, False), ("h2", 1, True)])
def test_a_cut_link_ends_the_job_within_the_stall_timeout_and_grace_period_naming_the_host(
    tmp_path, namespaces_permitted, cut, missing, sigterm
):
    """h2: rank 1's host; h1: rank 0's, where the watchdog's board and the checkpoint writer run.
    sigterm: a scheduler's SIGTERM after a rank has exited cannot be answered with a checkpoint (the stop
    vote needs every worker): it ends the job at once, without waiting for --grace-period."""
    job = emulated_job(
        tmp_path,
        2,
        2,
        ["--name", "cut", "--steps", "100000", "--stall-timeout", str(STALL)],
        f"cut-{cut}-{sigterm}",
        launcher=["--grace-period", "600"] if sigterm else [],
    )
    prefix = f"art-{job.proc.pid}-0"
    try:
        wait_for_checkpoint(job, tmp_path / "cut" / "checkpoint.pt")
        inodes = host_inodes(prefix, 2)
        set_link(prefix, cut, "down")
        if sigterm:
            deadline = time.monotonic() + STALL + 60
            while not any("did not arrive" in ln for ln in job.err):
                assert job.proc.poll() is None and time.monotonic() < deadline, job.text()
                time.sleep(0.1)
            time.sleep(1)  # the speaker records its exit right after its line
            job.proc.send_signal(signal.SIGTERM)
        rc = job.finish(timeout=STALL + GRACE + 60)  # the bound, with room for a loaded machine
    finally:
        job.kill_leftovers()
    err = "".join(job.err)
    assert rc == 69, job.text()
    assert not sigterm or "has exited 69 (stalled): no checkpoint can be written; stopping the job now" in err, err
    # the rank on the other side says who did not arrive, and where (the cut host's own line is lost with its link)
    assert f"rank(s) {missing} did not arrive (on {cut})" in err, job.text()
    assert_nothing_left(job, prefix, inodes)


@pytest.mark.timeout(600)
def test_a_link_that_comes_back_within_the_stall_timeout_loses_nothing(tmp_path, namespaces_permitted):
    """A cable pulled for 3 s: TCP retransmits, the job carries on and ends as the same job whose link stays up
    does (a job on one host is no reference: it exchanges differently)."""
    args = ["--steps", "40", "--stall-timeout", "60"]
    job = emulated_job(
        tmp_path, 2, 2, ["--name", "flap", *args, "--dump-params", str(tmp_path / "flap-{rank}.pt")], "flap"
    )
    prefix = f"art-{job.proc.pid}-0"
    try:
        wait_for_checkpoint(job, tmp_path / "flap" / "checkpoint.pt")
        inodes = host_inodes(prefix, 2)
        set_link(prefix, "h2", "down")
        time.sleep(3)
        set_link(prefix, "h2", "up")
        rc = job.finish(timeout=300)
    finally:
        job.kill_leftovers()
    assert rc == 0 and "stalled" not in "".join(job.err), job.text()
    assert_nothing_left(job, prefix, inodes)
    ref = emulated_job(
        tmp_path, 2, 2, ["--name", "ref", *args, "--dump-params", str(tmp_path / "ref-{rank}.pt")], "ref"
    )
    try:
        assert ref.finish(timeout=300) == 0, ref.text()
    finally:
        ref.kill_leftovers()
    got, want = load_params(tmp_path / "flap-1.pt"), load_params(tmp_path / "ref-1.pt")
    for k in want:
        assert torch.equal(got[k], want[k]), f"{k} differs from the run whose link never went down"


@pytest.mark.timeout(400)
def test_a_parameter_servers_cut_host_ends_the_job_the_same_way(tmp_path, namespaces_permitted):
    """Rank 0 is the dedicated server, alone on h1; the workers on h2 and h3 wait for it."""
    job = emulated_job(
        tmp_path,
        3,
        3,
        [
            "--name",
            "ps",
            "--steps",
            "100000",
            "--stall-timeout",
            str(STALL),
            "--strategy",
            "ps",
            "--ps-placement",
            "dedicated",
        ],
        "ps-cut",
    )
    prefix = f"art-{job.proc.pid}-0"
    try:
        wait_for_checkpoint(job, tmp_path / "ps" / "checkpoint.pt")
        inodes = host_inodes(prefix, 3)
        set_link(prefix, "h1", "down")
        rc = job.finish(timeout=STALL + GRACE + 60)
    finally:
        job.kill_leftovers()
    assert rc == 69 and "rank(s) 0 did not arrive (on h1)" in "".join(job.err), job.text()
    assert_nothing_left(job, prefix, inodes)


@pytest.mark.timeout(400)
def test_a_second_ctrl_c_kills_a_job_that_mpirun_cannot_end(tmp_path, namespaces_permitted):
    """After the cut, mpirun's "end the job" (the first Ctrl-C) waits on h2's daemon; the second one
    does not wait for --grace-period."""
    job = Job(
        2,
        QUICK
        + [
            "--run-dir",
            str(tmp_path),
            "--name",
            "int",
            "--checkpoint-every",
            "10",
            "--steps",
            "100000",
            "--stall-timeout",
            "0",
        ],
        f"{os.getpid()}-ctrl-c",
        launcher=["--emulate-hosts", "2", "--grace-period", "600"],
    )
    prefix = f"art-{job.proc.pid}-0"
    try:
        wait_for_checkpoint(job, tmp_path / "int" / "checkpoint.pt")
        inodes = host_inodes(prefix, 2)
        set_link(prefix, "h2", "down")
        job.proc.send_signal(signal.SIGINT)
        deadline = time.monotonic() + 30
        while not any("Ctrl-C again" in ln for ln in job.err):
            assert job.proc.poll() is None and time.monotonic() < deadline, job.text()
            time.sleep(0.1)
        time.sleep(2)
        job.proc.send_signal(signal.SIGINT)
        rc = job.finish(timeout=60)
    finally:
        job.kill_leftovers()
    err = "".join(job.err)
    assert rc == 130 and "SIGINT again: killing the job now" in err, job.text()
    assert_nothing_left(job, prefix, inodes)
