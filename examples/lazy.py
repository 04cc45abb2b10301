"""A dataset made on read, at any size: nothing is held in memory but its length.

    python -m launch -np 2 -- --model models.lenet:LeNet5 --dataset examples.lazy:build \\
        --dataset-arg n=1000000 --steps 200

Sample ``i`` is drawn from a generator seeded with ``i`` (the same on every rank and every read): a
28x28 image whose mean encodes its class, which LeNet-5 learns in a few hundred steps. The shape of
a real decoding dataset (files opened per sample), without the files.
"""

from __future__ import annotations

import torch
from torch.utils.data import Dataset


class Lazy(Dataset):
    def __init__(self, n: int, offset: int = 0, classes: int = 10) -> None:
        self.n, self.offset, self.classes = n, offset, classes

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        if not 0 <= i < self.n:
            raise IndexError(i)
        g = torch.Generator().manual_seed(self.offset + i)
        y = int(torch.randint(0, self.classes, (1,), generator=g))
        return torch.randn(1, 28, 28, generator=g) + 0.3 * (y - self.classes / 2), y


def build(n: int = 1_000_000, evaluation: int = 10_000) -> tuple[Lazy, Lazy]:
    """``--dataset examples.lazy:build --dataset-arg n=N``: (train, eval)."""
    return Lazy(n), Lazy(evaluation, offset=1 << 40)
