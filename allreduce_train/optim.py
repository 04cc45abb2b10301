"""The optimizer and its learning-rate schedule: the recipe a model is trained with.

``--optimizer sgd|adam|adamw|MODULE:CALLABLE`` builds a plain ``torch.optim.Optimizer`` over the
model's parameter groups (:func:`param_groups`: one group, or with ``--no-decay-norm-bias`` a second
one without weight decay for biases and norm weights); a :class:`~.usertask.Task` may return its own
(``Task.optimizer(model)``). Every concept runs it: the allreduce engines and the schedules step it on
the workers, the parameter server's servers run the same class on their shard.

:class:`LRSchedule` is the LR of every step as a pure function of the step (so a checkpoint needs only
the step and the schedule's description): each group's LR is its own initial LR times the worker
count (``--scale-lr``) times the schedule's factor.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from . import usercode
from .config import OptimConfig
from .errors import ConfigError


def param_groups(model: torch.nn.Module, cfg: OptimConfig) -> list[dict[str, Any]]:
    """The model's parameters as optimizer groups: one, or with ``--no-decay-norm-bias`` the matrices
    (2+ dimensions: weights of linear, convolution and embedding layers) with ``--weight-decay`` and the
    rest (biases, norm weights) without (nanoGPT's ``configure_optimizers``). Tied parameters appear
    once (``parameters()`` removes duplicates). Empty groups are left out."""
    params = list(model.parameters())
    if cfg.decay_norm_bias:
        return [{"params": params}]
    decay = [p for p in params if p.dim() >= 2]
    rest = [p for p in params if p.dim() < 2]
    groups: list[dict[str, Any]] = [{"params": decay}, {"params": rest, "weight_decay": 0.0}]
    return [g for g in groups if g["params"]]


def build_optimizer(cfg: OptimConfig, model: torch.nn.Module, task: Any = None) -> torch.optim.Optimizer:
    """The run's optimizer: the task's own (:meth:`.usertask.Task.checked_optimizer`), else ``--optimizer``.
    Each group's ``initial_lr`` is set (torch's LR schedulers use the same key): :class:`LRSchedule`
    scales it every step."""
    optimizer = task.checked_optimizer(model, cfg) if task is not None else None
    if optimizer is None:
        optimizer = _from_flags(cfg, model)
    for group in optimizer.param_groups:
        group.setdefault("initial_lr", group["lr"])
    return optimizer


def _from_flags(cfg: OptimConfig, model: torch.nn.Module) -> torch.optim.Optimizer:
    groups = param_groups(model, cfg)
    if cfg.optimizer == "sgd":
        return torch.optim.SGD(groups, lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)
    if cfg.optimizer in ("adam", "adamw"):
        cls = torch.optim.AdamW if cfg.optimizer == "adamw" else torch.optim.Adam
        return cls(groups, lr=cfg.lr, betas=cfg.beta_pair(), eps=cfg.eps, weight_decay=cfg.weight_decay)
    ref, kwargs = cfg.optimizer, usercode.parse_kwargs("--optimizer-arg", cfg.optimizer_arg)
    fn = usercode.resolve("--optimizer", ref)
    made = usercode.call("--optimizer", ref, fn, callable_groups(cfg, model), **kwargs)
    return check_optimizer(f"--optimizer {ref}", made, model)


def callable_groups(cfg: OptimConfig, model: torch.nn.Module) -> list[dict[str, Any]]:
    """What a user's optimizer callable is given: :func:`param_groups` with each group's ``lr``
    (``--lr``) and ``weight_decay`` filled in, so ``torch.optim.AdamW(groups)`` needs nothing else."""
    groups = param_groups(model, cfg)
    for g in groups:
        g.setdefault("lr", cfg.lr)
        g.setdefault("weight_decay", cfg.weight_decay)
    return groups


def check_optimizer(source: str, made: Any, model: torch.nn.Module) -> torch.optim.Optimizer:
    """A user's optimizer is a torch.optim.Optimizer over this model's parameters: else one line."""
    if not isinstance(made, torch.optim.Optimizer):
        raise ConfigError(f"{source} returned a {type(made).__name__}; return a torch.optim.Optimizer")
    mine = {id(p) for p in model.parameters()}
    foreign = sum(1 for g in made.param_groups for p in g["params"] if id(p) not in mine)
    if foreign:
        raise ConfigError(
            f"{source}: the optimizer holds {foreign} tensor(s) that are not the model's parameters; "
            "build it over the parameter groups it is given"
        )
    return made


@dataclass
class LRSchedule:
    """``--lr-schedule``: the LR of the update after ``step`` completed steps, for a group whose
    initial (one-worker) LR is ``base``.

    * ``step`` (the default, the paper's recipe): warm-up from ``base`` to the scaled LR (Goyal et al.
      2017), then constant, times ``--lr-decay`` after every epoch past ``--lr-decay-after``;
    * ``constant``, ``cosine``, ``linear``: warm-up from 0 to the peak over ``--warmup-steps`` (the
      transformer recipe), then flat, or a cosine or linear decay to ``--min-lr`` at the last step;
    * ``MODULE:CALLABLE``: ``fn(step) -> factor`` of the peak LR, warm-up included.
    """

    kind: str
    workers: int
    total_steps: int
    steps_per_epoch: int
    cfg: OptimConfig
    fn: Callable[[int], float] | None = None

    @classmethod
    def make(cls, cfg: OptimConfig, workers: int, total_steps: int, steps_per_epoch: int) -> LRSchedule:
        fn = None
        if usercode.is_reference(cfg.lr_schedule):
            fn = usercode.resolve("--lr-schedule", cfg.lr_schedule)
        made = cls(cfg.lr_schedule, workers, total_steps, steps_per_epoch, cfg, fn)
        made.factor(0)  # a callable that fails or returns no number fails here, before any rank trains
        return made

    def peak(self, base: float, workers: int | None = None) -> float:
        n = self.workers if workers is None else workers
        return base * n if self.cfg.scale_lr else base

    def lr(self, step: int, base: float, workers: int | None = None) -> float:
        """The LR of a group whose one-worker LR is ``base`` for the update after ``step`` steps
        (``workers``: another worker count, for the elastic restart's message)."""
        c, peak = self.cfg, self.peak(base, workers)
        if self.kind == "step":
            if c.warmup_steps and step < c.warmup_steps:
                return base + (peak - base) * step / c.warmup_steps
            epoch = step // self.steps_per_epoch  # 0-based: epochs 0 .. after-1 at the full LR (TF's PTB tutorial)
            return peak * c.lr_decay ** max(0, epoch + 1 - c.lr_decay_after)
        return peak * self.factor(step)

    def factor(self, step: int) -> float:
        """The factor of the peak LR for the schedules other than ``step``."""
        c = self.cfg
        if self.fn is not None:
            value = usercode.call("--lr-schedule", self.kind, self.fn, step)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
                raise ConfigError(
                    f"--lr-schedule {self.kind}: returned {value!r} for step {step}; return a finite number >= 0 "
                    "(the factor of the peak LR)"
                )
            return float(value)
        if c.warmup_steps and step < c.warmup_steps:
            return (step + 1) / c.warmup_steps  # the first update already moves (nanoGPT's warm-up)
        if self.kind == "constant":
            return 1.0
        floor = c.min_lr / c.lr
        span = max(1, self.total_steps - c.warmup_steps)
        progress = min(1.0, (step - c.warmup_steps) / span)
        shape = 0.5 * (1.0 + math.cos(math.pi * progress)) if self.kind == "cosine" else 1.0 - progress
        return floor + (1.0 - floor) * shape

    def set(self, optimizer: torch.optim.Optimizer, step: int) -> float:
        """Every group's LR for the update after ``step`` steps; returns the first group's (logged)."""
        for group in optimizer.param_groups:
            group["lr"] = self.lr(step, group.get("initial_lr", self.cfg.lr))
        return optimizer.param_groups[0]["lr"]

    def describe(self) -> dict[str, Any]:
        """For metrics.json and the checkpoint: what decided every step's LR."""
        c = self.cfg
        return {
            "lr_schedule": self.kind,
            "warmup_steps": c.warmup_steps,
            "min_lr": c.min_lr,
        }
