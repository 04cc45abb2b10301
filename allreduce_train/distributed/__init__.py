"""Gradient exchange strategies behind one small interface (see :mod:`.base`).

Nothing here imports horovod or mpi4py at module import time, so configuration can be validated
(and errors reported) before any process group forms.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..config import STRATEGIES

if TYPE_CHECKING:
    from ..config import Config
    from .base import GradientExchange

__all__ = ["STRATEGIES", "create_exchange"]


def create_exchange(cfg: "Config") -> "GradientExchange":
    """Initialise the communication backend of ``cfg.exchange.strategy`` and return the exchange.

    Each engine gets the settings every exchange shares (``cfg.exchange``) and its own section only."""
    if cfg.exchange.strategy == "allreduce" and cfg.exchange.allreduce_engine == "mpi":
        from .ring import MPIRingAllreduce

        return MPIRingAllreduce(cfg.exchange, cfg.mpi)
    if cfg.exchange.strategy == "allreduce":
        from .horovod import HorovodAllreduce

        return HorovodAllreduce(cfg.exchange, cfg.horovod)
    if cfg.exchange.strategy == "ps":
        from .ps import ParameterServer

        return ParameterServer(cfg.exchange, cfg.ps, grad_clip=cfg.optim.grad_clip)
    if cfg.exchange.strategy == "none":  # every rank alone: the no-exchange bound (docs/performance.md)
        from .local import NoExchange

        return NoExchange(cfg.exchange.stall_timeout)
    raise ValueError(f"unknown strategy {cfg.exchange.strategy!r}")
