"""The mpi4py layer that the exchanges on MPI messages share: the parameter server (:mod:`.ps`),
the ring allreduce (:mod:`.ring`) and ``--strategy none``'s bookkeeping (:mod:`.local`); and, for
every engine and the command line, the launcher's environment: where this process is in the job
(:func:`launched_as`) and Open MPI's setting for ranks that wait (:func:`yield_when_idle`).

Every wait here is non-blocking underneath and polled with a deadline (:func:`poll`), so a rank
whose peer never answers raises :class:`~allreduce_train.errors.Stalled` instead of hanging, and a
colocated parameter server keeps serving while its worker part waits. mpi4py is imported only by
:func:`import_mpi`, when an engine starts, so configuration errors are reported before MPI forms.
"""

from __future__ import annotations

import os
import pickle
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING, Any

import numpy as np

from .. import watchdog
from ..errors import Stalled, UserError

if TYPE_CHECKING:  # imported when an engine starts (import_mpi), after the configuration is checked
    import torch
    from mpi4py.MPI import Comm

MAX_BUCKETS = 32000  # bucket indices are the message tags; MPI guarantees tags up to 32767

# What each launcher tells a rank before any process group exists: (rank, size, local rank, local size),
# the first launcher whose rank is set wins. Open MPI's mpirun (every job here), MPICH's Hydra, a PMIx
# launcher (srun --mpi=pmix: a rank only), horovodrun (--gloo, without mpirun).
LAUNCHERS = (
    ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"),
    ("PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"),
    ("PMIX_RANK", "", "", ""),  # "": not set by that launcher
    ("HOROVOD_RANK", "HOROVOD_SIZE", "HOROVOD_LOCAL_RANK", "HOROVOD_LOCAL_SIZE"),
)


@dataclass(frozen=True)
class Place:
    """Where this process is in the job, as its launcher says: global and per-host rank and size."""

    rank: int = 0
    size: int = 1
    local_rank: int = 0
    local_size: int = 1


def launched_as(environ: Mapping[str, str] = os.environ) -> Place:
    """This process's :class:`Place` from the launcher's environment, before any process group exists (what a
    launcher does not set keeps its default: rank 0 of 1 outside any launcher)."""
    for names in LAUNCHERS:
        if names[0] in environ:
            return Place(*(int(environ[n]) if n in environ else d for n, d in zip(names, (0, 1, 0, 1), strict=True)))
    return Place()


def yield_when_idle() -> None:
    """Before MPI_Init: a rank waiting inside MPI yields its core instead of spinning on it, which on a host
    without a spare core would slow the peer it waits for (docs/performance.md); a user's own setting wins."""
    os.environ.setdefault("OMPI_MCA_mpi_yield_when_idle", "1")


def import_mpi() -> ModuleType:
    """mpi4py's ``MPI`` module, initialised for calls from the main thread only."""
    if "mpi4py.MPI" not in sys.modules:
        import mpi4py

        # Only the main thread calls MPI; MPI_THREAD_MULTIPLE would add locking to every call.
        mpi4py.rc.thread_level = "funneled"
    try:
        from mpi4py import MPI
    except ImportError as e:
        raise UserError(f"mpi4py cannot be imported ({e}); run `make install`") from None
    return MPI


def poll(test: Callable[[], bool], timeout: float, what: str, idle: Callable[[], bool] | None = None) -> None:
    """Call ``test`` until it returns True, running ``idle`` (a colocated server's work) between.

    Raises :class:`Stalled` after ``timeout`` seconds (0 = never) in which neither completed anything. The
    pause between tests grows from nothing to 0.5 ms while nothing happens: a spinning rank would
    take the core from the very process it waits for when ranks outnumber cores.
    """
    with watchdog.waiting():  # blocked on peers: never named as behind by the stall watchdog
        last = prev = time.monotonic()
        pause = 0.0
        while not test():
            if idle is not None and idle():
                last, pause = time.monotonic(), 0.0
                watchdog.beat()
                continue
            now = time.monotonic()
            if now - prev > 1.0:  # this process was stopped (SIGSTOP): its peers are not to blame
                last = now
            prev = now
            if timeout and now - last > timeout:
                raise Stalled(f"waiting for {what}")
            if pause:
                time.sleep(pause)
            pause = min(2 * pause or 1e-5, 5e-4)


Wait = Callable[[Callable[[], bool], str], None]  # (test, what): poll with the caller's timeout and idle work


def bcast_pickle(comm: Comm, MPI: ModuleType, obj: Any, root: int, wait: Wait, what: str) -> Any:
    """``comm.bcast`` of a picklable object, non-blocking underneath, so that it times out like every
    other wait (and a colocated rank keeps serving while it waits)."""
    mine = comm.Get_rank() == root
    data = np.frombuffer(pickle.dumps(obj), dtype=np.uint8).copy() if mine else np.empty(0, dtype=np.uint8)
    size = np.array([data.size], dtype=np.int64)
    wait(comm.Ibcast(size, root=root).Test, what)  # communication
    buf = data if mine else np.empty(int(size[0]), dtype=np.uint8)
    wait(comm.Ibcast([buf, MPI.BYTE], root=root).Test, what)  # communication
    return obj if mine else pickle.loads(buf.tobytes())


def allgather_pickle(comm: Comm, MPI: ModuleType, obj: Any, wait: Wait, what: str) -> list[Any]:
    """``comm.allgather`` of a picklable object, non-blocking underneath like :func:`bcast_pickle`."""
    data = np.frombuffer(pickle.dumps(obj), dtype=np.uint8).copy()
    sizes = np.zeros(comm.Get_size(), dtype=np.int64)
    # communication: the sizes, then the pickles
    wait(comm.Iallgather(np.array([data.size], dtype=np.int64), sizes).Test, what)
    counts = [int(n) for n in sizes]
    displs = [sum(counts[:i]) for i in range(len(counts))]
    out = np.empty(sum(counts), dtype=np.uint8)
    wait(comm.Iallgatherv([data, MPI.BYTE], [out, (counts, displs), MPI.BYTE]).Test, what)
    return [pickle.loads(out[d : d + n].tobytes()) for d, n in zip(displs, counts, strict=True)]


def node_rank(comm: Comm, MPI: ModuleType) -> tuple[int, int]:
    """This rank's index among the ranks on its host, and their number (collective over ``comm``)."""
    node = comm.Split_type(MPI.COMM_TYPE_SHARED)  # communication
    out = node.Get_rank(), node.Get_size()
    node.Free()
    return out


def start_sum(comm: Comm, MPI: ModuleType, values: Any) -> tuple[Any, np.ndarray]:
    """Begin the element-wise sum of a small tensor over ``comm`` without waiting (the step's vote,
    a metric): (the MPI request, the array the sum lands in). Wait with :func:`end_sum`."""
    arr = values.detach().cpu().numpy().copy()
    return comm.Iallreduce(MPI.IN_PLACE, arr, op=MPI.SUM), arr  # communication


def end_sum(started: tuple[Any, np.ndarray], wait: Wait, what: str) -> torch.Tensor:
    """The sum begun by :func:`start_sum`, as a CPU tensor, once it has arrived."""
    import torch

    req, arr = started
    wait(req.Test, what)
    return torch.from_numpy(arr)


def sum_now(comm: Comm, MPI: ModuleType, values: Any, wait: Wait, what: str) -> torch.Tensor:
    """The element-wise sum of a small tensor over ``comm`` (global metrics), non-blocking underneath
    so that it times out like every other wait."""
    return end_sum(start_sum(comm, MPI, values), wait, what)


def abort(code: int, comm: Comm | None = None) -> None:
    """End the whole job now: MPI_Abort makes mpirun end every rank at once (ranks blocked in a
    collective, servers waiting for a worker, would otherwise wait for the one that failed), then
    this process. ``comm`` None (one process, or MPI never started): this process only."""
    if comm is not None and comm.Get_size() > 1:
        comm.Abort(code)
    os._exit(code)
