"""The optimizer a worker of the sharded concept holds: the user's class, its state in shards.

The update runs on each worker's shard (:class:`.exchange.ShardedExchange` builds the user's class over
views of it, :func:`..shardstate.shard_optimizer`); what the user and the trainer hold is an instance of
a subclass of the user's class (as Horovod's ``DistributedOptimizer`` subclasses it) with the model's
parameter groups and no state of its own, so that ``isinstance`` checks and LR schedulers work. Its
``state_dict()`` and ``load_state_dict()`` speak the class's own format for the whole model, so a
checkpoint is whole and a resume at another worker count reshards it.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from typing import Any, NoReturn, Protocol, overload

import torch


class Shards(Protocol):
    """What the optimizer asks of the :class:`.exchange.ShardedExchange` that holds the shards (a protocol: the
    exchange imports this module)."""

    params: list[torch.Tensor]

    def step(self) -> None: ...

    def gather_state(self, root: int = 0) -> list[dict[str, Any]]: ...

    def reshard(self, state: dict[torch.Tensor, Any]) -> None: ...


class _Sharded(torch.optim.Optimizer):
    """What :func:`sharded_optimizer` adds to the user's optimizer class."""

    _exchange: Shards

    @overload
    def step(self, closure: None = None) -> None: ...

    @overload
    def step(self, closure: Callable[[], float]) -> NoReturn: ...

    def step(self, closure: Callable[[], float] | None = None) -> None:
        """The update: clipping over the shards, each shard's step, the parameters gathered (collective)."""
        if closure is not None:
            raise RuntimeError("--strategy sharded: step(closure) is not supported; compute the loss before step()")
        self._exchange.step()

    def state_dict(self) -> dict[str, Any]:
        """The class's own ``state_dict`` for every parameter, gathered from every worker's shard onto the main
        rank (rank 0; elsewhere the groups without state): a collective over the workers (every worker calls it
        at the same point), that holds the whole state on the main rank alone."""
        held = self.state
        self.state = defaultdict(dict)
        for p, st in zip(self._exchange.params, self._exchange.gather_state(), strict=True):  # communication
            if st:
                self.state[p] = st
        try:
            return super().state_dict()
        finally:
            self.state = held  # a worker holds only its shard's, in the shard optimizers

    def groups_state_dict(self) -> dict[str, Any]:
        """The class's own ``state_dict`` with no state, its parameter groups alone (no communication): a
        checkpoint of one file per shard keeps the state in the shards' files."""
        return super().state_dict()  # self.state is empty: the shard optimizers hold it

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load a whole state (a checkpoint of any worker count) and keep this worker's shard of it."""
        super().load_state_dict(state_dict)
        try:
            self._exchange.reshard(self.state)
        finally:
            self.state = defaultdict(dict)


def sharded_optimizer(optimizer: torch.optim.Optimizer, exchange: Shards) -> torch.optim.Optimizer:
    """An instance of a subclass of ``optimizer``'s class sharing its parameter groups and defaults (the
    user's constructor is not run again), whose ``step()`` is ``exchange.step()``."""
    cls = type(optimizer)
    name = {"__module__": __name__, "__qualname__": f"sharded_optimizer.{cls.__name__}"}
    sub: type[_Sharded] = type(cls.__name__, (_Sharded, cls), name)
    out = object.__new__(sub)
    out.__dict__.update(optimizer.__dict__)
    out.state = defaultdict(dict)
    out._exchange = exchange
    return out
