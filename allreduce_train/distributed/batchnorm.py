"""BatchNorm over workers: the running statistics every rank evaluates and saves, and ``--sync-batchnorm``.

A BatchNorm layer in training mode normalises with its own batch's mean and variance and keeps running
averages of them (buffers, not parameters: no gradient averages them). Each worker sees its own batches,
so its running statistics drift from the others' from the first step on, while the parameters stay
identical. Two answers:

* :func:`average_buffers` (the default; ``--no-average-buffers`` keeps each worker's own): before every
  evaluation, every checkpoint and at the end of a run, every floating-point buffer becomes its average
  over the workers (timm's ``distribute_bn(reduce=True)``), so every rank evaluates, saves and returns
  the same model. A running average is linear in the batches' statistics, so the average of the
  workers' running means is the running mean of the global batches' means, whenever it is taken;
  running variances average the workers' variances (the spread between their means is not in it).
  Training is untouched: in training mode BatchNorm normalises with the batch's statistics, never the
  running ones. Integer buffers (``num_batches_tracked``) count steps, the same on every worker.
* :func:`sync_batchnorm` (``--sync-batchnorm``): the statistics of every training forward pass are
  the global batch's, summed over the workers inside the pass (and the gradients through them in the
  backward pass), so N workers with batch B train as one process with batch N x B. Horovod's
  ``SyncBatchNorm`` and torch's run on CUDA only (their kernels have no CPU implementation); on CPU the
  Horovod engine gets :class:`GlobalBatchNorm`, the same statistics from the engine's grouped sum.

Which engines offer ``--sync-batchnorm`` is a row of the table in :mod:`allreduce_train.config`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.nn.modules.batchnorm import _BatchNorm

from ..errors import ConfigError
from .base import GradientExchange

SumTensors = Callable[[list[torch.Tensor], str], list[torch.Tensor]]


@torch.no_grad()
def average_buffers(model: torch.nn.Module, ex: GradientExchange) -> None:
    """Replace every floating-point buffer of ``model`` by its average over the workers (a collective
    over the workers: all call it at the same step). A buffer every worker holds alike (a fixed table,
    a mask, statistics already synchronised) comes back bit for bit: the sum is of each worker's
    difference from the main worker's value, zero where they agree."""
    if ex.num_workers == 1 or not ex.one_model:
        return
    buffers = [b for b in model.buffers() if b.is_floating_point()]
    # float64 travels as itself; 16-bit buffers as float32, which holds them exactly
    for wide in (False, True):
        group = [b for b in buffers if (b.dtype == torch.float64) == wide]
        if not group:
            continue
        mine = [b.to(torch.float64 if wide else torch.float32) for b in group]
        # communication: the main worker's buffers (every other worker adds zeros) ...
        first = ex.sum_tensors([b if ex.worker_index == 0 else torch.zeros_like(b) for b in mine], "buffers.main")
        # communication: ... and every worker's difference from them, summed
        diffs = ex.sum_tensors([b - f for b, f in zip(mine, first, strict=True)], "buffers.diff")
        for b, f, d in zip(group, first, diffs, strict=True):
            b.copy_(f + d / ex.num_workers)


class _Summed(torch.autograd.Function):
    """A sum over the workers that autograd sees through: the gradient of a sum, on each worker, is the
    sum of every worker's gradient of it (Horovod's ``allreduce`` as an autograd function, the same)."""

    @staticmethod
    def forward(ctx: Any, t: torch.Tensor, sum_tensors: SumTensors, name: str) -> torch.Tensor:
        ctx.sum_tensors, ctx.name = sum_tensors, name
        return sum_tensors([t], name)[0]  # communication: a batch's per-channel sums

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        return ctx.sum_tensors([grad.contiguous()], ctx.name + ".grad")[0], None, None  # communication


class GlobalBatchNorm(_BatchNorm):
    """BatchNorm whose training statistics are the global batch's: per-channel sums, then sums of squared
    deviations from the global mean, each summed over the workers through ``sum_tensors`` (the engine's
    grouped sum), and the gradients through them summed alike. Evaluation uses the running statistics,
    with no communication (the workers' evaluation shares differ in size). Computed in float32."""

    def __init__(self, bn: _BatchNorm, sum_tensors: SumTensors, name: str) -> None:
        super().__init__(bn.num_features, bn.eps, bn.momentum, bn.affine, bn.track_running_stats)
        self.sum_tensors, self.label = sum_tensors, f"sync_batchnorm.{name or 'model'}"

    def _check_input_dim(self, input: torch.Tensor) -> None:
        if input.dim() < 2:
            raise ValueError(f"expected at least 2D input (got {input.dim()}D input)")

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        if not self.training:
            return super().forward(input)
        self._check_input_dim(input)
        x = input.float()
        dims = [0, *range(2, x.dim())]  # every axis but the channels'
        shape = [1, -1] + [1] * (x.dim() - 2)  # (1, C, 1, ...)
        total = _Summed.apply(
            torch.cat([x.sum(dims), x.new_tensor([x.numel() // x.size(1)])]), self.sum_tensors, self.label
        )
        n = total[-1].detach()  # values per channel in the global batch
        if n.item() <= 1:
            raise ValueError(
                f"expected more than 1 value per channel when training, got input size {list(input.shape)}"
            )
        mean = total[:-1] / n
        centred = x - mean.view(shape)
        var = _Summed.apply((centred * centred).sum(dims), self.sum_tensors, self.label + ".var") / n
        if self.track_running_stats:
            self._track(mean, var * n / (n - 1))  # the running variance is the unbiased one, as torch's
        y = centred * torch.rsqrt(var + self.eps).view(shape)
        if self.affine:
            y = y * self.weight.view(shape) + self.bias.view(shape)
        return y.to(input.dtype)

    @torch.no_grad()
    def _track(self, mean: torch.Tensor, var: torch.Tensor) -> None:
        """The running statistics' update, as torch's BatchNorm makes it (a cumulative average without momentum)."""
        count, running_mean, running_var = self.num_batches_tracked, self.running_mean, self.running_var
        assert count is not None and running_mean is not None and running_var is not None  # track_running_stats
        count.add_(1)
        m = 1.0 / float(count) if self.momentum is None else self.momentum
        running_mean.mul_(1 - m).add_(mean.to(running_mean.dtype), alpha=m)
        running_var.mul_(1 - m).add_(var.to(running_var.dtype), alpha=m)


def sync_batchnorm(
    model: torch.nn.Module, engine: str, ex: GradientExchange, device: torch.device
) -> tuple[torch.nn.Module, int]:
    """``--sync-batchnorm``: ``model`` with its BatchNorm layers replaced (in place, each keeping its
    parameters and buffers) by ones whose training statistics are the global batch's, and how many were
    replaced (a new module only where the model is one BatchNorm layer). Called before the optimizer takes
    the parameters and before the exchange's prepare() broadcasts them."""
    if device.type != "cuda" and engine == "torch":
        raise ConfigError(
            "--sync-batchnorm with --allreduce-engine torch needs CUDA (torch.nn.SyncBatchNorm has no CPU "
            "kernels); on CPU use --allreduce-engine horovod, or drop the flag (the running statistics are "
            "averaged over the workers before every evaluation and checkpoint)"
        )
    if engine == "torch":

        def make(bn: _BatchNorm, name: str) -> _BatchNorm:
            return torch.nn.SyncBatchNorm(bn.num_features, bn.eps, bn.momentum, bn.affine, bn.track_running_stats)

    else:

        def make(bn: _BatchNorm, name: str) -> _BatchNorm:
            # Horovod's on CUDA; not for a layer without running statistics, which Horovod's would also
            # synchronise in evaluation, where the workers' shares (and so their passes) differ in number
            if device.type == "cuda" and bn.track_running_stats:
                import horovod.torch as hvd

                return hvd.SyncBatchNorm(bn.num_features, bn.eps, bn.momentum, bn.affine, bn.track_running_stats)
            return GlobalBatchNorm(bn, ex.sum_tensors, name)

    if isinstance(model, _BatchNorm):
        return _take_over(model, make(model, "")), 1
    return model, _replace(model, make)


def _replace(module: torch.nn.Module, make: Callable[[_BatchNorm, str], _BatchNorm], prefix: str = "") -> int:
    """Swap every BatchNorm layer under ``module`` for ``make(layer, name)``; returns how many."""
    swapped = 0
    for name, child in module.named_children():
        full = f"{prefix}.{name}" if prefix else name
        if isinstance(child, _BatchNorm):
            module.add_module(name, _take_over(child, make(child, full)))
            swapped += 1
        else:
            swapped += _replace(child, make, full)
    return swapped


def _take_over(old: _BatchNorm, new: _BatchNorm) -> _BatchNorm:
    """``new`` holding ``old``'s parameters and buffers, the same tensors (weights tied elsewhere stay
    tied, and they stay on their device), in ``old``'s mode."""
    new.weight, new.bias = old.weight, old.bias
    new.running_mean, new.running_var = old.running_mean, old.running_var
    new.num_batches_tracked = old.num_batches_tracked
    return new.train(old.training)
