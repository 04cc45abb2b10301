"""DiLoCo (``--diloco-every H``): local SGD with an outer optimizer, Douillard et al. 2023.

Each worker takes H inner steps on its own gradients with the trainer's optimizer (AdamW unless
``--optimizer`` says otherwise, as in the paper; nothing but the step's vote crosses the network).
Then the workers average the *outer gradient* -- how far each moved from the shared parameters,
``outer - local`` -- in one sum of every parameter, and an outer SGD with Nesterov momentum (the
paper's: lr 0.7, momentum 0.9) steps the shared parameters with it;
every worker continues from the result. Outer lr 1 without momentum is plain parameter averaging.

Unlike local SGD (:mod:`.localsgd`) no gradient is ever averaged, so ``--compression`` has nothing
to act on (config's table refuses it), and the inner optimizer's momentum stays each worker's own
(as in the paper and torchft's DiLoCo). Each worker keeps the outer parameters and the outer
momentum (identical everywhere) and its own inner state; a checkpoint keeps all of it per worker.

A schedule (:mod:`.schedules`) over any allreduce engine's grouped ``sum_tensors``: no engine
knows about it.
"""

from __future__ import annotations

from typing import Any

import torch

from .base import GradientExchange
from .schedules import Sync
from .wire import WireFormat
from .wirecost import diloco_bytes_per_step as bytes_per_step

__all__ = ["DiLoCo", "bytes_per_step"]


class DiLoCo(Sync):
    """``--diloco-every H --diloco-outer-lr LR --diloco-outer-momentum MU``: see the module docstring."""

    state_key = "diloco"

    def __init__(
        self, ex: GradientExchange, wire: WireFormat, every: int, outer_lr: float = 0.7, outer_momentum: float = 0.9
    ) -> None:
        super().__init__(ex, wire)
        self.every, self.lr, self.mu = every, outer_lr, outer_momentum
        self.outer: list[torch.Tensor] = []
        self.momentum: list[torch.Tensor] = []

    @property
    def every_step(self) -> bool:
        return False

    def exchanging(self, step: int) -> bool:
        return False  # inner steps only: no gradient travels, ever

    def averaged(self, step: int) -> bool:
        return False

    def prepare(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
        optimizer = super().prepare(model, optimizer)  # every worker now holds rank 0's parameters
        self.outer = [p.detach().clone() for p in model.parameters()]
        self.momentum = [torch.zeros_like(p) for p in self.outer]
        return optimizer

    def outer_step(self, step: int) -> bool:
        """Whether step ``step`` (1-based) ends an inner phase."""
        return step % self.every == 0

    @torch.no_grad()
    def apply(self, optimizer: torch.optim.Optimizer, model: torch.nn.Module, step: int) -> None:
        """The inner update; at the end of an inner phase, the outer Nesterov step on the averaged delta."""
        self.ex.apply(optimizer)
        if not self.outer_step(step):
            return
        params = list(model.parameters())
        deltas = [o - p for o, p in zip(self.outer, params, strict=True)]
        # communication: every parameter's delta, summed over the workers (the outer gradient's sum)
        totals = self.ex.sum_tensors(deltas, "diloco.delta")
        for o, p, m, total in zip(self.outer, params, self.momentum, totals, strict=True):
            grad = total.div_(self.ex.num_workers)
            m.mul_(self.mu).add_(grad)  # torch.optim.SGD(momentum=mu, nesterov=True, dampening=0)'s update
            o.sub_(grad.add(m, alpha=self.mu) if self.mu else grad, alpha=self.lr)
            p.copy_(o)

    def state_dict(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
        """This worker's own parameters and inner optimizer state, and the outer parameters and momentum."""
        return {
            "params": [p.detach().cpu().clone() for p in model.parameters()],
            "optimizer": optimizer.state_dict(),
            "outer": [o.cpu().clone() for o in self.outer],
            "momentum": [m.cpu().clone() for m in self.momentum],
        }

    @torch.no_grad()
    def load_state_dict(self, state: dict[str, Any], model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
        for p, saved in zip(model.parameters(), state["params"], strict=True):
            p.copy_(saved)
        optimizer.load_state_dict(state["optimizer"])
        for mine, saved in zip(self.outer + self.momentum, state["outer"] + state["momentum"], strict=True):
            mine.copy_(saved)

    def describe(self) -> dict[str, Any]:
        return {
            **self.wire.describe(),
            "average_every": 0,
            "diloco_every": self.every,
            "diloco_outer_lr": self.lr,
            "diloco_outer_momentum": self.mu,
        }
