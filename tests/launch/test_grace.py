"""The launcher's bound on a stop that the ranks cannot answer: SIGTERM asks the job to checkpoint
(SIGUSR1 to mpirun); when no rank can (here one is frozen, and --stall-timeout 0 keeps the watchdog
out of it), the job is killed --grace-period seconds later, and a second SIGTERM does not wait."""

import os
import signal
import time

import pytest

from helpers import QUICK, Job, job_pids

pytestmark = pytest.mark.mpi


@pytest.mark.parametrize("how", ["grace-period", "second-sigterm"])
def test_a_sigterm_that_no_rank_can_answer_ends_the_job_without_a_checkpoint(tmp_path, how):
    grace = 5 if how == "grace-period" else 600
    tag = f"{os.getpid()}-{how}"
    job = Job(
        2,
        QUICK + ["--run-dir", str(tmp_path), "--name", "stop", "--steps", "100000", "--stall-timeout", "0"],
        tag,
        launcher=["--grace-period", str(grace)],
    )
    try:
        job.wait_for(", from step 0")
        time.sleep(1.0)  # well into the training loop
        os.kill(job_pids(tag)[1], signal.SIGSTOP)
        job.proc.send_signal(signal.SIGTERM)
        if how == "second-sigterm":
            deadline = time.monotonic() + 30
            while not any("asking the job to checkpoint" in ln for ln in job.err):
                assert job.proc.poll() is None and time.monotonic() < deadline, job.text()
                time.sleep(0.1)
            time.sleep(2)
            job.proc.send_signal(signal.SIGTERM)
        rc = job.finish(timeout=60)  # --grace-period 5, or the second SIGTERM, and then at once
        left = job.kill_leftovers()
    finally:
        job.kill_leftovers()
    err = "".join(job.err)
    assert rc == 128 + signal.SIGTERM, job.text()
    assert ("no checkpoint was written" if how == "grace-period" else "SIGTERM again: killing the job now") in err, err
    assert "preempted" not in err  # the stop wrote no checkpoint (an epoch's end may have written one before)
    assert left == [], f"ranks {left} survived the job"
