"""``--strategy sharded``: ZeRO stages 1-3 (Rajbhandari et al., SC 2020) on an engine's collectives.

Each worker keeps 1/N of the optimizer state (stage 1), also of the gradients (2), also of the
parameters (3); the gradients are reduce-scattered to the shards' owners, each owner updates its
shard, and the parameters are allgathered. The layer (``exchange.ShardedExchange``) is
engine-neutral and talks to an engine through :class:`.collectives.ShardCollectives`.

An engine plugs in as a module of this package (:data:`ENGINES`) with ``create(cfg, wire) ->
GradientExchange``: the mpi4py ring (``mpi``) and Horovod (``horovod``) return
``ShardedExchange(cfg.exchange, engine, collectives, grad_clip=cfg.optim.grad_clip, wire=wire,
bucket_bytes=...)`` over the engine's own exchange (metrics, votes, broadcast, abort) and its
:class:`.collectives.ShardCollectives`; torch returns PyTorch's FSDP2 (``fsdp``).
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ...config import Config
    from ..base import GradientExchange
    from ..wire import WireFormat

ENGINES = {"mpi": "mpi", "horovod": "horovod", "torch": "fsdp"}  # --allreduce-engine -> its module here


def create_sharded(cfg: Config, wire: WireFormat) -> GradientExchange:
    """The sharded exchange of ``--shard-stage`` on ``--allreduce-engine``'s collectives; ``wire``: the
    run's wire format, whose dtype the gradients are reduce-scattered in."""
    return import_module(f".{ENGINES[cfg.exchange.allreduce_engine]}", __name__).create(cfg, wire)
