"""Preemption: SIGTERM or SIGUSR1 asks the run to stop after the current step, checkpointed.

Schedulers preempt with a signal and a grace period (Slurm: SIGTERM, or ``--signal=B:USR1@120``
ahead of the time limit; Kubernetes: SIGTERM, then SIGKILL after terminationGracePeriodSeconds).
Open MPI's mpirun forwards SIGUSR1 to every rank (SIGTERM it turns into ending the job), so the
launcher turns a SIGTERM it receives into SIGUSR1 for mpirun. A rank only records the signal here;
the trainer's per-step vote tells every worker, so all of them finish the same step, rank 0 writes
the checkpoint and every rank exits with 75 (EX_TEMPFAIL) -- even when one rank alone was signalled.
"""

from __future__ import annotations

import signal
from types import FrameType

STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)
_received: str = ""


def install() -> None:
    """Record SIGTERM/SIGUSR1 instead of dying (main thread; the handler only sets a flag)."""
    for sig in STOP_SIGNALS:
        signal.signal(sig, _record)


def _record(signum: int, _frame: FrameType | None) -> None:
    global _received
    _received = _received or signal.Signals(signum).name


def requested() -> str:
    """The name of the first stop signal this process received, or ''."""
    return _received
