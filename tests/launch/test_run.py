"""``python -m launch run -- MPIRUN LINE``: the launcher's bound around a line that the Slurm batch script
and the Kubernetes launcher pod start themselves (launch/run.py)."""

import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from launch import bound

from helpers import QUICK, ROOT, Job, job_pids

pytestmark = pytest.mark.mpi


def mpirun_line(args: list[str]) -> list[str]:
    """The mpirun line ``python -m launch`` would run for 2 ranks here (its dry run)."""
    dry = subprocess.run(
        [sys.executable, "-m", "launch", "-np", "2", "--dry-run", "--", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert dry.returncode == 0, dry.stderr
    return shlex.split(dry.stdout.strip().splitlines()[-1][2:])


def test_a_stop_that_no_rank_can_answer_ends_the_wrapped_line_within_the_grace_period(tmp_path):
    tag = f"{os.getpid()}-run"
    line = mpirun_line(
        QUICK + ["--run-dir", str(tmp_path), "--name", "run", "--steps", "100000", "--stall-timeout", "0"]
    )
    job = Job(2, [], tag, command=[sys.executable, "-m", "launch", "run", "--grace-period", "3", "--", *line])
    try:
        job.wait_for(", from step 0")
        time.sleep(1.0)  # well into the training loop
        os.kill(job_pids(tag)[1], signal.SIGSTOP)  # rank 1 can answer nothing
        job.proc.send_signal(signal.SIGTERM)  # what Slurm or Kubernetes sends before its kill
        rc = job.finish(timeout=60)
        left = job.kill_leftovers()
    finally:
        job.kill_leftovers()
    err = "".join(job.err)
    assert rc == 128 + signal.SIGTERM, job.text()
    assert "asking the job to checkpoint" in err and "no checkpoint was written" in err, err
    assert left == [], f"ranks {left} survived the job"


def test_the_ranks_see_the_wrappers_exit_directory_and_a_stop_they_answer_exits_75(tmp_path):
    tag = f"{os.getpid()}-run75"
    line = mpirun_line(QUICK + ["--run-dir", str(tmp_path), "--name", "run", "--steps", "100000"])
    job = Job(2, [], tag, command=[sys.executable, "-m", "launch", "run", "--grace-period", "60", "--", *line])
    try:
        job.wait_for(", from step 0")
        env = Path(f"/proc/{job_pids(tag)[0]}/environ").read_bytes().split(b"\0")
        assert any(v.startswith(b"ALLREDUCE_TRAIN_EXIT_DIR=/") for v in env)  # inherited from the wrapper
        job.proc.send_signal(signal.SIGUSR1)  # Slurm's warning before the time limit, passed on by the script
        rc = job.finish(timeout=120)
    finally:
        job.kill_leftovers()
    assert rc == 75, job.text()
    assert (tmp_path / "run" / "checkpoint.pt").exists()


def test_without_a_command_it_says_what_to_give():
    out = subprocess.run(
        [sys.executable, "-m", "launch", "run", "--grace-period", "3"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == [
        "launch run: error: give the command after --, e.g. python -m launch run -- mpirun -np 2 ..."
    ]


def test_exit_record_directories_of_dead_launchers_are_removed_by_the_next_one(tmp_path):
    gone = subprocess.Popen(["true"])
    gone.wait()  # its pid now names no process
    stale = tmp_path / f"{bound.EXIT_DIR_PREFIX}{gone.pid}-abc"
    live = tmp_path / f"{bound.EXIT_DIR_PREFIX}{os.getpid()}-def"
    other = tmp_path / "launch-exits-notapid"
    for d in (stale, live, other):
        d.mkdir()
        (d / "0").write_text('{"code": 0}')
    assert bound.remove_stale_exit_dirs(str(tmp_path)) == [stale.name]
    assert not stale.exists() and live.exists() and other.exists()
    env: dict[str, str] = {}
    with bound.exit_dir(env) as made:  # the launcher's own: named after its pid, gone afterwards
        assert os.path.basename(made).startswith(f"{bound.EXIT_DIR_PREFIX}{os.getpid()}-") and env
    assert not os.path.exists(made)
