"""Local SGD (``--average-every H``): exchange less often.

Steps come in periods of H. The first H-1 steps of a period are local: each worker steps on its
own gradient and nothing crosses the network but the step's two-number vote (stop requested,
loss finite). The H-th step is synchronous: the gradients are averaged by the engine, as in
synchronous SGD, and after the update the parameters are averaged over the workers (one sum of
every parameter), which ends the drift of the local steps. Momentum buffers stay each worker's
own, as in torch's post-local SGD (``PeriodicModelAverager``). With H = 1 every step is synchronous
and the parameters are identical after every update, so their average is skipped: the run is
synchronous SGD through this path, bit for bit (tests/mpi/test_concepts.py checks it against the
engine's ordinary path). ``--average-warmup-steps W`` makes the first W steps synchronous
(post-local SGD, Lin et al. 2020); the periods count from there.

Between averagings the workers hold different parameters and momentum, so a checkpoint keeps every
worker's own (:meth:`LocalSGD.state_dict`); where a period stands follows from the step.

A schedule (:mod:`.schedules`): it asks the engine for a gradient sum only on synchronous steps
(``set_exchanging``) and averages the parameters through its grouped ``sum_tensors``; no engine
knows about it. The gradients of a synchronous step travel in the wire format (``--compression``).
"""

from __future__ import annotations

from typing import Any

import torch

from .base import GradientExchange
from .schedules import Sync
from .wire import WireFormat
from .wirecost import localsgd_bytes_per_step as bytes_per_step

__all__ = ["LocalSGD", "bytes_per_step"]


class LocalSGD(Sync):
    """``--average-every H``: which steps exchange, and the parameter average at a period's end."""

    state_key = "local_sgd"

    def __init__(self, ex: GradientExchange, wire: WireFormat, every: int, warmup: int = 0) -> None:
        super().__init__(ex, wire)
        self.every, self.warmup = every, warmup

    @property
    def every_step(self) -> bool:
        return False

    def synchronous(self, step: int) -> bool:
        """Whether step ``step`` (1-based) averages the gradients: warm-up steps and each period's last."""
        return step <= self.warmup or (step - self.warmup) % self.every == 0

    def exchanging(self, step: int) -> bool:
        return self.synchronous(step)

    def averaged(self, step: int) -> bool:
        return self.synchronous(step)

    @torch.no_grad()
    def apply(self, optimizer: torch.optim.Optimizer, model: torch.nn.Module, step: int) -> None:
        """The update; at the end of a period past the warm-up, the parameters averaged."""
        self.ex.apply(optimizer)
        if self.every == 1 or step <= self.warmup or not self.synchronous(step):
            return
        params: list[torch.Tensor] = list(model.parameters())
        # communication: every parameter, summed over the workers (identical on every worker after)
        for p, total in zip(params, self.ex.sum_tensors(params, "localsgd.params"), strict=True):
            p.copy_(total.div_(self.ex.num_workers))

    def state_dict(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
        """This worker's own parameters and optimizer state (momentum), for the checkpoint."""
        return {"params": [p.detach().cpu().clone() for p in model.parameters()], "optimizer": optimizer.state_dict()}

    @torch.no_grad()
    def load_state_dict(self, state: dict[str, Any], model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
        """Resume this worker where it stood (after the exchange's prepare() gave it rank 0's)."""
        for p, saved in zip(model.parameters(), state["params"], strict=True):
            p.copy_(saved)
        optimizer.load_state_dict(state["optimizer"])

    def describe(self) -> dict[str, Any]:
        return {**self.wire.describe(), "average_every": self.every}
