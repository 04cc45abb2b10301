"""PowerSGD (``--compression powersgd --powersgd-rank r``): low-rank gradients, Vogels et al. 2019.

The arithmetic of torch's DDP communication hook
(``torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook``, every parameter in one bucket,
tensors of one shape not batched), so that the hook is the reference a test checks against:

* each gradient (a ``(shape[0], -1)`` matrix) gets this worker's error from the last step added
  (error feedback);
* matrices where ``(n + m) r`` is under half of ``n m`` are compressed: ``P = M Q`` with last step's
  ``Q`` (warm start; random and seeded on the first step), ``P`` summed over the workers and
  orthogonalised, ``Q = M^T P`` summed over the workers and divided by N, and ``P Q^T`` replaces the
  gradient; the other tensors (biases, small matrices) are averaged as they are, in the same sum as the Ps;
* the error is what this worker meant to send less what it got back.

Two sums per step go through the engine (``sum_tensors``): the uncompressed tensors with the Ps,
then the Qs. A model with no matrix worth compressing (none where ``(n + m) r`` is under half of ``n m``)
sends every tensor in the first sum and has no second: the same on every worker, since all hold
the same shapes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from .buffers import flatten, unpack
from .wirecost import compressible
from .wirecost import powersgd_bytes_per_step as bytes_per_step

__all__ = ["PowerSGD", "bytes_per_step", "compressible", "orthogonalize"]

SumTensors = Callable[[list[torch.Tensor], str], list[torch.Tensor]]  # (tensors, name): sums over the workers


def orthogonalize(matrix: torch.Tensor) -> None:
    """Orthonormal columns in place: Gram-Schmidt for rank <= 2, QR above (as the hook does)."""
    if matrix.shape[1] <= 2:
        for i in range(matrix.shape[1]):
            col = matrix[:, i : i + 1]
            col /= torch.norm(col, dim=0, keepdim=True)
            if i + 1 < matrix.shape[1]:
                rest = matrix[:, i + 1 :]
                rest -= torch.sum(col * rest, dim=0, keepdim=True) * col
    else:
        matrix.copy_(torch.linalg.qr(matrix).Q)


def _bmm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``a @ b`` as the hook computes it (a batch of one: the same rounding as its bmm)."""
    return torch.bmm(a.unsqueeze(0), b.unsqueeze(0))[0]


class PowerSGD:
    """One worker's PowerSGD: its error feedback and the Qs (identical on every worker)."""

    def __init__(self, params: list[torch.Tensor], rank: int, seed: int = 0) -> None:
        self.params, self.rank = params, rank
        self.packed = [i for i, p in enumerate(params) if compressible(p.shape, rank)]
        self.plain = [i for i, p in enumerate(params) if i not in self.packed]
        self.rng = np.random.RandomState(seed)  # the hook's generator of the first Qs
        self.error: list[torch.Tensor] | None = None
        self.q: list[torch.Tensor] | None = None

    def _matrix(self, t: torch.Tensor) -> torch.Tensor:
        return t.view(t.shape[0], -1)

    @torch.no_grad()
    def average(self, sum_tensors: SumTensors, workers: int) -> None:
        """Replace every parameter's ``.grad`` with its PowerSGD average over the workers."""
        grads = []
        for p in self.params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            grads.append(p.grad)
        if self.error is not None:
            for g, e in zip(grads, self.error, strict=True):
                g.add_(e)
        sent = [g.clone() for g in grads]
        mats = [self._matrix(grads[i]) for i in self.packed]
        if self.q is None:
            # the hook's first Qs: one seed from its generator, then one normal draw per matrix in
            # DDP's bucket order (the parameters reversed)
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(self.rng.randint(1_000_000_000))
                drawn = [
                    torch.randn(m.shape[1], min(*m.shape, self.rank), dtype=m.dtype).to(m.device)
                    for m in reversed(mats)
                ]
            self.q = drawn[::-1]
        for q in self.q:
            orthogonalize(q)
        ps = [_bmm(m, q) for m, q in zip(mats, self.q, strict=True)]
        plain = [flatten([grads[i] for i in self.plain])] if self.plain else []
        # communication: the uncompressed tensors and the Ps, summed over the workers
        summed = sum_tensors([*plain, *ps], "powersgd.p")
        plain, ps = [t.div_(workers) for t in summed[: len(plain)]], summed[len(plain) :]
        if self.plain:
            unpack(plain[0], [grads[i] for i in self.plain])
        for p in ps:
            orthogonalize(p)
        if mats:  # a model without a matrix worth compressing sent everything in the first sum: no Qs
            # communication: the Qs, summed over the workers
            qs = sum_tensors([_bmm(m.t(), p) for m, p in zip(mats, ps, strict=True)], "powersgd.q")
            self.q = [q.div_(workers) for q in qs]
        for m, p, q in zip(mats, ps, self.q, strict=True):
            m.copy_(_bmm(p, q.t()))
        self.error = [s - g for s, g in zip(sent, grads, strict=True)]

    def state_dict(self) -> dict[str, Any]:
        """This worker's error feedback and the Qs (for the checkpoint; after the first step the
        generator is not used again)."""
        return {"error": self.error, "q": self.q}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.error, self.q = state["error"], state["q"]
