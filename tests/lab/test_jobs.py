"""jobs: a failed job is reported by its real cause, not by whatever it printed last."""

import os

import pytest

from lab.common import jobs
from lab.common.jobs import failure_cause, run
from lab.emulation import netns

# What an emulated job that fails mid-run prints, in order (the trainer's own line, mpirun's
# epilogue, then the launcher's teardown line as the last word).
EMULATED_TAIL = """\
+ ip netns exec art-1-0-head env ALLREDUCE_TRAIN_NETNS=art-1-0 unshare --uts -- sh -c ... mpirun -np 2 ...
emulated cluster art-1-0: 2 hosts h1..h2 (10.213.0.1..10.213.0.2) on one switch, each link 100mbit per direction
step 40: eval loss 0.61, eval accuracy 0.77
allreduce_train: error on rank 1: PSTimeout: no progress for 300 s waiting for bucket 3
--------------------------------------------------------------------------
MPI_ABORT was invoked on rank 1 in communicator MPI_COMM_WORLD
with errorcode 1.
--------------------------------------------------------------------------
link traffic (bytes sent/received): h1 1000/2000, h2 2000/1000
"""

TRACEBACK = """\
Traceback (most recent call last):
  File "/work/main/allreduce_train/errors.py", line 3, in <module>
    raise ValueError("inner")
ValueError: inner

During handling of the above exception, another exception occurred:

Traceback (most recent call last):
  File "/x.py", line 9, in <module>
RuntimeError: outer
--------------------------------------------------------------------------
Primary job  terminated normally, but 1 process returned
a non-zero exit code. Per user-direction, the job has been aborted.
--------------------------------------------------------------------------
link traffic (bytes sent/received): h1 1/2, h2 2/1
"""


def test_the_cause_is_the_programs_own_error_not_the_last_line():
    assert failure_cause(EMULATED_TAIL, 1) == (
        "allreduce_train: error on rank 1: PSTimeout: no progress for 300 s waiting for bucket 3"
    )
    # a rank's error before the launcher's; the launcher's when it is the only one
    assert (
        failure_cause("launch: error: the job ran past --timeout 60s\nallreduce_train: error: x\n", 124)
        == "allreduce_train: error: x"
    )
    assert (
        failure_cause(
            "launch: error: the job ran past --timeout 60s\nlink traffic (bytes sent/received): h1 1/2\n", 124
        )
        == "launch: error: the job ran past --timeout 60s"
    )


def test_the_cause_of_a_traceback_is_its_exception_then_signals_then_the_exit_status():
    assert failure_cause(TRACEBACK, 1) == "ValueError: inner"  # the root of the chain, not errors.py's path
    signal = (
        "mpirun noticed that process rank 0 with PID 7 on node h1 exited on signal 9 (Killed).\n"
        "link traffic (bytes sent/received): h1 1/2\n"
    )
    assert failure_cause(signal, 137).startswith("mpirun noticed that process rank 0")
    assert (
        failure_cause("link traffic (bytes sent/received): h1 1/2\nMPI_ABORT was invoked, errorcode 1\n", 3) == "exit 3"
    )
    assert failure_cause("", -1) == "timed out" and failure_cause("", -9) == "killed by signal 9"


@pytest.mark.mpi
def test_a_failed_emulated_job_reports_the_trainers_error(tmp_path, namespaces_permitted):
    argv = jobs.emulated_launcher("1gbit", timeout=120)(
        2, ["--data-dir", str(tmp_path / "missing"), "--steps", "2", "--run-dir", str(tmp_path)]
    )
    res = run(argv, env={**os.environ, "OMP_NUM_THREADS": "1"}, timeout=180, log_path=str(tmp_path / "job.log"))
    assert not res.ok
    assert res.output.rstrip().splitlines()[-1].startswith("link traffic")  # the last line says nothing
    assert res.error_line().startswith("allreduce_train: error") and "missing" in res.error_line(), res.output
    assert netns.leftovers() == []
