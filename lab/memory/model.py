"""A model whose size is a flag: an MLP on Fashion-MNIST-shaped inputs (the synthetic dataset's 1x28x28,
10 classes), ``depth`` hidden layers of ``width`` units: about width^2 x depth parameters. The trainer
builds it by reference (``--model lab.memory.model:build --model-arg width=2048``)."""

from __future__ import annotations

import torch
import torch.nn as nn
from torch.utils.data import TensorDataset


def build(width: int = 256, depth: int = 2, classes: int = 10) -> nn.Module:
    layers: list[nn.Module] = [nn.Flatten(), nn.Linear(28 * 28, width), nn.ReLU()]
    for _ in range(depth - 1):
        layers += [nn.Linear(width, width), nn.ReLU()]
    return nn.Sequential(*layers, nn.Linear(width, classes))


def parameters(width: int, depth: int, classes: int = 10) -> int:
    """:func:`build`'s parameter count, without building it."""
    return (28 * 28 + 1) * width + (depth - 1) * (width + 1) * width + (width + 1) * classes


def data(samples: int = 512, seed: int = 0) -> tuple[TensorDataset, TensorDataset]:
    """(train, eval): random 1x28x28 inputs with random labels, fixed by ``seed`` (``--dataset
    lab.memory.model:data``): memory is the point here, not what the model learns."""
    g = torch.Generator().manual_seed(seed)

    def one(n: int) -> TensorDataset:
        return TensorDataset(torch.randn(n, 1, 28, 28, generator=g), torch.randint(0, 10, (n,), generator=g))

    return one(samples), one(max(1, samples // 8))
