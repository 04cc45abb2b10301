"""Datasets held in memory as tensors, and the per-rank shard of every global batch.

Fashion-MNIST (70 k 28x28 images) is 55 MB as uint8, so it is read once, normalised once, and
batches are cut by indexing: no DataLoader workers competing with the training threads for cores.

Sharding: every epoch draws one permutation of the whole training set from (seed, epoch); global
batch ``i`` is ``perm[i*B*W : (i+1)*B*W]`` and rank ``r`` takes its ``r``-th slice of ``B``. So
the union of what W ranks see in a step is exactly what one process with batch ``B*W`` sees, and
the order does not depend on the world size or on where a run was resumed.
"""

from __future__ import annotations

import gzip
import os
import struct
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import torch

from ..errors import DataError
from .indexed import epoch_order

# IDX magic: two zero bytes, a type code (0x08 = unsigned byte), the number of dimensions.
_IDX_UBYTE = 0x08

FASHION_MNIST_FILES = {
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}
# Per-pixel mean and std of the Fashion-MNIST training set (scaled to [0, 1]).
FASHION_MNIST_MEAN, FASHION_MNIST_STD = 0.2860, 0.3530


def read_idx(path: str) -> np.ndarray:
    """Read an IDX file (raw or gzip-compressed) of unsigned bytes into an array of its shape."""
    try:
        with open(path, "rb") as fh:
            raw = fh.read()
    except FileNotFoundError:
        raise DataError(f"{path}: file not found") from None
    except OSError as e:
        raise DataError(f"{path}: cannot read ({e.strerror})") from None
    if raw[:2] == b"\x1f\x8b":
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError) as e:
            raise DataError(f"{path}: corrupt gzip data ({e}); re-download or reinstall the dataset") from None
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0:
        raise DataError(f"{path}: not an IDX file (bad magic number); expected Fashion-MNIST IDX data")
    if raw[2] != _IDX_UBYTE:
        raise DataError(f"{path}: IDX type code 0x{raw[2]:02x} unsupported; expected 0x08 (unsigned byte)")
    ndim = raw[3]
    header = 4 + 4 * ndim
    if ndim == 0 or len(raw) < header:
        raise DataError(f"{path}: truncated IDX header")
    shape = struct.unpack(f">{ndim}I", raw[4:header])
    expected = int(np.prod(shape))
    if len(raw) - header != expected:
        raise DataError(
            f"{path}: IDX header promises {expected} bytes for shape {shape}, file has {len(raw) - header}; "
            "the file is truncated or corrupt"
        )
    return np.frombuffer(raw, dtype=np.uint8, offset=header).reshape(shape)


def _find(data_dir: str, stem: str) -> str:
    for name in (stem + ".gz", stem):
        path = os.path.join(data_dir, name)
        if os.path.exists(path):
            return path
    raise DataError(
        f"{os.path.join(data_dir, stem)}[.gz]: file not found; point --data-dir at the Fashion-MNIST IDX files "
        "(Debian: apt-get install dataset-fashion-mnist)"
    )


def load_fashion_mnist(data_dir: str, split: str) -> tuple[np.ndarray, np.ndarray]:
    """Images (N, 28, 28) uint8 and labels (N,) uint8 of one split, validated."""
    if not os.path.isdir(data_dir):
        raise DataError(
            f"--data-dir {data_dir}: directory not found; install the dataset (apt-get install dataset-fashion-mnist) "
            "or pass --data-dir"
        )
    img_stem, lbl_stem = FASHION_MNIST_FILES[split]
    img_path, lbl_path = _find(data_dir, img_stem), _find(data_dir, lbl_stem)
    images, labels = read_idx(img_path), read_idx(lbl_path)
    if images.ndim != 3 or images.shape[1:] != (28, 28):
        raise DataError(f"{img_path}: expected images of shape (N, 28, 28), got {images.shape}")
    if labels.ndim != 1:
        raise DataError(f"{lbl_path}: expected a 1-D label vector, got shape {labels.shape}")
    if len(images) != len(labels):
        raise DataError(f"{img_path} has {len(images)} images but {lbl_path} has {len(labels)} labels")
    if len(labels) and int(labels.max()) > 9:
        raise DataError(f"{lbl_path}: label {int(labels.max())} out of range 0..9")
    return images, labels


@dataclass
class TensorDataset:
    """Inputs and targets as two tensors with the same first dimension."""

    inputs: torch.Tensor
    targets: torch.Tensor

    def __len__(self) -> int:
        return len(self.targets)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.inputs[i], self.targets[i]

    def batches(self, batch_size: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """Consecutive batches of ``batch_size`` (the last one shorter): an evaluation shard's."""
        for lo in range(0, len(self), batch_size):
            yield self.inputs[lo : lo + batch_size], self.targets[lo : lo + batch_size]


def _normalise(images: np.ndarray) -> torch.Tensor:
    x = torch.from_numpy(images.astype(np.float32) / 255.0)
    return ((x - FASHION_MNIST_MEAN) / FASHION_MNIST_STD).unsqueeze(1)  # (N, 1, 28, 28)


def fashion_mnist(data_dir: str) -> tuple[TensorDataset, TensorDataset]:
    train = load_fashion_mnist(data_dir, "train")
    test = load_fashion_mnist(data_dir, "test")
    return (
        TensorDataset(_normalise(train[0]), torch.from_numpy(train[1].astype(np.int64))),
        TensorDataset(_normalise(test[0]), torch.from_numpy(test[1].astype(np.int64))),
    )


def synthetic(
    input_shape: tuple[int, ...], num_classes: int, samples: int, seed: int
) -> tuple[TensorDataset, TensorDataset]:
    """Fixed random inputs and labels of the model's shape: no I/O, for benchmarks."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn((samples, *input_shape), generator=g)
    y = torch.randint(0, num_classes, (samples,), generator=g)
    n_eval = max(1, samples // 10)
    return TensorDataset(x, y), TensorDataset(x[:n_eval], y[:n_eval])


class ShardedBatches:
    """This rank's share of each global batch, in an order fixed by (seed, epoch).

    ``steps_per_epoch`` full global batches are taken per epoch (the ragged tail is dropped, as
    every rank must take the same number of steps).
    """

    def __init__(self, dataset: TensorDataset, batch_size: int, rank: int, num_shards: int, seed: int) -> None:
        self.dataset, self.batch_size = dataset, batch_size
        self.rank, self.num_shards, self.seed = rank, num_shards, seed
        self.global_batch = batch_size * num_shards
        self.steps_per_epoch = len(dataset) // self.global_batch

    def epoch_order(self, epoch: int) -> torch.Tensor:
        return epoch_order(len(self.dataset), self.seed, epoch)  # the one order every dataset is read in

    def sample_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        """This rank's first batch of epoch 0 (the trainer's check of a model's output before step 1)."""
        return next(self.batches(0))

    def batches(self, epoch: int, start_step: int = 0) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """Yield (inputs, targets) for steps ``start_step ..`` of ``epoch``."""
        order = self.epoch_order(epoch)
        for step in range(start_step, self.steps_per_epoch):
            lo = step * self.global_batch + self.rank * self.batch_size
            idx = order[lo : lo + self.batch_size]
            # index_select: half the cost of advanced indexing for the same gather
            yield self.dataset.inputs.index_select(0, idx), self.dataset.targets.index_select(0, idx)


def eval_shard(dataset: TensorDataset, rank: int, num_shards: int) -> TensorDataset:
    """A disjoint contiguous slice per rank; together they cover every evaluation sample once."""
    n = len(dataset)
    lo, hi = n * rank // num_shards, n * (rank + 1) // num_shards
    return TensorDataset(dataset.inputs[lo:hi], dataset.targets[lo:hi])
