"""Wire formats (``--compression``): what of a gradient travels, as layers over any engine's sum.

* ``none``, ``fp16``, ``bf16`` (:class:`WireFormat`): every element, in float32 or 16 bits. The
  engine sums in that dtype (its flat buffers are the cast: packing narrows, unpacking widens;
  :mod:`.compression` says where each engine rounds), from its gradient hooks while backward runs.
* ``powersgd`` (:class:`PowerSGDWire`): rank-r factors with error feedback (:mod:`.powersgd`). Its
  two sums need the whole gradient, so it asks the engine for no gradient sum of its own and sends
  the factors through the engine's grouped :meth:`~.base.GradientExchange.sum_tensors` after backward.

The wire format is one object, made once from ``--compression`` (:func:`make_wire`, by
``distributed.create_exchange``): the engine receives it and reads :attr:`WireFormat.dtype` (Horovod's
compression, the mpi ring's and the torch engine's bucket buffers, the parameter server's messages,
the sharded concept's reduce-scatter), and the schedule takes it from the engine
(``GradientExchange.wire``). Element sizes and the 16-bit names are one table (:mod:`.wirecost`).

A wire format owns its state (PowerSGD's error feedback and Qs: the checkpoint's per-worker
``exchange``). Which engine runs which format is the table in :mod:`allreduce_train.config`.
"""

from __future__ import annotations

from typing import Any

import torch

from .compression import wire_dtype
from .powersgd import PowerSGD, SumTensors


class WireFormat:
    """float32, fp16 or bf16: the engine averages the gradients itself, in :attr:`dtype` (its bucket
    buffers', its messages' or Horovod's compression's)."""

    streams = True  # the engine's own gradient sum (from hooks) carries this format

    def __init__(self, name: str) -> None:
        self.name, self.dtype = name, wire_dtype(name)

    def attach(self, sum_tensors: SumTensors, workers: int, params: list[torch.Tensor]) -> None:
        """Called once the engine has prepared the model: its grouped sum over its ``workers``
        (:meth:`~.base.GradientExchange.sum_tensors`) and ``params``, those that get gradients."""

    def reduce(self) -> None:
        """After the engine's synchronize(): the gradients are averaged (nothing to do here)."""

    def state_dict(self) -> Any:
        """This worker's state for the checkpoint (None: none)."""
        return None

    def load_state_dict(self, state: Any) -> None:
        pass

    def describe(self) -> dict[str, Any]:
        return {"compression": self.name}


class PowerSGDWire(WireFormat):
    """``--compression powersgd --powersgd-rank r``: the engine sends no gradient; the factors go
    through its grouped sum after backward (two sums per step)."""

    streams = False

    def __init__(self, rank: int) -> None:
        super().__init__("powersgd")
        self.rank = rank
        self.psgd: PowerSGD | None = None

    def attach(self, sum_tensors: SumTensors, workers: int, params: list[torch.Tensor]) -> None:
        self.sum_tensors, self.workers = sum_tensors, workers
        if workers > 1:  # one worker's average is its own gradient: nothing to compress
            self.psgd = PowerSGD(params, self.rank)

    def reduce(self) -> None:
        if self.psgd is not None:
            self.psgd.average(self.sum_tensors, self.workers)  # communication: the Ps, then the Qs

    def state_dict(self) -> Any:
        return self.psgd.state_dict() if self.psgd is not None else None

    def load_state_dict(self, state: Any) -> None:
        if self.psgd is not None and state is not None:
            self.psgd.load_state_dict(state)


FLOAT32 = WireFormat("none")  # an engine's wire format where none is given (stateless: one serves all)


def make_wire(compression: str, powersgd_rank: int = 1) -> WireFormat:
    """The wire format of ``--compression`` (``--powersgd-rank``): made once per run."""
    return PowerSGDWire(powersgd_rank) if compression == "powersgd" else WireFormat(compression)
