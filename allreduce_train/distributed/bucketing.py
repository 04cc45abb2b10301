"""Buckets: which gradients travel together, where each element is summed, and the reduction that
backward's hooks start bucket by bucket. The mpi ring (:mod:`.ring`), the torch engine (:mod:`.c10d`),
the parameter server (:mod:`.ps`) and the sharded concept (:mod:`.sharded`) all run on it; each keeps
only how a bucket starts and what is done with it once summed.

The plan, fixed before the first step and computed identically on every rank from the parameter sizes:

* **Buckets** (when it travels, :func:`reverse_buckets`). Parameters are grouped in *reverse* order, up
  to ``bucket_elems`` per bucket, because backward produces the last layer's gradients first: a bucket
  leaves as soon as its gradients are complete, while backward continues.
* **Shards** (where an element is summed, :func:`plan`: the parameter servers'). A parameter larger than
  ``split_elems`` is cut into equal chunks of at most ``split_elems`` elements (MXNet splits "big arrays"
  across servers, BytePS partitions tensors for the same reason: one huge tensor would pin one server).
  Chunks go, largest first, to the server holding the fewest elements so far (TensorFlow's greedy
  byte-size load balancer). Placing each chunk on the least-loaded server keeps the loads of any two
  servers within one chunk of each other, whatever the order. A worker sends one fused message per
  (bucket, server) pair holding every range of that bucket that the server owns; the server keeps its
  elements of each bucket as one flat tensor.

The reduction (:class:`BucketedReduction`): a hook per parameter counts its bucket's gradients
(``--backward-passes-per-step`` times each), a complete bucket starts (in index order where the
engines' collectives must match on every rank), :meth:`~BucketedReduction.start_late` starts what
backward did not complete (a parameter outside the step's loss: its gradient is None and travels as
zeros), and :meth:`~BucketedReduction.finish_all` hands each summed bucket back.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from ..trace import NULL, NullTracer
from .buffers import pack, unpack


def reverse_buckets(sizes: Sequence[int], bucket_elems: int) -> list[list[int]]:
    """Tensors of ``sizes`` elements grouped in *reverse* order, up to ``bucket_elems`` per bucket (a larger
    tensor alone): backward produces the last layer's gradients first, so a bucket can leave as soon as its
    gradients are complete, while backward continues. Indices per bucket, in the order they leave."""
    buckets: list[list[int]] = []
    filled = 0
    for p in reversed(range(len(sizes))):
        if not buckets or (filled + sizes[p] > bucket_elems and filled > 0):
            buckets.append([])
            filled = 0
        buckets[-1].append(p)
        filled += sizes[p]
    return buckets


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


class BucketedReduction:
    """The gradient sum of ``params`` started from backward's hooks, bucket by bucket (the module docstring).

    ``buckets``: parameter indices per bucket, in the order they leave; ``passes``: backward passes per
    step (each parameter's hook fires that many times before its gradient is whole). An engine gives
    ``start(b)``, which sends bucket ``b`` (from a hook, or late), and ``done(b)``, which takes bucket ``b``'s
    sum once every bucket's has arrived. ``ordered``: buckets start in index order on every rank (the
    engines' collectives must match; the parameter server's messages are tagged and need not);
    ``progress``: run after every hook (messages moved on, a colocated server served, between layers of
    backward); ``from_hooks=False``: nothing leaves before :meth:`start_late` (the parameter server's
    async clipping needs the whole gradient first).
    """

    def __init__(
        self,
        params: list[torch.Tensor],
        buckets: list[list[int]],
        passes: int,
        start: Callable[[int], Any],
        done: Callable[[int], Any],
        *,
        ordered: bool = True,
        progress: Callable[[], Any] | None = None,
        from_hooks: bool = True,
        tracer: NullTracer = NULL,
    ) -> None:
        self.params, self.buckets, self.passes, self.tracer = params, buckets, passes, tracer
        self._start, self._done = start, done
        self.ordered, self.progress, self.from_hooks = ordered, progress, from_hooks
        self.exchanging = True  # a schedule turns it off for its local steps
        self.reset()
        self.hooks = [
            params[p].register_post_accumulate_grad_hook(lambda _p, b=b: self._ready(b))
            for b, members in enumerate(buckets)
            for p in members
        ]

    def reset(self) -> None:
        """A new step: every bucket waits for all of its gradients again."""
        self.missing = [len(members) * self.passes for members in self.buckets]
        self.started = [False] * len(self.buckets)
        self.next = 0  # ordered: the first bucket not started

    def _ready(self, b: int) -> None:
        if not self.exchanging:
            return  # a step without the gradient sum (a schedule's local step, PowerSGD): nothing leaves
        self.missing[b] -= 1
        if self.from_hooks:
            if self.ordered:
                while self.next < len(self.buckets) and self.missing[self.next] <= 0:
                    self.start(self.next)
            elif self.missing[b] == 0:
                self.start(b)
        if self.progress is not None:
            self.progress()

    def start(self, b: int) -> None:
        """Where every bucket's reduction starts: from the hook of its last gradient, or late."""
        self.started[b] = True
        self.next = max(self.next, b + 1)
        self._start(b)
        self.tracer.bucket_start(b)  # --trace-steps

    def start_late(self) -> None:
        """Start, in index order, every bucket whose gradients backward did not all produce (a parameter
        outside this step's loss: zeros for it, as Horovod sends)."""
        for b, started in enumerate(self.started):
            if not started:
                self.start(b)

    def finish(self, b: int) -> None:
        """Where every bucket's reduction ends: its sum is taken (once every bucket's has arrived)."""
        self.tracer.bucket_done(b)  # seen done here unless the engine saw it first (the tracer keeps the first)
        self._done(b)

    def finish_all(self) -> None:
        """Take every bucket's sum, in index order, and begin a new step."""
        for b in range(len(self.buckets)):
            self.finish(b)
        self.reset()

    def complete(self, wait: Callable[[], Any]) -> None:
        """The end of a step: start what backward did not, ``wait`` until every bucket is summed, take the sums.
        On a local step (nothing sent) each worker keeps its own gradient."""
        if self.exchanging:
            self.start_late()
            wait()
            self.finish_all()
        else:
            self.reset()

    def members(self, b: int) -> list[torch.Tensor]:
        """Bucket ``b``'s parameters."""
        return [self.params[p] for p in self.buckets[b]]

    def pack(self, b: int, flat: torch.Tensor) -> torch.Tensor:
        """Bucket ``b``'s gradients end to end into ``flat``: the copy in is the cast to the wire's dtype, and a
        parameter outside this step's loss (no gradient) sends zeros."""
        members = self.members(b)
        return pack([p.grad for p in members], flat, [p.numel() for p in members])

    def grad(self, p: int) -> torch.Tensor:
        """Parameter ``p``'s gradient, flat; zeros for a parameter outside this step's loss."""
        g = self.params[p].grad
        return torch.zeros_like(self.params[p]).reshape(-1) if g is None else g.reshape(-1)

    def unpack(self, b: int, flat: torch.Tensor, divisor: int) -> None:
        """Bucket ``b``'s sum from ``flat``, divided by ``divisor``, into its parameters' ``.grad`` (widened to
        float32; made, as zeros, where backward left none)."""
        with torch.no_grad():
            avg = flat.float()  # the same tensor where the wire is float32
            if divisor != 1:
                avg.div_(divisor)
            grads = []
            for param in self.members(b):
                if param.grad is None:
                    param.grad = torch.zeros_like(param)
                grads.append(param.grad)
            unpack(avg, grads)

    def remove(self) -> None:
        """Take the hooks off (the engine closes)."""
        for h in self.hooks:
            h.remove()
        self.hooks = []
