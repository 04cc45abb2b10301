"""Model definitions: plain ``nn.Module``s that know nothing about distribution.

Each model registers a :class:`ModelSpec` in :data:`MODELS` with a builder, the input it expects
(so that the ``synthetic`` dataset can make fixed-shape batches for it), its task (image
classification or language modelling) and the hyperparameters it is meant to train with. This
package imports torch only: never horovod, mpi4py, torch.distributed, the trainer or the launcher
(tests/unit/test_layout.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch.nn as nn

TASKS = ("classify", "lm")


@dataclass(frozen=True)
class ModelSpec:
    """What the trainer needs to know about a model without building it."""

    name: str
    build: Callable[..., nn.Module]  # lm models take vocab_size=, the size of the data's vocabulary
    input_shape: tuple[int, ...]  # one sample, e.g. (1, 28, 28); lm: (unrolled steps,) of token ids
    num_classes: int  # lm: the vocabulary of the published configuration
    description: str
    task: str = "classify"  # "lm": forward(tokens, hidden) -> (logits, hidden), see models/lstm.py
    # Config fields (by name, e.g. "lr") this model trains with unless the TOML file or the command
    # line sets them: the published recipe, not the image-classification defaults.
    defaults: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.task not in TASKS:
            raise ValueError(f"model {self.name!r}: task must be one of {TASKS}")

    @property
    def bptt(self) -> int:
        """Unrolled steps per training sequence (truncated backpropagation through time)."""
        return self.input_shape[0] if self.task == "lm" else 0


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


from . import lenet, lstm, resnet  # noqa: E402,F401  (register their models)
