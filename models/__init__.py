"""Model definitions: plain ``nn.Module``s that know nothing about distribution.

Each model registers a :class:`ModelSpec` in :data:`MODELS` with a builder, the input it expects
(so that the ``synthetic`` dataset can make fixed-shape batches for it) and its task. This package
never imports horovod, mpi4py or torch.distributed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch.nn as nn


@dataclass(frozen=True)
class ModelSpec:
    """What the trainer needs to know about a model without building it."""

    name: str
    build: Callable[[], nn.Module]
    input_shape: tuple[int, ...]  # one sample, e.g. (1, 28, 28)
    num_classes: int
    description: str


MODELS: dict[str, ModelSpec] = {}


def register(spec: ModelSpec) -> ModelSpec:
    if spec.name in MODELS:
        raise ValueError(f"model {spec.name!r} registered twice")
    MODELS[spec.name] = spec
    return spec


def get_model(name: str) -> nn.Module:
    """Build a registered model by name."""
    try:
        spec = MODELS[name]
    except KeyError:
        raise KeyError(f"unknown model {name!r}; choose one of: {', '.join(sorted(MODELS))}") from None
    return spec.build()


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


from . import lenet  # noqa: E402,F401  (registers its models)
