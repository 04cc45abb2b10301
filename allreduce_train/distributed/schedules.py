"""Schedules: when the workers agree, wrapped once around the trainer's step.

The trainer calls one object at three points of every step -- :meth:`Sync.begin` before backward,
:meth:`Sync.synchronize` after it (the timed wait), :meth:`Sync.apply` for the update -- and at
set-up (:meth:`Sync.prepare`) and checkpoints (:meth:`Sync.state_dict`). The schedule holds the
wire format (:mod:`.wire`) and talks to the engine only through its collective primitives:
``prepare`` (rank 0's state to all), ``set_exchanging`` (whether this step's gradients travel),
``synchronize`` (wait for the gradient sums), ``sum_tensors`` (a grouped sum) and ``apply``.

* :class:`Sync` -- synchronous SGD: every step's gradients averaged.
* :class:`AdasumSync` -- ``--reduce-op adasum`` (Horovod): every step, each worker's own update, combined.
* :class:`~.localsgd.LocalSGD` -- ``--average-every H``: local steps, then gradients and parameters averaged.
* :class:`~.diloco.DiLoCo` -- ``--diloco-every H``: local steps, then an outer Nesterov step on the
  averaged parameter delta.

Which engine runs which schedule is the table in :mod:`allreduce_train.config`.
"""

from __future__ import annotations

from typing import Any

import torch

from .base import GradientExchange
from .wire import WireFormat


class Sync:
    """Synchronous SGD: the engine averages every step's gradients (or the wire format does, after
    backward, through the engine's sum: PowerSGD)."""

    state_key: str | None = None  # the checkpoint's per-worker key of this schedule's state (None: none)

    def __init__(self, ex: GradientExchange, wire: WireFormat) -> None:
        self.ex, self.wire = ex, wire

    @property
    def every_step(self) -> bool:
        """Whether the engine's own gradient sum runs on every step (Horovod then wraps the optimizer)."""
        return self.wire.streams

    def prepare(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
        """Rank 0's model and optimizer state to every worker (the engine), then the layers' own set-up."""
        optimizer = self.ex.prepare(model, optimizer, every_step=self.every_step)
        self.wire.attach(self.ex.sum_tensors, self.ex.num_workers, [p for p in model.parameters() if p.requires_grad])
        return optimizer

    def exchanging(self, step: int) -> bool:
        """Whether step ``step`` (1-based) sends the engine's gradient sum."""
        return self.wire.streams

    def averaged(self, step: int) -> bool:
        """Whether every worker holds the same averaged gradient after step ``step``'s :meth:`synchronize`
        (synchronous SGD: always, through the engine or the wire format's own sums)."""
        return True

    def begin(self, step: int) -> None:
        """Before step ``step``'s backward: tell the engine whether its gradients travel."""
        if not self.every_step:
            self.ex.set_exchanging(self.exchanging(step))

    def synchronize(self) -> None:
        """After backward: the averaged gradients in ``.grad`` (the engine's wait, then the wire format's sums)."""
        self.ex.synchronize()
        self.wire.reduce()

    def apply(self, optimizer: torch.optim.Optimizer, model: torch.nn.Module, step: int) -> None:
        """The update of step ``step`` (after clipping)."""
        self.ex.apply(optimizer)

    def state_dict(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> Any:
        """This worker's schedule state for the checkpoint (None: the parameters are the same everywhere)."""
        return None

    def load_state_dict(self, state: Any, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
        """Resume this worker where it stood (after :meth:`prepare` gave it rank 0's state)."""

    def describe(self) -> dict[str, Any]:
        """metrics.json's fields of the layers (``compression``, ``average_every``, ...)."""
        return {**self.wire.describe(), "average_every": 0}


class AdasumSync(Sync):
    """``--reduce-op adasum``: Horovod's Adasum optimizer (horovod/torch/optimizer.py,
    ``_DistributedAdasumOptimizer``) steps each worker's optimizer on that worker's own gradient, inside
    backward, and combines the workers' updates (Maleki et al. 2021), not their gradients. The parameters
    agree after every step; the optimizer state (momentum) is each worker's own, so the checkpoint keeps
    every worker's and a resume gives it back (rank 0's alone would resume the others off their path)."""

    state_key = "adasum"

    def averaged(self, step: int) -> bool:
        return False  # each worker's .grad is its own: Adasum combines updates, not gradients

    def state_dict(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> Any:
        return {"optimizer": optimizer.state_dict()}

    def load_state_dict(self, state: Any, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
        optimizer.load_state_dict(state["optimizer"])
