"""Which server owns which parameter elements, and which gradients travel together.

Two independent cuts of the flattened parameters, both fixed before the first step and computed
identically on every rank from the parameter sizes alone:

* **Shards** (where an element lives). A parameter larger than ``split_elems`` is cut into equal
  chunks of at most ``split_elems`` elements (MXNet splits "big arrays" across servers, BytePS
  partitions tensors for the same reason: one huge tensor would pin one server). Chunks go,
  largest first, to the server holding the fewest elements so far (TensorFlow's greedy
  byte-size load balancer). Placing each chunk on the least-loaded server keeps the loads of
  any two servers within one chunk of each other, whatever the order.
* **Buckets** (when it travels). Parameters are grouped in *reverse* order, up to
  ``bucket_elems`` per bucket, because backward produces the last layer's gradients first: a
  bucket is pushed as soon as its gradients are complete, while backward continues.

A worker sends one fused message per (bucket, server) pair holding every range of that bucket
that the server owns; the server keeps its elements of each bucket as one flat tensor.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..buffers import reverse_buckets


@dataclass(frozen=True)
class Chunk:
    """Elements ``lo:hi`` of flattened parameter ``param``, owned by ``server``."""

    param: int
    lo: int
    hi: int
    server: int

    @property
    def numel(self) -> int:
        return self.hi - self.lo


Range = tuple[int, int, int]  # (param index, lo, hi) within the flattened parameter


@dataclass
class Layout:
    sizes: list[int]  # elements per parameter, in model.parameters() order
    num_servers: int
    chunks: list[Chunk]
    buckets: list[list[int]]  # parameter indices per bucket, in push order (reverse parameter order)
    # (bucket, server) -> the ranges that server owns in that bucket, in a fixed order
    segments: dict[tuple[int, int], list[Range]] = field(default_factory=dict)

    def servers_of(self, bucket: int) -> list[int]:
        return [s for s in range(self.num_servers) if (bucket, s) in self.segments]

    def segment_numel(self, bucket: int, server: int) -> int:
        return sum(hi - lo for _, lo, hi in self.segments.get((bucket, server), ()))

    def server_numel(self) -> list[int]:
        load = [0] * self.num_servers
        for c in self.chunks:
            load[c.server] += c.numel
        return load


def plan(sizes: list[int], num_servers: int, split_elems: int, bucket_elems: int) -> Layout:
    """Shard and bucket parameters of the given sizes (see the module docstring)."""
    if num_servers < 1 or split_elems < 1 or bucket_elems < 1:
        raise ValueError("num_servers, split_elems and bucket_elems must be >= 1")
    pieces: list[tuple[int, int, int]] = []
    for p, n in enumerate(sizes):
        parts = max(1, -(-n // split_elems))  # ceil: every chunk <= split_elems
        pieces += [(p, n * i // parts, n * (i + 1) // parts) for i in range(parts)]
    load = [0] * num_servers
    chunks = []
    # Largest first gives tighter balance than any fixed order; ties broken by position so that
    # every rank computes the same plan.
    for p, lo, hi in sorted(pieces, key=lambda c: (-(c[2] - c[1]), c[0], c[1])):
        s = min(range(num_servers), key=lambda i: (load[i], i))
        load[s] += hi - lo
        chunks.append(Chunk(p, lo, hi, s))
    chunks.sort(key=lambda c: (c.param, c.lo))

    buckets = reverse_buckets(sizes, bucket_elems)
    by_param: dict[int, list[Chunk]] = {}
    for c in chunks:
        by_param.setdefault(c.param, []).append(c)
    segments: dict[tuple[int, int], list[Range]] = {}
    for b, params in enumerate(buckets):
        for p in params:
            for c in by_param.get(p, ()):
                if c.numel == 0:
                    continue
                ranges = segments.setdefault((b, c.server), [])
                if ranges and ranges[-1][0] == p and ranges[-1][2] == c.lo:
                    ranges[-1] = (p, ranges[-1][1], c.hi)  # adjacent chunks of one server: one copy
                else:
                    ranges.append((p, c.lo, c.hi))
    return Layout(list(sizes), num_servers, chunks, buckets, segments)
