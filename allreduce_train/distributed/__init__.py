"""Distribution, by role:

* engines -- the collective primitives behind one small interface (:mod:`.base`): Horovod
  (:mod:`.horovod`), the mpi4py ring (:mod:`.ring`), torch.distributed (:mod:`.c10d`), the
  parameter server (:mod:`.ps`), ZeRO's shards on an engine's collectives (:mod:`.sharded`), and one
  process or ``--strategy none`` (:mod:`.local`);
* wire formats -- what of a gradient travels (:mod:`.wire`: float32, 16 bits, PowerSGD), one object
  per run that the engine reads and the schedule runs;
* schedules -- when the workers agree (:mod:`.schedules`: synchronous, Adasum's, :mod:`.localsgd`,
  :mod:`.diloco`);
* plumbing, once -- flat buffers (:mod:`.buffers`), MPI helpers (:mod:`.mpi`), bytes on the wire
  (:mod:`.wirecost`, torch-free, which the lab's cost model imports too).

Which engine runs which wire format and schedule is one table in :mod:`allreduce_train.config`.
Nothing here imports horovod, mpi4py or torch.distributed at module import time, so configuration
can be validated (and errors reported) before any process group forms.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..config import Config, ExchangeConfig
    from .base import GradientExchange
    from .schedules import Sync

__all__ = ["create_exchange", "make_schedule"]


def create_exchange(cfg: Config) -> GradientExchange:
    """Initialise the communication backend of ``cfg.exchange.strategy`` and return the engine.

    Each engine gets the settings every exchange shares (``cfg.exchange``), its own section only,
    and the run's wire format (:mod:`.wire`, made here once from ``--compression``), whose dtype its
    gradient sum runs in; the layers above it come from :func:`make_schedule`."""
    from .wire import make_wire

    wire = make_wire(cfg.exchange.compression, cfg.exchange.powersgd_rank)
    if cfg.exchange.strategy == "allreduce" and cfg.exchange.allreduce_engine == "mpi":
        from .ring import MPIRingAllreduce

        return MPIRingAllreduce(cfg.exchange, cfg.mpi, wire=wire)
    if cfg.exchange.strategy == "allreduce" and cfg.exchange.allreduce_engine == "torch":
        from .c10d import TorchDistributed

        return TorchDistributed(cfg.exchange, cfg.torch, wire=wire)
    if cfg.exchange.strategy == "allreduce":
        from .horovod import HorovodAllreduce

        return HorovodAllreduce(cfg.exchange, cfg.horovod, wire=wire)
    if cfg.exchange.strategy == "ps":
        from .ps import ParameterServer

        return ParameterServer(cfg.exchange, cfg.ps, grad_clip=cfg.optim.grad_clip, wire=wire)
    if cfg.exchange.strategy == "sharded":  # ZeRO on --allreduce-engine's collectives (sharded/)
        from .sharded import create_sharded

        return create_sharded(cfg, wire)
    if cfg.exchange.strategy == "none":  # every rank alone: the no-exchange bound (docs/performance.md)
        from .local import NoExchange

        return NoExchange(cfg.exchange.stall_timeout)
    raise ValueError(f"unknown strategy {cfg.exchange.strategy!r}")


def make_schedule(x: ExchangeConfig, ex: GradientExchange) -> Sync:
    """The schedule of ``--average-every`` / ``--diloco-every`` over ``ex``, with the wire format ``ex`` was
    given (``ex.wire``: ``--compression``'s)."""
    from .schedules import Sync

    wire = ex.wire
    if x.average_every:
        from .localsgd import LocalSGD

        return LocalSGD(ex, wire, x.average_every, x.average_warmup_steps)
    if x.diloco_every:
        from .diloco import DiLoCo

        return DiLoCo(ex, wire, x.diloco_every, x.diloco_outer_lr, x.diloco_outer_momentum)
    if x.reduce_op == "adasum":
        from .schedules import AdasumSync

        return AdasumSync(ex, wire)
    return Sync(ex, wire)
