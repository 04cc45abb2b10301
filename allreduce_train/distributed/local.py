"""One process, no communication: the exchange of a run without mpirun.

Like Lightning Fabric's single-device strategy: every collective returns its input, so the whole
training loop (data, steps, evaluation, checkpoints, logging) runs in one process -- what the fast
in-process unit tests use. The average over one worker is its own gradient, so the parameters
match a one-rank run of any other strategy step for step.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import astuple
from typing import TYPE_CHECKING, Any

import torch

from .base import GradientExchange
from .mpi import abort, allgather_pickle, bcast_pickle, import_mpi, launched_as, poll, sum_now

if TYPE_CHECKING:
    from mpi4py.MPI import Comm


class LocalExchange(GradientExchange):
    name = "local"
    rank, size, local_rank, local_size = 0, 1, 0, 1

    def prepare(
        self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, every_step: bool = True
    ) -> torch.optim.Optimizer:
        return optimizer

    def synchronize(self) -> None:
        pass

    def set_exchanging(self, on: bool) -> None:
        pass  # one worker: its own gradient is the average either way

    def apply(self, optimizer: torch.optim.Optimizer) -> None:
        optimizer.step()

    def sum_over_workers(self, values: torch.Tensor) -> torch.Tensor:
        return values

    def broadcast_object(self, obj: Any, root: int = 0) -> Any:
        return obj

    def allgather_object(self, obj: Any) -> list[Any]:
        return [obj]

    def abort(self, code: int) -> None:
        abort(code)


class NoExchange(LocalExchange):
    """``--strategy none``: every rank of an mpirun job trains alone on its shard; nothing travels per step.

    Fabric's single-device strategy once per rank: the gradient exchange and the per-step vote
    (:meth:`end_vote`) return this rank's own values, so N ranks run at the same time on one
    machine as if the network were free -- the bound that ``bench`` and the scaling grids report
    every exchange against (docs/performance.md). The run's bookkeeping still goes through MPI
    (mpi4py): the run directory and hosts at set-up, the start of the watchdog, the metrics every
    ``--log-every`` steps and at the end, a checkpoint's per-worker state, and the starting parameters
    from rank 0. A stop signal (preemption) ends each rank at its own step, and the
    ranks' parameters differ from the first step on: a measurement and a control, not a way to train.
    """

    name = "none"
    one_model = False  # each rank's model is its own: its BatchNorm statistics too

    def __init__(self, timeout: float = 0.0) -> None:
        self.rank, self.size, self.local_rank, self.local_size = astuple(launched_as())
        self.timeout = timeout  # --stall-timeout: a bookkeeping collective gives up after it (0: never)
        self.comm: Comm | None = None
        self.MPI: Any = None  # the mpi4py module, set with comm
        if self.size > 1:
            self.MPI = import_mpi()
            self.comm = self.MPI.COMM_WORLD  # communication: MPI_Init, bookkeeping only

    def _wait(self, test: Callable[[], bool], what: str) -> None:
        poll(test, self.timeout, what)

    def prepare(
        self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, every_step: bool = True
    ) -> torch.optim.Optimizer:
        # communication: every rank starts from rank 0's model and optimizer state: a resumed run's
        # checkpoint, or the weights of --init-from, which only rank 0 read (a fresh run's are equal
        # anyway: the common seed)
        state = self.broadcast_object((model.state_dict(), optimizer.state_dict()) if self.is_main else None)
        if not self.is_main:
            model.load_state_dict(state[0])
            optimizer.load_state_dict(state[1])
        return optimizer

    def end_vote(self) -> torch.Tensor:
        # each rank decides alone, as if every worker had voted as it did (the loss is a mean over workers)
        return self._vote * self.size

    def sum_over_workers(self, values: torch.Tensor) -> torch.Tensor:
        if self.comm is None:
            return values
        # communication: a metric sum (log steps, evaluation, the end), never per step
        return sum_now(self.comm, self.MPI, values, self._wait, "a metric sum").to(values.device)

    def broadcast_object(self, obj: Any, root: int = 0) -> Any:
        if self.comm is None:
            return obj
        return bcast_pickle(self.comm, self.MPI, obj, root, self._wait, "a broadcast")  # communication

    def allgather_object(self, obj: Any) -> list[Any]:
        if self.comm is None:
            return [obj]
        return allgather_pickle(self.comm, self.MPI, obj, self._wait, "an allgather")  # communication

    def abort(self, code: int) -> None:
        abort(code, self.comm)  # mpirun ends every rank at once
