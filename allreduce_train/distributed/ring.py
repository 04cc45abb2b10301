"""Ring allreduce on mpi4py: the second allreduce engine (``--allreduce-engine mpi``).

The same concept as :mod:`.horovod` on the parameter server's own machinery (:mod:`.bucketing`'s
buckets and hooks, :mod:`.mpi`'s messages), so that a comparison of the two concepts can hold the
implementation fixed: gradients are grouped into buckets (``--mpi-bucket-bytes``, reverse parameter
order), a bucket leaves from a gradient hook as soon as backward has produced all of it, and is
reduced by a ring of non-blocking point-to-point messages:

* reduce-scatter: the bucket is cut into N chunks; in step t rank r sends chunk r-t to rank r+1
  and adds chunk r-t-1 from rank r-1 to its own; after N-1 steps rank r holds chunk r+1 summed
  over every rank;
* allgather: N-1 more steps pass the summed chunks round the ring.

The two phases are one :class:`Ring` over a flat buffer, which also runs either phase alone (ZeRO's
reduce-scatter and allgather: :mod:`.sharded.mpi`). Every rank sends and receives 2(N-1)/N of the
bucket, the bandwidth-optimal figure of Patarasuk & Yuan that Horovod's (and Baidu's) ring reaches.
``--mpi-algorithm iallreduce`` hands each bucket to MPI_Iallreduce instead (Open MPI picks its own
algorithm). The sum is divided by N (Horovod's Average); clipping stays in the trainer (after the
exchange, on the averaged gradient). The bucket's flat buffer is in the wire format's dtype
(``wire``): with 16 bits the ring sends and sums 16-bit floats, as Horovod's fp16 compression does.

There is no background thread: messages advance whenever this rank's Python runs the exchange --
in every gradient hook, and in :meth:`synchronize` until every bucket is done, which sleeps between
tests like the PS (a spinning rank would take the core from the peer it waits for when ranks
outnumber cores). Every wait has a deadline: no progress for the stall timeout raises, and the
command line turns that into MPI_Abort of the job.
"""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from ..config import ExchangeConfig, MPIConfig
from ..errors import UserError
from .base import GradientExchange
from .bucketing import BucketedReduction, reverse_buckets
from .buffers import elements_in
from .mpi import (
    MAX_BUCKETS,
    abort,
    allgather_pickle,
    bcast_pickle,
    end_sum,
    import_mpi,
    node_rank,
    poll,
    start_sum,
    sum_now,
    yield_when_idle,
)
from .wire import FLOAT32, WireFormat

if TYPE_CHECKING:  # imported when the engine starts (import_mpi)
    from mpi4py.MPI import Comm, Request


def chunk_bounds(numel: int, n: int) -> list[int]:
    """Offsets of the n ring chunks of a bucket: as equal as possible, empty ones when numel < n."""
    return [numel * i // n for i in range(n + 1)]


def as_bytes(flat: torch.Tensor) -> np.ndarray:
    """The memory of a flat CPU tensor for MPI (numpy has no bfloat16: its bits travel as int16)."""
    return (flat.view(torch.int16) if flat.dtype == torch.bfloat16 else flat).numpy()


class Ring:
    """The ring's phases over one flat buffer, by non-blocking messages on ``comm`` with ``tag``.

    ``phases``: "allreduce" (both), "reduce_scatter" (this rank ends with :meth:`owned`'s chunk summed,
    the rest of the buffer partial sums) or "allgather" (every rank's :meth:`owned` chunk, whole, to
    every rank). Ring steps: 0 .. N-2 reduce-scatter, N-1 between the phases, N .. 2N-2 allgather.
    Messages move only when :meth:`advance` runs; :meth:`done` once every step and send has completed.
    """

    def __init__(
        self, comm: Comm, MPI: ModuleType, flat: torch.Tensor, tag: int, rank: int, size: int, phases: str = "allreduce"
    ) -> None:
        self.comm, self.MPI, self.flat, self.tag, self.rank, self.size = comm, MPI, flat, tag, rank, size
        self.arr = as_bytes(flat)  # the same memory, for MPI
        self.cut = chunk_bounds(len(flat), size)
        self.first = size - 1 if phases == "allgather" else 0
        self.last = size - 1 if phases == "reduce_scatter" else 2 * size - 1
        # Reduce-scatter step t receives rank r-1's partial sum of chunk r-t-1 into a scratch of its own.
        n_scratch = size - 1 if self.first == 0 else 0
        self.scratch = [np.empty(self.chunk(rank - t - 1).nbytes, dtype=np.uint8) for t in range(n_scratch)]
        self.step = -1  # not started
        self.recvs: list[Request] = []
        self.sends: list[Request] = []
        self.phase_sends: list[Request] = []

    @staticmethod
    def owned(rank: int, size: int) -> int:
        """The chunk that ``rank`` holds summed after the reduce-scatter (the allgather passes it on)."""
        return (rank + 1) % size

    def chunk(self, c: int) -> np.ndarray:
        """Chunk ``c`` (mod N) of the buffer, as raw bytes."""
        c %= len(self.cut) - 1
        return self.arr[self.cut[c] : self.cut[c + 1]].view(np.uint8)

    def start(self) -> None:
        self.step = self.first
        if self.first:  # the allgather alone: its first step is the turn between the phases
            self._step()
            return
        # communication: every reduce-scatter receive is posted now, before the first send, into
        # its own scratch (the allgather's receives come later: they land in the buffer itself)
        left, MPI = (self.rank - 1) % self.size, self.MPI
        self.recvs = [self.comm.Irecv([buf, MPI.BYTE], source=left, tag=self.tag) for buf in self.scratch]
        self.sends = []
        self._send(self.rank)

    def _send(self, c: int) -> None:
        # communication: chunk c to the right neighbour
        self.sends.append(
            self.comm.Isend([self.chunk(c), self.MPI.BYTE], dest=(self.rank + 1) % self.size, tag=self.tag)
        )

    def advance(self) -> bool:
        """Move as far as the messages allow; True if any step completed."""
        moved = False
        while 0 <= self.step < self.last and self._step():
            moved = True
        return moved

    def done(self) -> bool:
        return self.step >= self.last and self.MPI.Request.Testall(self.sends + self.phase_sends)

    def _step(self) -> bool:
        """Complete ring step ``self.step`` if its receive has arrived; False if it has not."""
        n, r, t = self.size, self.rank, self.step
        if t < n - 1:  # reduce-scatter: add the left neighbour's partial sum of chunk r-t-1, pass it on
            if not self.recvs[t].Test():
                return False
            c = (r - t - 1) % n
            lo, hi = self.cut[c], self.cut[c + 1]
            if hi > lo:  # an empty chunk (fewer elements than ranks) has nothing to add, and torch cannot view it
                # numpy has no bfloat16: the scratch's bytes become the buffer's dtype in torch
                self.flat[lo:hi].add_(torch.from_numpy(self.scratch[t]).view(self.flat.dtype))
            self.step += 1
            if t + 1 < n - 1:
                self._send(c)
                return True
            # Chunk r+1 is summed. Before the allgather's receives may overwrite chunks, the
            # reduce-scatter's sends of them must have left.
            self.phase_sends, self.sends = self.sends, []
            return True
        if t == n - 1:  # between the phases
            if not self.MPI.Request.Testall(self.phase_sends):
                return False
            # communication: the allgather's receives, straight into the buffer, then its first send
            left = (r - 1) % n
            self.recvs = [
                self.comm.Irecv([self.chunk(r - s), self.MPI.BYTE], source=left, tag=self.tag) for s in range(n - 1)
            ]
            self._send(self.owned(r, n))
            self.step += 1
            return True
        s = t - n  # allgather step s: chunk r-s has arrived complete; pass it on unless it is the last
        if not self.recvs[s].Test():
            return False
        self.step += 1
        if s + 1 < n - 1:
            self._send((r - s) % n)
        return True


class _Bucket:
    """One bucket's flat buffer and the state of its reduction (a :class:`Ring` or one MPI request)."""

    def __init__(self, numel: int, dtype: torch.dtype) -> None:
        self.flat = torch.zeros(numel, dtype=dtype)
        self.arr = as_bytes(self.flat)
        self.ring: Ring | None = None  # the ring of this step: its scratch lives while it does
        self.request: Request | None = None  # MPI_Iallreduce's


class MPIRingAllreduce(GradientExchange):
    """``--strategy allreduce --allreduce-engine mpi``: see the module docstring."""

    name = "allreduce"

    def __init__(self, x: ExchangeConfig, mpi: MPIConfig, average: bool = True, wire: WireFormat = FLOAT32) -> None:
        """``average=False``: leave the sum (commbench checks it exactly on integer inputs); ``wire``:
        the run's wire format, whose dtype the gradients are summed in."""
        self.cfg, self.mpi_cfg = x, mpi
        yield_when_idle()  # as with Horovod
        self.MPI = MPI = import_mpi()
        world = self.world = MPI.COMM_WORLD
        self.rank, self.size = world.Get_rank(), world.Get_size()
        # communication: collectives over every rank, in the same order everywhere
        self.local_rank, self.local_size = node_rank(world, MPI)
        # Gradients on their own communicator: bucket indices are its tags, and nothing else
        # (metrics, set-up objects) can match a gradient's receive.
        self.comm = world.Dup()
        self.timeout = x.stall_timeout  # 0: wait forever (the watchdog is off too)
        self.algorithm = mpi.algorithm
        self.wire, self.dtype = wire, wire.dtype  # the bucket's buffer: the copy in is the cast (compression.py)
        self.divisor = self.size if average else 1
        self._buckets: list[_Bucket] = []
        self.reduction: BucketedReduction | None = None  # attach(): the hooks, the buckets' readiness

    # ------------------------------------------------------------ set-up
    def describe(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "allreduce_engine": "mpi",
            "mpi_algorithm": self.algorithm,
            "mpi_bucket_bytes": self.mpi_cfg.bucket_bytes,
            "backward_passes_per_step": self.cfg.backward_passes_per_step,
            "reduce_op": self.cfg.reduce_op,
        }
        if self._buckets:
            out["mpi_buckets"] = len(self._buckets)
        return out

    def prepare(
        self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, every_step: bool = True
    ) -> torch.optim.Optimizer:
        if self.size == 1:
            return optimizer  # the average over one worker is its own gradient: nothing to send
        self.broadcast_state(model, optimizer)  # communication: rank 0's model and optimizer state
        self.attach([p for p in model.parameters() if p.requires_grad])  # hooks honour set_exchanging
        return optimizer

    def attach(self, params: list[torch.Tensor]) -> None:
        """Bucket ``params`` and start each bucket's reduction from their gradient hooks (without
        :meth:`prepare`'s broadcast: commbench exchanges tensors that are no model's)."""
        if self.size == 1:
            return
        sizes = [p.numel() for p in params]
        buckets = reverse_buckets(sizes, elements_in(self.mpi_cfg.bucket_bytes, self.dtype))
        if len(buckets) > MAX_BUCKETS:
            raise UserError(f"{len(buckets)} buckets are too many message tags; raise --mpi-bucket-bytes")
        self._buckets = [_Bucket(sum(sizes[p] for p in members), self.dtype) for members in buckets]
        self.reduction = BucketedReduction(
            params,
            buckets,
            self.cfg.backward_passes_per_step,
            self._start,
            self._done,
            progress=self._advance,
            tracer=self.tracer,
        )

    def flat_buffers(self) -> list[torch.Tensor]:
        """Each bucket's flat buffer and the reduce-scatter scratch of a ring in flight (none at one rank:
        nothing is sent)."""
        return [
            t
            for b in self._buckets
            for t in (b.flat, *(torch.from_numpy(s) for s in (b.ring.scratch if b.ring else ())))
        ]

    # ------------------------------------------------------------ one step
    def set_exchanging(self, on: bool) -> None:
        if self.reduction is not None:
            self.reduction.exchanging = on

    def _start(self, b: int) -> None:
        """Bucket ``b``'s gradients into its buffer, and its ring (or MPI_Iallreduce) started."""
        bucket = self._buckets[b]
        assert self.reduction is not None
        self.reduction.pack(b, bucket.flat)
        if self.algorithm == "iallreduce":
            # communication: the whole bucket, summed by MPI's own algorithm
            bucket.request = self.comm.Iallreduce(self.MPI.IN_PLACE, bucket.arr, op=self.MPI.SUM)
            return
        bucket.ring = Ring(self.comm, self.MPI, bucket.flat, b, self.rank, self.size)  # tag: the bucket's index
        bucket.ring.start()

    def _done(self, b: int) -> None:
        """Bucket ``b``'s sum averaged into its parameters' gradients; its ring's scratch let go."""
        bucket = self._buckets[b]
        assert self.reduction is not None
        self.reduction.unpack(b, bucket.flat, self.divisor)
        bucket.ring, bucket.request = None, None

    def _advance(self) -> bool:
        """Move every bucket in flight as far as its messages allow (between layers of backward too); True if
        any moved."""
        moved = False
        for bucket in self._buckets:
            if bucket.ring is not None:
                moved = bucket.ring.advance() or moved
        return moved

    def _bucket_done(self, b: int) -> bool:
        bucket = self._buckets[b]
        done = bucket.request.Test() if bucket.request is not None else bucket.ring is not None and bucket.ring.done()
        if done:
            self.tracer.bucket_done(b)  # polled until all are: the tracer keeps the first time only
        return done

    def synchronize(self) -> None:
        if self.reduction is None:  # one worker: nothing to exchange
            return
        # communication: wait for every bucket, advancing the rings
        self.reduction.complete(
            lambda: poll(
                lambda: all(self._bucket_done(b) for b in range(len(self._buckets))),
                self.timeout,
                "the ring allreduce of the gradients",
                self._advance,
            )
        )

    def apply(self, optimizer: torch.optim.Optimizer) -> None:
        optimizer.step()

    # ------------------------------------------------------------ collectives for the trainer
    def sum_over_workers(self, values: torch.Tensor) -> torch.Tensor:
        if self.size == 1:
            return values
        # communication: non-blocking underneath, so that a stuck rank times out
        return sum_now(self.world, self.MPI, values, self._wait, "the other workers (metrics)")

    def start_vote(self, flags: torch.Tensor) -> None:
        if self.size == 1:
            self._vote = flags
            return
        # communication: the step's vote, non-blocking: started before the last backward, it progresses
        # with the hooks' ring messages and is back with the gradients (a blocking sum after them cost
        # a round trip and a poll per step: 0.8 ms of a LeNet-5 step at load 4, docs/performance.md)
        self._vote_sum = start_sum(self.world, self.MPI, flags)

    def end_vote(self) -> torch.Tensor:
        if self.size == 1:
            return self._vote
        return end_sum(self._vote_sum, self._wait, "the other workers (the step's vote)")

    def broadcast_state(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
        """Rank 0's parameters and buffers straight into every rank's own tensors, one non-blocking
        MPI_Ibcast of raw bytes each, and its optimizer state pickled (empty when fresh). The base's
        pickled state dict would hold the model twice more for a moment (the pickle and its copy): a
        model that fits its memory limit only sharded could not start (``make bench-memory``). Tensors
        MPI cannot take as they are (on a GPU, not contiguous) and modules with extra state go the
        base's way."""
        tensors = list({id(t): t for t in (*model.parameters(), *model.buffers())}.values())
        plain = all(t.device.type == "cpu" and t.is_contiguous() for t in tensors) and all(
            type(m).get_extra_state is torch.nn.Module.get_extra_state for m in model.modules()
        )
        if not plain:
            super().broadcast_state(model, optimizer)
            return
        with torch.no_grad():
            for t in tensors:
                raw = t.detach().reshape(-1).view(torch.uint8).numpy()  # the tensor's own memory, as bytes
                # communication: rank 0's tensor into this rank's
                self._wait(self.world.Ibcast([raw, self.MPI.BYTE], root=0).Test, "rank 0's parameters")
        state = self.broadcast_object(optimizer.state_dict() if self.is_main else None)  # communication
        if not self.is_main:
            optimizer.load_state_dict(state)

    def broadcast_object(self, obj: Any, root: int = 0) -> Any:
        if self.size == 1:
            return obj
        return bcast_pickle(self.world, self.MPI, obj, root, self._wait, "the other ranks")

    def allgather_object(self, obj: Any) -> list[Any]:
        if self.size == 1:
            return [obj]
        return allgather_pickle(self.world, self.MPI, obj, self._wait, "every rank's set-up")

    def _wait(self, test: Callable[[], bool], what: str) -> None:
        poll(test, self.timeout, what)

    # ------------------------------------------------------------ shutdown (close: the base's)
    def abort(self, code: int) -> None:
        abort(code, self.world)
