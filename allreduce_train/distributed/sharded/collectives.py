"""The interface between the sharded layer and an engine: the two halves of a ring allreduce, apart.

ZeRO's dataflow (:mod:`.`) needs only these collectives on flat buffers: a reduce-scatter that leaves each
rank the sum of its own slice of a bucket, and an allgather that puts every rank's slice back together.
An engine offers them as a :class:`ShardCollectives` (the mpi4py ring: :mod:`.mpi`; Horovod: its
``reducescatter``/``allgather``); everything else a run needs from the engine (metrics, votes,
broadcast, abort) stays on its :class:`~allreduce_train.distributed.base.GradientExchange`.
"""

from __future__ import annotations

from typing import Any, Protocol

import torch


class ShardCollectives(Protocol):
    """Non-blocking reduce-scatter and allgather of whole buckets, with a deadline on every wait."""

    rank: int
    size: int

    def bounds(self, numel: int) -> list[tuple[int, int]]:
        """[lo, hi) of a bucket of ``numel`` elements that each rank (by rank) owns after a reduce-scatter."""
        ...

    def start_reduce_scatter(self, key: int, flat: torch.Tensor) -> Any:
        """Begin the sum over ranks of the whole bucket ``flat`` (the wire dtype); once done, this rank's
        ``flat[lo:hi]`` holds the SUM over ranks (the layer divides); the rest of ``flat`` is undefined.
        ``key``: the bucket index (an MPI tag, < mpi.MAX_BUCKETS); ``flat``: contiguous 1-D, CPU (or CUDA
        for NCCL). Returns a handle for :meth:`wait`."""
        ...

    def start_allgather(self, key: int, flat: torch.Tensor) -> Any:
        """Begin putting every rank's ``flat[lo:hi]`` into every rank's ``flat``, whole, in place."""
        ...

    def wait(self, handles: list[Any], what: str) -> None:
        """Block until ``handles`` are done, progressing non-blocking engines; no progress for
        --stall-timeout raises :class:`~allreduce_train.errors.Stalled` (as distributed/mpi.poll does)."""
        ...
