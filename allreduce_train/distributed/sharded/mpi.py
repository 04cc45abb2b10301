"""``--strategy sharded --allreduce-engine mpi``: the mpi4py ring's two phases, apart.

The ring allreduce (:class:`..ring.Ring`) is a reduce-scatter followed by an allgather; here each runs
alone, on a communicator of its own (a bucket's reduce-scatter and its parameters' allgather may then be
in flight at once under the same tag). After the reduce-scatter rank r holds chunk r+1 of the bucket
summed, in the ring's order of additions: the sharded concept's shards are those chunks, so its sums
are the ring's, bit for bit. Messages move whenever this rank's Python runs the exchange (a gradient
hook, a wait), as the ring's do.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from ..mpi import poll
from ..ring import MPIRingAllreduce, Ring, chunk_bounds
from ..wire import WireFormat
from .exchange import ShardedExchange

if TYPE_CHECKING:
    from ...config import Config


class MPIShardCollectives:
    """:class:`.collectives.ShardCollectives` on the mpi4py ring's phases (``engine``: the ring engine,
    whose communicator, ranks and stall timeout it uses)."""

    def __init__(self, engine: MPIRingAllreduce) -> None:
        self.MPI, self.rank, self.size, self.timeout = engine.MPI, engine.rank, engine.size, engine.timeout
        # communication: collectives over every rank, in the same order everywhere
        self.comms = {"reduce_scatter": engine.world.Dup(), "allgather": engine.world.Dup()}
        self.flight: list[Ring] = []

    def bounds(self, numel: int) -> list[tuple[int, int]]:
        cut, n = chunk_bounds(numel, self.size), self.size
        return [(cut[Ring.owned(r, n)], cut[Ring.owned(r, n) + 1]) for r in range(n)]

    def _start(self, phase: str, key: int, flat: torch.Tensor) -> tuple[Ring, torch.Tensor] | None:
        if self.size == 1:
            return None  # one rank: its shard is the whole bucket, summed and gathered already
        # MPI moves host memory: a CUDA buffer travels through a copy (back in wait())
        host = flat if flat.device.type == "cpu" else flat.cpu()
        ring = Ring(self.comms[phase], self.MPI, host, key, self.rank, self.size, phase)
        ring.start()  # communication
        self.flight.append(ring)
        return ring, flat

    def start_reduce_scatter(self, key: int, flat: torch.Tensor) -> Any:
        return self._start("reduce_scatter", key, flat)

    def start_allgather(self, key: int, flat: torch.Tensor) -> Any:
        return self._start("allgather", key, flat)

    def progress(self) -> bool:
        """Move every ring in flight as far as its messages allow; True if any moved."""
        moved = False
        for ring in self.flight:
            moved = ring.advance() or moved
        self.flight = [r for r in self.flight if not r.done()]
        return moved

    def wait(self, handles: list[Any], what: str) -> None:
        started = [h for h in handles if h is not None]
        poll(lambda: all(r.done() for r, _ in started), self.timeout, what, self.progress)  # communication
        for ring, flat in started:
            if ring.flat is not flat:
                flat.copy_(ring.flat)


def create(cfg: Config, wire: WireFormat) -> ShardedExchange:
    """The sharded exchange on the mpi4py ring (``--mpi-bucket-bytes`` per gradient bucket)."""
    engine = MPIRingAllreduce(cfg.exchange, cfg.mpi, wire=wire)
    return ShardedExchange(
        cfg.exchange,
        engine,
        MPIShardCollectives(engine),
        grad_clip=cfg.optim.grad_clip,
        wire=wire,
        bucket_bytes=cfg.mpi.bucket_bytes,
    )
