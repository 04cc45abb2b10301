"""Which worker owns which elements: the buckets of the gradients and each bucket's cut into shards.

Computed identically on every rank from the parameter sizes alone. The buckets are the ring's
(:func:`..bucketing.reverse_buckets`: reverse parameter order, up to a bucket size); each bucket's flat
buffer (its parameters end to end) is cut by the engine's :meth:`.collectives.ShardCollectives.bounds`,
and worker r owns ``[lo, hi)`` of it: the elements whose summed gradient its reduce-scatter leaves it,
whose optimizer state it keeps and whose update it computes. A parameter can straddle two shards: each
owner holds a *segment* ``(p, lo, hi)`` of it (:mod:`..shardstate`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from ..bucketing import reverse_buckets
from ..buffers import offsets
from ..shardstate import Range


@dataclass
class ShardLayout:
    sizes: list[int]  # elements per parameter
    buckets: list[list[int]]  # parameter indices per bucket, in the order they leave (reverse parameter order)
    starts: list[list[int]]  # each member's offset in its bucket's flat buffer, and the bucket's end
    bounds: list[list[tuple[int, int]]]  # per bucket, per worker: [lo, hi) of the flat buffer it owns
    # (bucket, worker) -> the segments that worker owns of that bucket, in bucket order (none: no key)
    segments: dict[tuple[int, int], list[Range]] = field(default_factory=dict)

    def numel(self, b: int) -> int:
        return self.starts[b][-1]

    def shard_numel(self, b: int, rank: int) -> int:
        lo, hi = self.bounds[b][rank]
        return hi - lo


def make_layout(
    sizes: list[int], bucket_elems: int, bounds: Callable[[int], list[tuple[int, int]]], workers: int
) -> ShardLayout:
    """Bucket parameters of ``sizes`` elements (``bucket_elems`` per bucket) and cut each bucket by ``bounds``."""
    buckets = reverse_buckets(sizes, bucket_elems)
    starts = [offsets(sizes[p] for p in members) for members in buckets]
    cuts = [bounds(start[-1]) for start in starts]
    layout = ShardLayout(list(sizes), buckets, starts, cuts)
    for b, members in enumerate(buckets):
        for r in range(workers):
            lo, hi = cuts[b][r]
            segs = [
                (p, max(lo, s) - s, min(hi, s + sizes[p]) - s)
                for p, s in zip(members, starts[b], strict=False)  # starts has one entry more: the end
                if max(lo, s) < min(hi, s + sizes[p])
            ]
            if segs:
                layout.segments[(b, r)] = segs
    return layout
