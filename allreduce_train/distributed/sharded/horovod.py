"""``--strategy sharded --allreduce-engine horovod``: ZeRO on Horovod's reduce-scatter and allgather.

The collectives are :class:`..horovod_shard.HorovodShardCollectives` (``hvd.reducescatter_async`` with
``op=Sum`` and ``hvd.allgather_async``, one bucket of ``--horovod-bucket-bytes`` each, fused by Horovod's
background thread with the other buckets ready in the same cycle); everything else a run needs
(metrics, votes, broadcast, abort) is the Horovod engine's own. Horovod cuts a bucket with the first
``numel % N`` ranks holding one element more, not in the mpi ring's chunks: the shards differ between
the engines, the checkpoints (gathered whole) do not.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..horovod import HorovodAllreduce
from ..wire import WireFormat
from .exchange import ShardedExchange

if TYPE_CHECKING:
    from ...config import Config


def create(cfg: Config, wire: WireFormat) -> ShardedExchange:
    """The sharded exchange on Horovod (``--horovod-bucket-bytes`` per gradient bucket)."""
    engine = HorovodAllreduce(cfg.exchange, cfg.horovod, wire=wire)
    return ShardedExchange(
        cfg.exchange,
        engine,
        engine.shard_collectives(),
        grad_clip=cfg.optim.grad_clip,
        wire=wire,
        bucket_bytes=cfg.horovod.bucket_bytes,
    )
