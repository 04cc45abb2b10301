"""The Horovod engine's collectives for ``--strategy sharded`` (the layer's ``ShardCollectives``).

A bucket's flat buffer goes through ``hvd.reducescatter_async(op=Sum)`` and its summed shards come back
through ``hvd.allgather_async``. What Horovod 0.28.1 does with them, read from its source
(``common/ops/collective_operations.cc``, ``ReducescatterOp::ComputeOutputShapeForRank``) and checked at
2 and 3 ranks on its MPI and Gloo controllers (tests/mpi/test_horovod_shard.py):

* a 1-D tensor of n elements is cut in rank order, the first ``n % size`` ranks getting ``n // size + 1``
  elements and the rest ``n // size`` (empty shards where n < size): :func:`horovod_bounds`;
* reduce-scatter runs MPI_Reduce_scatter (MPI controller) or Gloo's ReduceScatterHalvingDoubling (Gloo),
  allgather MPI_Allgatherv or Gloo's allgatherv; both accept float16 on CPU (Horovod's own MPI float16
  sum), neither bfloat16 (``Tensor type torch.BFloat16Tensor is not supported``: the configuration refuses
  ``--compression bf16`` with Horovod);
* the background thread fuses reduce-scatters (and allgathers) that are ready in the same cycle into one
  collective up to HOROVOD_FUSION_THRESHOLD, as it fuses allreduces: each bucket is enqueued on its own
  as backward produces it and Horovod groups what is ready together, without an order among the ranks
  (operations are matched by name, not by the order they start in).

Horovod writes each result into a tensor of its own (the input is never modified); :meth:`wait` copies
it into the bucket: this rank's shard after a reduce-scatter (1/N of the bucket), the whole bucket
after an allgather. Passing the bucket as Horovod's output instead would make MPI's send and receive
buffers overlap, which MPI forbids outside MPI_IN_PLACE.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from .mpi import poll


def horovod_bounds(numel: int, size: int) -> list[tuple[int, int]]:
    """[lo, hi) of each rank's shard of a 1-D tensor of ``numel`` elements after Horovod's reduce-scatter:
    the first ``numel % size`` ranks hold one element more (ComputeOutputShapeForRank)."""
    small, extra = divmod(numel, size)
    out, lo = [], 0
    for r in range(size):
        hi = lo + small + (r < extra)
        out.append((lo, hi))
        lo = hi
    return out


@dataclass
class _Pending:
    """One collective in flight: Horovod's handle (None where nothing travels: one rank) and where its
    result goes in the bucket (``lo``/``hi``: this rank's shard; a gather fills the whole bucket)."""

    handle: int | None
    flat: torch.Tensor
    lo: int
    hi: int
    gather: bool


class HorovodShardCollectives:
    """Reduce-scatter and allgather of whole buckets through Horovod (``ShardCollectives`` of
    ``distributed/sharded/collectives.py``), for the sharded layer over a started Horovod engine.

    ``hvd``: ``horovod.torch``, initialised; ``stall_timeout``: seconds without progress in :meth:`wait`
    before it raises :class:`~allreduce_train.errors.Stalled` (0: never); ``exchange_alone``: a job of
    one rank still sends through Horovod (``ALLREDUCE_TRAIN_EXCHANGE_AT_ONE_RANK``, for checks).
    """

    def __init__(self, hvd: Any, stall_timeout: float, exchange_alone: bool = False) -> None:
        self.hvd = hvd
        self.rank, self.size = hvd.rank(), hvd.size()
        self.stall_timeout = stall_timeout
        # one rank's sum is its own buffer, its shard the whole: nothing to send (as HorovodAllreduce skips)
        self._send = self.size > 1 or exchange_alone

    def bounds(self, numel: int) -> list[tuple[int, int]]:
        """[lo, hi) of a bucket of ``numel`` elements that each rank (by rank) owns after a reduce-scatter."""
        return horovod_bounds(numel, self.size)

    def start_reduce_scatter(self, key: int, flat: torch.Tensor) -> _Pending:
        """Begin summing the bucket ``flat`` over the ranks; once :meth:`wait` returns, this rank's
        ``flat[lo:hi]`` holds the sum (the rest of ``flat`` as it was). ``flat`` must stay unchanged
        until then: Horovod's thread reads it."""
        lo, hi = self.bounds(flat.numel())[self.rank]
        handle = None
        if self._send:
            # communication: the bucket, summed over the ranks, each rank receiving its shard
            handle = self.hvd.reducescatter_async(flat, name=f"shard.rs.{key}", op=self.hvd.Sum)
        return _Pending(handle, flat, lo, hi, gather=False)

    def start_allgather(self, key: int, flat: torch.Tensor) -> _Pending:
        """Begin gathering every rank's ``flat[lo:hi]`` into every rank's ``flat``, whole once :meth:`wait`
        returns."""
        lo, hi = self.bounds(flat.numel())[self.rank]
        handle = None
        if self._send:
            # communication: this rank's shard to every rank, theirs to it (uneven sizes, empty ones included)
            handle = self.hvd.allgather_async(flat[lo:hi], name=f"shard.ag.{key}")
        return _Pending(handle, flat, lo, hi, gather=True)

    def wait(self, handles: list[Any], what: str) -> None:
        """Block until every collective of ``handles`` is done and its result is in its bucket.

        Horovod's background thread does the work; this thread sleeps between polls (a spinning wait
        would take the core from that thread and from the other ranks' backward on a host without a
        spare one) and raises :class:`~allreduce_train.errors.Stalled` naming ``what`` when one
        collective makes no progress for the stall timeout (Horovod's own stall shutdown, set a
        little later by the engine, is the backstop)."""
        for p in handles:
            handle = p.handle
            if handle is None:
                continue
            poll(lambda: bool(self.hvd.poll(handle)), self.stall_timeout, what)  # noqa: B023 (called here, at once)
            out = self.hvd.synchronize(handle)  # done: returns at once (raises Horovod's error if it failed)
            if p.gather:
                p.flat.copy_(out)
            else:
                p.flat[p.lo : p.hi].copy_(out)
