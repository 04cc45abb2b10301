"""Launch one job through the project's launcher and read back what it wrote.

The one copy that every experiment (bench, commbench, the scaling grids) and the tests use. A
*launcher* turns (ranks, arguments, module) into the argv of one job; :func:`local_launcher` runs
it on this machine, :func:`emulated_launcher` on emulated hosts (lab/emulation), with the same signature.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

TRAINER = "allreduce_train"  # the module whose `train` command a job runs unless told otherwise

Launcher = Callable[..., list[str]]  # (np, args, module=TRAINER) -> argv


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (the kernel picked it): for a job's rendezvous
    (DDP's rank 0) or a server this process starts."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def local_launcher(np_: int, args: list[str], module: str = TRAINER, oversubscribe: bool = True) -> list[str]:
    """``python -m launch`` on this machine: the trainer's ``train ARGS``, or ``python -m MODULE ARGS``
    on every rank for an experiment's rank program. Oversubscribed by default: a grid may ask for
    more ranks than cores, and every rank then sleeps while it waits."""
    cmd = [sys.executable, "-m", "launch", "-np", str(np_)] + (["--oversubscribe"] if oversubscribe else [])
    if module != TRAINER:
        cmd += ["--module", module]
    return [*cmd, "--", *args]


# --mpi-allreduce of the lab's emulated-host jobs, as the help says it: what `python -m lab.emulation` (the
# launcher on emulated hosts) takes for a job that spans hosts (launch/mpirun.py ``allreduce_choice``)
EMULATED_ALLREDUCE, EMULATED_ALLREDUCE_HELP = "ring", "ring, as `python -m lab.emulation --emulate-hosts N`"


def emulated_launcher(
    link_rate: str, timeout: float = 0, mca: list[tuple[str, str]] | tuple = (), mpi_allreduce: str = EMULATED_ALLREDUCE
):
    """A drop-in for the benchmark runners' ``launcher(np, args, module) -> argv`` hook: the same
    job on ``np`` emulated hosts, one rank each, every link at ``link_rate``; ``mca``: Open MPI
    parameters for every job (they override the emulation's own); ``mpi_allreduce``: the launcher's
    ``--mpi-allreduce`` (ring: launch/openmpi_allreduce_ring.rules, auto: Open MPI's choice)."""
    from launch.mpirun import MPI_ALLREDUCE_CHOICES

    from ..emulation.netns import parse_rate

    parse_rate(link_rate)
    if mpi_allreduce not in MPI_ALLREDUCE_CHOICES:
        raise ValueError(f"mpi_allreduce: one of {', '.join(MPI_ALLREDUCE_CHOICES)} (got {mpi_allreduce!r})")

    def argv(np_: int, args: list[str], module: str = "allreduce_train") -> list[str]:
        cmd = [
            sys.executable,
            "-m",
            "lab.emulation",
            "-np",
            str(np_),
            "--emulate-hosts",
            str(np_),
            "--link-rate",
            link_rate,
            "--mpi-allreduce",
            mpi_allreduce,
        ]
        for key, value in mca:
            cmd += ["--mca", key, value]
        if module != "allreduce_train":
            cmd += ["--module", module]
        if timeout:
            cmd += ["--timeout", f"{timeout:g}"]
        return [*cmd, "--", *args]

    return argv


@dataclass
class JobResult:
    returncode: int  # -1 when the job ran past its timeout and was killed
    output: str  # its output (the tail, when it went to a log file)
    seconds: float

    @property
    def ok(self) -> bool:
        return self.returncode == 0

    cause: str = ""  # why it failed, from its whole output (see failure_cause)

    def error_line(self) -> str:
        """Why the job failed, in one line."""
        return self.cause or failure_cause(self.output, self.returncode)


# What a failed job's output says about why, strongest evidence first. The last lines are often
# not it: the launcher of an emulated cluster ends every job with its "link traffic" line, mpirun
# adds its own epilogue ("MPI_ABORT was invoked ... errorcode 1"), and a traceback names files
# such as errors.py on the way to the exception.
_OWN_ERROR = re.compile(r"^[\w.\-]+: error\b")  # "allreduce_train: error on rank 1: ...", "launch: error: ..."
_EXCEPTION = re.compile(r"^(?:[A-Za-z_][\w]*\.)*[A-Za-z_]\w*(?:Error|Exception|Interrupt|Exit|Timeout)\b(?::.*)?$")
_SIGNAL = re.compile(r"exited on signal \d+|killed|out of memory", re.IGNORECASE)
_NOISE = ("link traffic", "emulated cluster", "+ ", "MPI_ABORT was invoked", 'File "', "NOTE: invoking MPI_ABORT")


def failure_cause(output: str, returncode: int) -> str:
    """The line of a failed job's ``output`` that says why it failed, else its exit status.

    In order: a program's own error line (a rank's before the launcher's, which only reports a
    timeout or a cluster that could not be built), the exception a Python traceback ends in, mpirun's
    report of a rank killed by a signal, any other line that says "error" and is not launcher or
    mpirun boilerplate."""
    lines = [ln.strip() for ln in output.splitlines() if ln.strip()]
    own = [ln for ln in lines if _OWN_ERROR.match(ln)]
    if own:
        return next((ln for ln in own if not ln.startswith("launch:")), own[0])
    seen_traceback = False
    for ln in lines:
        if ln.startswith("Traceback (most recent call last)"):
            seen_traceback = True
        elif seen_traceback and _EXCEPTION.match(ln):
            return ln
    for test in (lambda ln: _SIGNAL.search(ln), lambda ln: "error" in ln.lower()):
        found = next((ln for ln in lines if test(ln) and not ln.startswith(_NOISE)), None)
        if found:
            return found
    if returncode == -1:
        return "timed out"
    return f"killed by signal {-returncode}" if returncode < 0 else f"exit {returncode}"


def run(
    argv: list[str],
    env: dict[str, str] | None = None,
    timeout: float = 600.0,
    log_path: str = "",
    tail_chars: int = 4000,
) -> JobResult:
    """Run one job to its end (or ``timeout``); its output goes to ``log_path`` when given."""
    t0 = time.monotonic()
    env = dict(os.environ if env is None else env)
    try:
        if log_path:
            os.makedirs(os.path.dirname(os.path.abspath(log_path)), exist_ok=True)
            with open(log_path, "w") as log:
                rc = subprocess.run(argv, stdout=log, stderr=subprocess.STDOUT, env=env, timeout=timeout).returncode
        else:
            proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=timeout)
            rc, out = proc.returncode, proc.stdout + proc.stderr
    except subprocess.TimeoutExpired:
        rc, out = -1, f"timed out after {timeout:.0f} s"
    if log_path:
        with open(log_path, errors="replace") as fh:
            out = fh.read() + ("" if rc != -1 else f"\ntimed out after {timeout:.0f} s")
    cause = failure_cause(out, rc) if rc != 0 else ""  # from the whole output, not only the tail kept
    return JobResult(rc, out[-tail_chars:], time.monotonic() - t0, cause)


def read_json(path: str) -> dict[str, Any] | None:
    """A job's result file (``metrics.json`` of a training run, a rank program's ``--out``), or None."""
    try:
        with open(path) as fh:
            return json.load(fh)
    except (OSError, ValueError):
        return None


def loadavg() -> list[float]:
    """The 1, 5 and 15 minute load averages, recorded beside every measurement."""
    try:
        with open("/proc/loadavg") as fh:
            return [float(v) for v in fh.read().split()[:3]]
    except OSError:
        return []
