"""Launch one job through the project's launcher and read back what it wrote.

The one copy that every experiment (bench, commbench, the scaling grids) and the tests use. A
*launcher* turns (ranks, arguments, module) into the argv of one job; :func:`local_launcher` runs
it on this machine, ``launch.netns.emulated_launcher`` on emulated hosts, with the same signature.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Any, Callable

TRAINER = "allreduce_train"  # the module whose `train` command a job runs unless told otherwise

Launcher = Callable[..., list[str]]  # (np, args, module=TRAINER) -> argv


def local_launcher(np_: int, args: list[str], module: str = TRAINER, oversubscribe: bool = True) -> list[str]:
    """``python -m launch`` on this machine: the trainer's ``train ARGS``, or ``python -m MODULE ARGS``
    on every rank for an experiment's rank program. Oversubscribed by default: a grid may ask for
    more ranks than cores, and every rank then sleeps while it waits."""
    cmd = [sys.executable, "-m", "launch", "-np", str(np_)] + (["--oversubscribe"] if oversubscribe else [])
    if module != TRAINER:
        cmd += ["--module", module]
    return [*cmd, "--", *args]


@dataclass
class JobResult:
    returncode: int  # -1 when the job ran past its timeout and was killed
    output: str  # its output (the tail, when it went to a log file)
    seconds: float

    @property
    def ok(self) -> bool:
        return self.returncode == 0

    def error_line(self) -> str:
        """The first line that says "error", else the exit status: why the job failed, in one line."""
        said = [ln.strip() for ln in self.output.splitlines() if "error" in ln.lower()]
        return said[0] if said else ("timed out" if self.returncode == -1 else f"exit {self.returncode}")


def run(argv: list[str], env: dict[str, str] | None = None, timeout: float = 600.0, log_path: str = "",
        tail_chars: int = 4000) -> JobResult:
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
    return JobResult(rc, out[-tail_chars:], time.monotonic() - t0)


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
