"""Slurm: the batch script of ``python -m launch slurm`` and jobs on the emulated cluster
(lab/emulation/slurm_cluster.py).

The cluster tests start real daemons (munged, slurmctld, one slurmd per network namespace), submit
real jobs with sbatch and skip, with the reason, where Slurm is not installed or namespaces are not
permitted. One cluster serves the module; it is removed afterwards whatever happened, and the last
test checks that nothing of it is left.
"""

import dataclasses
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from lab.emulation import slurm_cluster
from launch import mpirun, slurm
from launch.mpirun import RING_RULES, LaunchSpec, build_command

from helpers import QUICK, ROOT, check, load_params

JOB_TIMEOUT = 420  # seconds; a job that hangs fails its test and is cancelled (a loaded 2-core machine: ~3 min)


def run_launcher(args: list[str], timeout: float = JOB_TIMEOUT + 30, env: dict[str, str] | None = None):
    return subprocess.run(
        [sys.executable, "-m", "launch", "slurm", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})},
    )


# -- the script: no cluster needed ----------------------------------------------------------


def test_script_asks_for_the_nodes_and_wires_preemption_to_requeue():
    job = slurm.SlurmJob(
        nodes=4,
        ntasks_per_node=2,
        cpus_per_task=3,
        gpus_per_node=2,
        time="2:00:00",
        partition="gpu",
        account="proj1",
        grace=90,
        trainer_args=["--model", "lenet5"],
    )
    text = slurm.render_script(job, environ={"PATH": "/bin"}, is_root=False)
    directives = [ln.split(" ", 1)[1] for ln in text.splitlines() if ln.startswith("#SBATCH")]
    assert directives == [
        "--job-name=allreduce-train",
        "--nodes=4",
        "--ntasks-per-node=2",
        "--cpus-per-task=3",
        "--gpus-per-node=2",
        "--time=2:00:00",
        "--partition=gpu",
        "--account=proj1",
        "--output=runs/slurm-%j.out",
        "--open-mode=append",
        "--signal=B:USR1@90",
        "--requeue",
    ]
    assert "trap '" in text and 'kill -USR1 "$job"' in text and text.rstrip().endswith('exit "$rc"')
    assert 'scontrol requeue "$SLURM_JOB_ID"' in text and '"$rc" -eq 75' in text
    assert "resume=(--resume auto)" in text and "SLURM_RESTART_COUNT" in text
    assert "export HWLOC_COMPONENTS=-gl" in text
    proc = subprocess.run(["bash", "-n"], input=text, capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr


def test_the_job_step_is_the_launchers_mpirun_line_reading_the_allocation():
    job = slurm.SlurmJob(nodes=2, mca=[("btl_tcp_if_include", "eth0")], trainer_args=["--lr", "0.1"])
    env = {"PATH": "/bin", "HOROVOD_FUSION_THRESHOLD": "1", "HWLOC_COMPONENTS": "-gl"}
    text = slurm.render_script(job, environ=env, is_root=True)
    # the step runs inside the launcher's bound (launch/run.py), as python -m launch runs its own
    bounded = f"\n{job.python} -m launch run -- \\\n    mpirun "
    assert bounded in text, text
    step = text[text.index(bounded) + len(bounded) - len("mpirun ") : text.index(" &\n")].replace(" \\\n    ", " ")
    local = build_command(
        LaunchSpec(np=2, mca=[("btl_tcp_if_include", "eth0")], python=job.python, mpi_allreduce="ring"),
        environ=env,
        is_root=True,
    )
    local[local.index("-np") + 1] = "$SLURM_NTASKS"  # the allocation's task count, not a number
    assert step.startswith(" ".join(local[:-3]).replace("^openib", "'^openib'") + " ")
    assert "-H" not in step.split() and "--hostfile" not in step
    assert step.endswith(
        '-m allreduce_train train "${resume[@]}" --name "slurm-$SLURM_JOB_ID" --expect-hosts 2 --lr 0.1'
    )
    named = slurm.render_script(slurm.SlurmJob(trainer_args=["--name", "mine"]), environ=env, is_root=True)
    assert 'slurm-$SLURM_JOB_ID"' not in named and "--name mine" in named


def test_srun_mode_sets_open_mpi_parameters_in_the_environment():
    job = slurm.SlurmJob(srun=True, mca=[("btl_tcp_if_include", "10.0.0.0/8")], trainer_args=["--steps", "3"])
    text = slurm.render_script(job, environ={"PATH": "/bin"}, is_root=True)
    assert (
        "export OMPI_MCA_pml=ob1\nexport OMPI_MCA_btl='^openib'\nexport OMPI_MCA_coll_tuned_use_dynamic_rules=1\n"
        f"export OMPI_MCA_coll_tuned_dynamic_rules_filename={RING_RULES}\n"
        "export OMPI_MCA_btl_tcp_if_include=10.0.0.0/8"
    ) in text
    auto = slurm.render_script(dataclasses.replace(job, mpi_allreduce="auto"), environ={"PATH": "/bin"}, is_root=True)
    assert "coll_tuned" not in auto
    assert "-m launch run -- \\\n    srun --mpi=pmix" in text
    assert "mpirun -np" not in text and "mpirun --allow" not in text and "--export" not in text
    assert subprocess.run(["bash", "-n"], input=text, capture_output=True, text=True, timeout=30).returncode == 0


@pytest.mark.parametrize("srun", [False, True])
def test_slurm_and_python_m_launch_merge_the_users_mca_with_the_defaults_alike(srun):
    """One merge: a user's key replaces the default (Open MPI refuses a key listed twice on mpirun's
    line; srun's environment once exported btl twice), the rules' pairs, then the user's, in order."""
    user = [("btl", "tcp,self"), ("btl_tcp_if_include", "eth0")]
    line = build_command(LaunchSpec(np=2, mca=user, mpi_allreduce="ring"), environ={}, is_root=False)
    pairs = [(line[i + 1], line[i + 2]) for i in range(len(line) - 2) if line[i] == "-mca"]
    assert pairs == [("pml", "ob1"), *mpirun.allreduce_mca(str(RING_RULES), []), *user]
    text = slurm.render_script(slurm.SlurmJob(srun=srun, mca=user), environ={"PATH": "/bin"}, is_root=False)
    if srun:
        exported = re.findall(r"^export OMPI_MCA_(\w+)=(.*)$", text, re.M)
        assert [(k, shlex.split(v)[0]) for k, v in exported] == pairs
    else:
        step = text[text.index("    mpirun ") : text.index(" &\n")].replace(" \\\n    ", " ").split()
        assert [(step[i + 1], shlex.split(step[i + 2])[0]) for i in range(len(step) - 2) if step[i] == "-mca"] == pairs


def test_dry_run_prints_the_script_and_writes_nothing(tmp_path):
    script = tmp_path / "job.sbatch"
    proc = check(run_launcher(["--nodes", "2", "--dry-run", "--script", str(script), "--", "--steps", "1"], timeout=60))
    assert proc.stdout.startswith("#!/bin/bash\n") and "#SBATCH --nodes=2" in proc.stdout
    assert not script.exists()


def test_without_submit_the_script_is_written_as_printed(tmp_path):
    script = tmp_path / "job.sbatch"
    proc = check(
        run_launcher(
            ["--script", str(script), "--output", str(tmp_path / "o-%j.out"), "--", "--steps", "1"], timeout=60
        )
    )
    assert script.read_text() in proc.stdout and f"sbatch {script}" in proc.stdout


def test_bad_input_is_one_line():
    for args, needle in (
        (["--nodes", "0"], "--nodes"),
        (["--time", "two hours"], "--time"),
        (["--grace", "-1"], "--grace"),
        (["--partition", "a b"], "--partition"),
    ):
        proc = run_launcher([*args, "--dry-run", "--"], timeout=60)
        assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1 and needle in proc.stderr, args


def test_cluster_config_gives_each_node_its_own_directories_and_links():
    spec = slurm_cluster.SlurmClusterSpec(nodes=3, link_rate="100mbit", cpus=2, state_dir="/x", controller_host="ctl")
    conf = spec.slurm_conf()
    assert "SlurmctldHost=ctl(10.214.0.254)" in conf and "AuthInfo=socket=/x/munge/munge.socket,cred_expire=15" in conf
    for key in (
        "SlurmdSpoolDir=/x/spool/%n",
        "SlurmdPidFile=/x/run/slurmd-%n.pid",
        "TmpFS=/x/tmp/%n",
        "SchedulerParameters=batch_sched_delay=0",
        "ProctrackType=proctrack/linuxproc",
    ):
        assert key in conf.splitlines()
    assert "NodeName=n3 NodeAddr=10.214.0.3 CPUs=2 State=UNKNOWN" in conf
    assert "PartitionName=debug Nodes=n[1-3] Default=YES MaxTime=INFINITE State=UP" in conf
    tbf = [c for c in spec.network_commands() if c[0] == "tc"]
    assert len(tbf) == 6 and all(c[c.index("rate") + 1] == "100000000bit" for c in tbf)  # both directions
    assert spec.slurmd_command(2)[:3] == ["nsenter", "--net=/run/netns/sl-n2", "unshare"]  # not ip netns exec
    with pytest.raises(ValueError, match="--nodes"):
        slurm_cluster.SlurmClusterSpec(nodes=0)


def _reason() -> str | None:
    return slurm_cluster.unavailable_reason()


# -- cluster start and teardown (before the module's cluster exists) ---------------------------


@pytest.mark.slurm
def test_failed_start_removes_everything(tmp_path):
    """slurmd that cannot start (here: a slurmd that exits at once) fails `up` with its reason and
    leaves no daemon, namespace, bridge or state behind."""
    reason = _reason()
    if reason:
        pytest.skip(reason)
    if slurm_cluster.leftovers():
        pytest.skip("an emulated Slurm cluster is up")
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "slurmd").write_text("#!/bin/sh\necho 'slurmd: fatal: this node is broken' >&2\nexit 1\n")
    (fake / "slurmd").chmod(0o755)
    proc = subprocess.run(
        [sys.executable, "-m", "lab.emulation.slurm_cluster", "up", "--nodes", "2"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PATH": f"{fake}:{os.environ['PATH']}"},
    )
    assert proc.returncode == 2 and "this node is broken" in proc.stderr, proc.stderr
    assert slurm_cluster.leftovers() == []
    assert not [p for p in Path("/proc").glob("[0-9]*/comm") if _comm(p) in ("slurmctld", "munged")]


def _comm(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return ""


@pytest.mark.mpi
@pytest.mark.slurm
def test_down_stops_a_running_job_and_leaves_nothing(tmp_path):
    """After the module's cluster is gone: a fresh one with a job still running is removed by `down`."""
    reason = _reason()
    if reason:
        pytest.skip(reason)
    if slurm_cluster.leftovers():
        pytest.skip("an emulated Slurm cluster is up")
    try:
        spec = slurm_cluster.SlurmClusterSpec(nodes=2, link_rate="none")
        slurm_cluster.up(spec, log=lambda _m: None)
        env = {**os.environ, **spec.env()}
        check(
            subprocess.run(
                ["sbatch", "-N", "2", "-o", str(tmp_path / "o"), "--wrap", "srun sleep 271828"],
                capture_output=True,
                text=True,
                timeout=30,
                env=env,
            )
        )
        deadline = time.monotonic() + 60
        while (
            "RUNNING"
            not in subprocess.run(
                ["squeue", "-h", "-o", "%T"], capture_output=True, text=True, timeout=30, env=env
            ).stdout
        ):
            assert time.monotonic() < deadline, "the job did not start"
            time.sleep(0.2)
    finally:
        slurm_cluster.down(log=lambda _m: None)
    assert slurm_cluster.leftovers() == []
    survivors = [p for p in Path("/proc").glob("[0-9]*/cmdline") if b"sleep\x00271828" in _read(p)]
    assert survivors == []


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError:
        return b""


# -- on the emulated cluster -----------------------------------------------------------------


@pytest.fixture(scope="module")
def cluster():
    reason = _reason()
    if reason:
        pytest.skip(reason)
    if slurm_cluster.leftovers():
        pytest.skip(
            f"an emulated Slurm cluster is already up or left over ({', '.join(slurm_cluster.leftovers())}); "
            "stop it with: python -m lab.emulation.slurm_cluster down"
        )
    try:
        slurm_cluster.up(slurm_cluster.SlurmClusterSpec(nodes=2, link_rate="100mbit"), log=lambda _m: None)
        state = slurm_cluster.read_state()
        assert state is not None  # up() recorded it
        yield slurm_cluster.SlurmClusterSpec(**state["spec"])
    finally:
        slurm_cluster.down(log=lambda _m: None)


def submit(tmp_path: Path, args: list[str], trainer_args: list[str], name: str) -> subprocess.CompletedProcess:
    return run_launcher(
        [
            "--output",
            str(tmp_path / "slurm-%j.out"),
            "--script",
            str(tmp_path / f"{name}.sbatch"),
            "--job-name",
            name,
            "--submit",
            "--timeout",
            str(JOB_TIMEOUT),
            *args,
            "--",
            *trainer_args,
        ]
    )


def job_id(proc: subprocess.CompletedProcess) -> str:
    m = re.search(r"submitted job (\d+)", proc.stdout)
    assert m, proc.stdout + proc.stderr
    return m.group(1)


STEPS = 60  # at 100mbit at least 20 ms a step (LeNet-5's 247 KB of gradients each way): time to preempt


def link_bytes(spec, i: int) -> tuple[int, int]:
    """(received, sent) bytes on node ``i``'s link, from the kernel's interface counters."""
    out = subprocess.run(
        ["ip", "-n", spec.netns(i), "-j", "-s", "link", "show", "dev", slurm_cluster.NODE_IFACE],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    ).stdout
    stats = json.loads(out)[0]["stats64"]
    return stats["rx"]["bytes"], stats["tx"]["bytes"]


@pytest.fixture(scope="module")
def uninterrupted(cluster, tmp_path_factory):
    """A 2-node job of the trainer, run once: the reference for the preemption test. Also returns
    the bytes each node's link carried during the job."""
    d = tmp_path_factory.mktemp("uninterrupted")
    before = [link_bytes(cluster, i) for i in (1, 2)]
    proc = submit(
        d,
        ["--nodes", "2"],
        QUICK + ["--steps", str(STEPS), "--run-dir", str(d), "--dump-params", str(d / "params{rank}.pt")],
        "reference",
    )
    moved = [tuple(b - a for a, b in zip(before[i - 1], link_bytes(cluster, i), strict=True)) for i in (1, 2)]
    return d, proc, moved


@pytest.mark.mpi
@pytest.mark.slurm
@pytest.mark.timeout(JOB_TIMEOUT + 60)  # the job runs in the module fixture, within this test's time
def test_two_node_job_runs_one_rank_per_node_and_writes_its_metrics(uninterrupted):
    d, proc, moved = uninterrupted
    check(proc)
    jid = job_id(proc)
    metrics = json.loads((d / f"slurm-{jid}" / "metrics.json").read_text())
    assert metrics["hosts"] == ["n1", "n2"] and metrics["world_size"] == 2 and metrics["steps"] == STEPS
    # the same parameters on both nodes: the gradients were averaged ...
    a, b = load_params(d / "params0.pt"), load_params(d / "params1.pt")
    assert all(torch.equal(a[k], b[k]) for k in a)
    # ... over the emulated links: each node sent and received at least half a gradient per step
    half_gradient = 4 * sum(t.numel() for k, t in a.items() if t.is_floating_point()) // 2
    for received, sent in moved:
        assert received > STEPS * half_gradient and sent > STEPS * half_gradient, moved
    assert f"job {jid} RUNNING on n[1-2]" in proc.stdout and f"job {jid} COMPLETED" in proc.stdout
    assert f"done: {STEPS} steps" in (d / f"slurm-{jid}.out").read_text()


STARTERS = ("mpirun", "srun")


@pytest.fixture(scope="module")
def preempted(cluster, uninterrupted, tmp_path_factory):
    """SIGUSR1 to the batch shell (what --signal=B:USR1@GRACE sends before the time limit) of two jobs
    at once, one whose ranks mpirun starts and one whose srun (PMIx) starts: each node has a CPU for
    each job, and much of a preempted job's time is Slurm's (the requeue waits cred_expire), so the two
    overlap instead of queueing. Per starter: (run dir, job id, the launcher's exit code, stdout, stderr)."""
    env = {**os.environ, **cluster.env()}
    jobs = {}
    try:
        for starter in STARTERS:
            d = tmp_path_factory.mktemp(f"preempted-{starter}")
            jobs[starter] = (
                d,
                subprocess.Popen(
                    [
                        sys.executable,
                        "-m",
                        "launch",
                        "slurm",
                        "--output",
                        str(d / "slurm-%j.out"),
                        "--script",
                        str(d / "p.sbatch"),
                        "--job-name",
                        f"preempted-{starter}",
                        "--nodes",
                        "2",
                        "--submit",
                        *(["--srun"] if starter == "srun" else []),
                        "--timeout",
                        str(JOB_TIMEOUT),
                        "--",
                        *QUICK,
                        "--steps",
                        str(STEPS),
                        "--checkpoint-every",
                        "10",
                        "--run-dir",
                        str(d),
                        "--dump-params",
                        str(d / "params{rank}.pt"),
                    ],
                    cwd=ROOT,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                    env={**env, "OMP_NUM_THREADS": "1"},
                ),
            )
        deadline = time.monotonic() + JOB_TIMEOUT
        jids: dict[str, str] = {}
        waiting = set(STARTERS)
        while waiting:  # preempt each job mid-run, past step 10
            for starter in sorted(waiting):
                d, launcher = jobs[starter]
                assert launcher.poll() is None and time.monotonic() < deadline, (
                    f"{starter}: the job ended before it was preempted"
                )
                jid = (
                    jids.get(starter)
                    or subprocess.run(
                        ["squeue", "-h", "-n", f"preempted-{starter}", "-o", "%i"],
                        capture_output=True,
                        text=True,
                        timeout=30,
                        env=env,
                    ).stdout.strip()
                )
                jids[starter] = jid
                if jid and (d / f"slurm-{jid}" / "checkpoint.pt").exists():
                    check(
                        subprocess.run(
                            ["scancel", "--batch", "--signal=USR1", jid],
                            capture_output=True,
                            text=True,
                            timeout=30,
                            env=env,
                        )
                    )
                    waiting.discard(starter)
            time.sleep(0.1)
        ended = {}
        for starter, (d, launcher) in jobs.items():
            out, err = launcher.communicate(timeout=JOB_TIMEOUT)
            ended[starter] = d, jids[starter], launcher.returncode, out, err
        return ended
    finally:
        for _d, launcher in jobs.values():
            if launcher.poll() is None:
                launcher.kill()
                launcher.wait()


@pytest.mark.mpi
@pytest.mark.slurm
@pytest.mark.timeout(2 * JOB_TIMEOUT + 60)  # the two jobs run at once, in the first test's time
@pytest.mark.parametrize("starter", STARTERS)
def test_preempted_job_checkpoints_requeues_and_ends_like_an_uninterrupted_one(preempted, uninterrupted, starter):
    """The preempted job checkpoints, exits 75, is requeued, resumes, and ends with the uninterrupted
    job's parameters, one rank per node, whether mpirun or srun (PMIx) started the ranks."""
    tmp_path, jid, rc, out, err = preempted[starter]
    assert rc == 0, out[-3000:] + err[-3000:]
    log = (tmp_path / f"slurm-{jid}.out").read_text()
    assert "checkpoint written, requeueing" in log and f"job {jid} (restart 1)" in log, log[-3000:]
    assert re.search(r"from step (?!0\b)\d+", log), log[-3000:]  # the second run resumed
    assert json.loads((tmp_path / f"slurm-{jid}" / "metrics.json").read_text())["hosts"] == ["n1", "n2"]
    ref = load_params(uninterrupted[0] / "params0.pt")  # (its own test checks that it ran)
    for rank in (0, 1):
        got = load_params(tmp_path / f"params{rank}.pt")
        assert all(torch.equal(ref[k], got[k]) for k in ref), f"rank {rank} differs from the uninterrupted job"


@pytest.mark.slurm
def test_requests_the_cluster_cannot_meet_are_one_line(cluster, tmp_path):
    for args, needle in (
        (["--partition", "gpu"], "--partition gpu: no such partition; this cluster has: debug"),
        (["--nodes", "3"], "--nodes 3: partition debug has only 2 node(s)"),
        (["--ntasks-per-node", "3", "--cpus-per-task", "4"], "CPUs per node"),
        (["--gpus-per-node", "1"], "no GPUs"),
    ):
        proc = submit(tmp_path, args, ["--steps", "1"], "bad")
        assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, (args, proc.stderr)
        assert needle in proc.stderr and "submitted job" not in proc.stdout, (args, proc.stderr)
    out = subprocess.run(
        ["squeue", "-h", "-t", "all", "-n", "bad"],
        capture_output=True,
        text=True,
        timeout=30,
        env={**os.environ, **cluster.env()},
    ).stdout
    assert out.strip() == ""  # nothing was submitted


def test_launcher_without_a_controller_says_how_to_start_one(tmp_path):
    if shutil.which("sinfo") is None:
        pytest.skip("slurm-client not installed")
    conf = tmp_path / "slurm.conf"
    conf.write_text(
        "ClusterName=none\nSlurmctldHost=nowhere(127.0.0.1)\nSlurmctldPort=1\n"
        "MessageTimeout=1\nNodeName=x CPUs=1\nPartitionName=p Nodes=x\n"
    )  # refused in 0.2 s, not 9
    proc = run_launcher(
        ["--submit", "--output", str(tmp_path / "o"), "--script", str(tmp_path / "s"), "--", "--steps", "1"],
        timeout=120,
        env={"SLURM_CONF": str(conf)},
    )
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "python -m lab.emulation.slurm_cluster up" in proc.stderr
