"""mpirun next to TensorBoard: Open MPI's hwloc GL plugin must not hang the launcher's jobs.

With Xlib installed and no X socket, hwloc's GL plugin makes Xlib try TCP 127.0.0.1:6000+N for
the displays it probes; display :6 is port 6006, where `make tensorboard` listens, and mpirun
waits forever for an X handshake. Everything runs in a private network namespace with its own
loopback, so the stand-in listener cannot trap any other process on the machine.
"""

import ctypes.util
import json
import os
import shutil
import subprocess
import sys

import pytest

from helpers import RANKS, ROOT

pytestmark = [
    pytest.mark.mpi,
    pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare"), reason="needs root for unshare --net"),
    pytest.mark.skipif(
        ctypes.util.find_library("X11") is None,
        reason="libx11-6 not installed (tools/install.sh installs it): the hazard needs Xlib",
    ),
]
TRAP = str(RANKS / "x11_trap.py")


def trapped(timeout: float, cmd: list[str]) -> dict:
    proc = subprocess.run(
        ["unshare", "--net", "--", sys.executable, TRAP, str(timeout), *cmd],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout + 60,
        env={**os.environ, "PYTHONPATH": f"{ROOT}:{RANKS}", "OMP_NUM_THREADS": "1"},
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_the_stand_in_really_traps_a_plain_mpirun():
    """The control: without HWLOC_COMPONENTS=-gl, mpirun connects to port 6006 and hangs there."""
    mpirun = ["mpirun", "--allow-run-as-root", "-np", "2", "--oversubscribe", sys.executable, "-c", "print('started')"]
    got = trapped(20, mpirun)
    assert got["rc"] is None and got["connections"] >= 1, got


def test_a_two_rank_job_through_the_launcher_starts_and_finishes():
    got = trapped(
        120, [sys.executable, "-m", "launch", "-np", "2", "--oversubscribe", "--module", "netns_rank", "--", "report"]
    )
    assert got["rc"] == 0 and got["connections"] == 0, got
    assert got["output"].count("local_size 2") == 2, got  # both ranks ran
    assert "+ env HWLOC_COMPONENTS=-gl mpirun" in got["output"]  # the printed line is safe to copy
