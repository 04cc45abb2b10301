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
