"""Any map-style dataset, sharded by index: a user's ``--dataset MODULE:CALLABLE``.

Nothing here holds the dataset in memory: a worker reads, per step, only the samples of its slice
of the global batch (``dataset[i]``), in this process or in ``--data-workers`` background
processes (torch's DataLoader). The order is the one :class:`~.images.ShardedBatches` uses for
in-memory tensors -- every epoch one permutation of all indices drawn from (seed, epoch), global
batch ``i`` is ``perm[i*B*W : (i+1)*B*W]`` and worker ``r`` takes its ``r``-th slice of ``B`` --
so the union of what W workers see in a step is what one process with batch ``B*W`` sees, the
order does not depend on where a run was resumed, and a registered dataset and the same data
given as a user's dataset yield the same batches.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader, default_collate

from ..errors import DataError


def epoch_order(n: int, seed: int, epoch: int) -> torch.Tensor:
    """The permutation of ``n`` indices for ``epoch``: the same on every worker (int64, 8 bytes a sample)."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
    return torch.randperm(n, generator=g)


class _StepIndices:
    """The batch sampler handed to a DataLoader: this worker's indices for the steps of one epoch
    from one step on. It runs in the training process; the loader's background workers only
    read the samples, so one persistent loader serves every epoch (:meth:`set`)."""

    def __init__(self, owner: DatasetBatches) -> None:
        self.owner, self.epoch, self.start = owner, 0, 0

    def set(self, epoch: int, start: int) -> None:
        self.epoch, self.start = epoch, start

    def __iter__(self) -> Iterator[list[int]]:
        return self.owner.indices(self.epoch, self.start)

    def __len__(self) -> int:
        return self.owner.steps_per_epoch - self.start


class DatasetBatches:
    """This worker's share of each global batch of a map-style dataset of (input, target) pairs.

    ``steps_per_epoch`` full global batches per epoch (the ragged tail is dropped: every worker
    takes the same number of steps). ``workers`` > 0 loads batches in that many background
    processes, in order, ``prefetch`` batches ahead each; their random number generators are
    seeded from (seed, epoch), so a random augmentation repeats for the same seed and worker count.
    """

    def __init__(
        self, dataset: Any, batch_size: int, rank: int, num_shards: int, seed: int, workers: int = 0, prefetch: int = 2
    ) -> None:
        self.dataset, self.batch_size = dataset, batch_size
        self.rank, self.num_shards, self.seed = rank, num_shards, seed
        self.global_batch = batch_size * num_shards
        self.steps_per_epoch = len(dataset) // self.global_batch
        self.workers, self.prefetch = workers, prefetch
        self._sampler = _StepIndices(self)
        self._loader: DataLoader | None = None

    def indices(self, epoch: int, start_step: int = 0) -> Iterator[list[int]]:
        order = epoch_order(len(self.dataset), self.seed, epoch)
        for step in range(start_step, self.steps_per_epoch):
            lo = step * self.global_batch + self.rank * self.batch_size
            yield order[lo : lo + self.batch_size].tolist()

    def sample_batch(self) -> Any:
        """This worker's first batch of epoch 0, read here (the trainer's check of the loss before step 1)."""
        return default_collate([self.dataset[i] for i in next(self.indices(0))])

    def batches(self, epoch: int, start_step: int = 0) -> Iterator[Any]:
        """(inputs, targets) of this worker for the steps ``start_step ..`` of ``epoch``."""
        if not self.workers:
            for idx in self.indices(epoch, start_step):
                yield default_collate([self.dataset[i] for i in idx])
            return
        if self._loader is None:
            # persistent: the processes start once (forked, as torch's default on Linux), not every epoch
            self._loader = DataLoader(
                self.dataset,
                batch_sampler=self._sampler,
                num_workers=self.workers,
                prefetch_factor=self.prefetch,
                persistent_workers=True,
                generator=torch.Generator(),
            )
        self._sampler.set(epoch, start_step)
        # the loader's workers draw their seeds from this generator: fixed per (seed, epoch), and it
        # leaves the training process's own RNG (dropout masks) untouched
        self._loader.generator.manual_seed(self.seed * 1_000_003 + epoch + 7)
        yield from self._loader


class EvalPart:
    """Worker ``rank``'s contiguous share of an evaluation dataset; together the shares cover every
    sample once."""

    def __init__(self, dataset: Any, rank: int, num_shards: int) -> None:
        n = len(dataset)
        self.dataset, self.lo, self.hi = dataset, n * rank // num_shards, n * (rank + 1) // num_shards

    def __len__(self) -> int:
        return self.hi - self.lo

    def batches(self, batch_size: int) -> Iterator[Any]:
        for lo in range(self.lo, self.hi, batch_size):
            yield default_collate([self.dataset[i] for i in range(lo, min(lo + batch_size, self.hi))])


def check_map_style(flag: str, what: str, dataset: Any) -> None:
    """A dataset the sampler can index: ``len()`` and ``[i]`` of (input, target) pairs."""
    from torch.utils.data import IterableDataset

    if isinstance(dataset, IterableDataset) or not (hasattr(dataset, "__getitem__") and hasattr(dataset, "__len__")):
        raise DataError(
            f"{flag}: the {what} set is a {type(dataset).__name__}; give a map-style dataset "
            "(len() and [i], e.g. a torch.utils.data.Dataset subclass) so that it can be sharded by index"
        )
    if len(dataset) == 0:
        raise DataError(f"{flag}: the {what} set is empty")
    try:
        sample = dataset[0]
    except Exception as e:
        raise DataError(f"{flag}: reading sample 0 of the {what} set raised {type(e).__name__}: {e}") from None
    if not (isinstance(sample, (tuple, list)) and len(sample) == 2):
        raise DataError(
            f"{flag}: sample 0 of the {what} set is a {type(sample).__name__}; each sample must be an "
            "(input, target) pair (use --task for other shapes of data, docs/own_model.md)"
        )
