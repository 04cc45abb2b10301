"""``--precision 32|bf16-mixed|16-mixed``: the compute's precision, as one object (Lightning's
``plugins/precision/amp.py``): the forward context, the backward, and the loss scaler's check.

Mixed precision runs the forward pass (and so the backward's matrix products) under
``torch.autocast``; parameters, gradients and the optimizer state stay float32, so the exchange
moves float32 gradients whatever the compute (``--compression`` alone sets the wire). ``16-mixed``
needs a loss scaler: float16 gradients underflow without it. The scaled loss's gradients are
exchanged as they are (a sum commutes with the scale), then :meth:`Precision.unscale` divides them
and checks them for inf/NaN *after* the exchange, where every worker holds the same averaged
gradient -- so every worker skips the same steps and grows or backs off the same scale (on a step
whose gradients did not travel, local SGD's, the workers vote). The scaler's state is checkpointed.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch

from .errors import ConfigError


class LossScaler:
    """Dynamic loss scaling with torch.amp.GradScaler's defaults and rules (start 2**16, x2 after 2000
    steps without inf/NaN, x0.5 and skip the step on one), driven by the trainer after the exchange."""

    def __init__(self, scale: float = 2.0**16, growth_interval: int = 2000) -> None:
        self.scale, self.growth_interval, self.good_steps = scale, growth_interval, 0

    def update(self, found_inf: bool) -> None:
        if found_inf:
            self.scale *= 0.5
            self.good_steps = 0
            return
        self.good_steps += 1
        if self.good_steps == self.growth_interval:
            self.scale *= 2.0
            self.good_steps = 0

    def state_dict(self) -> dict[str, Any]:
        return {"scale": self.scale, "good_steps": self.good_steps}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.scale, self.good_steps = float(state["scale"]), int(state["good_steps"])


class Precision:
    """The run's compute precision on ``device``."""

    def __init__(self, kind: str, device: torch.device) -> None:
        if kind == "16-mixed" and device.type != "cuda":
            raise ConfigError(
                "--precision 16-mixed needs a CUDA device (float16 autocast with a loss scaler); on "
                f"{device.type} use --precision bf16-mixed or 32"
            )
        self.kind, self.device = kind, device
        self.dtype = {"bf16-mixed": torch.bfloat16, "16-mixed": torch.float16}.get(kind)
        self.scaler = LossScaler() if kind == "16-mixed" else None

    def forward_context(self) -> contextlib.AbstractContextManager:
        """Wraps the forward pass and the loss (training and evaluation)."""
        if self.dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.dtype)

    def backward(self, loss: torch.Tensor) -> None:
        """``loss.backward()``, scaled with 16-mixed (the gradient hooks send scaled gradients)."""
        (loss * self.scaler.scale if self.scaler is not None else loss).backward()

    def unscale(self, params: list[torch.Tensor], vote: Any = None) -> bool:
        """After the exchange: divide the gradients by the scale; True when this step must be skipped
        (a gradient is inf/NaN), in which case every gradient is set to None so that the optimizer's
        step leaves the parameters and its state alone. ``vote``: a sum over the workers of a small
        tensor, for steps where the workers' gradients differ (local steps); None when they are the
        averaged ones, identical everywhere. Without a scaler: nothing to do."""
        if self.scaler is None:
            return False
        grads = [p.grad for p in params if p.grad is not None]
        found = torch.zeros(1, device=self.device)
        if grads:
            torch._amp_foreach_non_finite_check_and_unscale_(
                grads, found, torch.full((), 1.0 / self.scaler.scale, device=self.device)
            )
        if vote is not None:
            found = vote(found.double().cpu())  # communication: any worker's inf/NaN skips everyone's step
        skip = bool(found.item() > 0)
        self.scaler.update(skip)
        if skip:
            for p in params:
                p.grad = None
        return skip

    def state_dict(self) -> dict[str, Any]:
        return self.scaler.state_dict() if self.scaler is not None else {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if self.scaler is not None and state:
            self.scaler.load_state_dict(state)

    def describe(self) -> dict[str, Any]:
        out: dict[str, Any] = {"precision": self.kind}
        if self.scaler is not None:
            out["loss_scale"] = self.scaler.scale
        return out
