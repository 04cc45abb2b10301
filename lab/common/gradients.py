"""A model's gradient as the cost model takes it: the shapes of its trainable parameters (float32),
read from the model registry (models/). Shared by the experiments that predict a method's cost
(lab/common/costmodel.py ``predict_method``): PowerSGD's bytes depend on which tensors are matrices."""

from __future__ import annotations

import functools
import math


@functools.cache
def shapes(model: str) -> tuple[tuple[int, ...], ...]:
    """The shapes of ``model``'s trainable parameters, in the model's order; KeyError for an unknown model."""
    from models import MODELS

    return tuple(tuple(p.shape) for p in MODELS[model].build().parameters() if p.requires_grad)


def nbytes(model: str) -> int:
    """Bytes of ``model``'s float32 gradient (the scaling grid's ``gradient_bytes``)."""
    return 4 * sum(math.prod(s) for s in shapes(model))


def owning_modules(module) -> int:
    """Modules of ``module`` that hold trainable parameters of their own (a weight tied to an earlier
    module's counts once, at its first holder): what sharded stage 3 gathers one at a time (costmodel's
    ``modules``)."""
    seen: set[int] = set()
    count = 0
    for m in module.modules():
        own = [p for p in m.parameters(recurse=False) if p.requires_grad and id(p) not in seen]
        seen.update(id(p) for p in own)
        count += bool(own)
    return count


@functools.cache
def modules(model: str) -> int:
    """:func:`owning_modules` of registered ``model``; KeyError for an unknown model."""
    from models import MODELS

    return owning_modules(MODELS[model].build())
