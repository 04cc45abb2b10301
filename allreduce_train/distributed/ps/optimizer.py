"""The user's optimizer on the parameter server: what the main worker sends of it, the optimizer a
worker holds, and the servers' state assembled back into the class's own format.

The servers run the optimizer itself (:class:`.server.Server` builds the class over its segments of
each bucket); a worker holds an instance of a subclass of the user's class without state
(:func:`server_side`), whose ``state_dict()`` gathers every server's slices (:func:`..shardstate.assemble`).
"""

from __future__ import annotations

import pickle
from collections import defaultdict
from collections.abc import Callable
from typing import Any, NoReturn

import torch

from ...errors import UserError
from ..shardstate import build


def describe(optimizer: torch.optim.Optimizer, params: list[torch.Tensor]) -> dict[str, Any]:
    """What the servers build the optimizer from: its class (pickled by reference: every rank imports
    the same code), each group's hyperparameters (everything but ``params``), each parameter's group
    (None: not in the optimizer; the servers leave it as it is) and each parameter's state (fresh, or
    loaded from a checkpoint), by index in ``params``. Checks first what every worker can check alike,
    before any message: one line naming the fix."""
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise UserError(f"--strategy ps runs a torch.optim.Optimizer on the servers; got a {type(optimizer).__name__}")
    index = {id(p): i for i, p in enumerate(params)}
    group_of: list[int | None] = [None] * len(params)
    for g, group in enumerate(optimizer.param_groups):
        for p in group["params"]:
            if id(p) not in index:
                raise UserError(
                    f"--strategy ps: the optimizer's group {g} holds a {tuple(p.shape)} tensor that is not "
                    "one of the model's parameters; build the optimizer over model.parameters()"
                )
            group_of[index[id(p)]] = g
    cls = type(optimizer)
    try:
        importable = pickle.loads(pickle.dumps(cls)) is cls
    except Exception:  # pickle's errors for a class it cannot name are of several types
        importable = False
    if not importable:
        raise UserError(
            f"--strategy ps sends the optimizer's class to the servers by name, and "
            f"{cls.__module__}.{cls.__qualname__} cannot be imported by name; define it at a module's top level"
        )
    build(cls, optimizer.param_groups)  # what each server will do, here where it fails before any message
    return {
        "cls": cls,
        "groups": [{k: v for k, v in g.items() if k != "params"} for g in optimizer.param_groups],
        "group_of": group_of,
        "state": {
            i: {k: v.detach().cpu() if isinstance(v, torch.Tensor) else v for k, v in st.items()}
            for i, p in enumerate(params)
            if (st := optimizer.state.get(p))
        },
    }


class _ServerSide(torch.optim.Optimizer):
    """What :func:`server_side` adds to the user's optimizer class on a worker."""

    _params: list[torch.Tensor]
    _fetch: Callable[[], list[dict[str, Any]]]

    def step(self, closure: Callable[[], float] | None = None) -> NoReturn:
        raise RuntimeError("with --strategy ps the servers update the parameters (the exchange's apply())")

    def state_dict(self) -> dict[str, Any]:
        """The class's own ``state_dict``, with the state every server holds for its segments."""
        held = self.state
        self.state = defaultdict(dict)
        for p, st in zip(self._params, self._fetch(), strict=True):  # communication: from every server
            if st:
                self.state[p] = st
        try:
            return super().state_dict()
        finally:
            self.state = held  # a worker holds none: it lives on the servers

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        raise RuntimeError(
            "with --strategy ps the optimizer's state lives on the servers: load it into the optimizer "
            "before the exchange's prepare() (Communicator.distributed_optimizer()), which sends it there"
        )


def server_side(
    optimizer: torch.optim.Optimizer, params: list[torch.Tensor], fetch: Callable[[], list[dict[str, Any]]]
) -> torch.optim.Optimizer:
    """The optimizer a worker holds: an instance of a subclass of ``optimizer``'s class (as Horovod's
    ``DistributedOptimizer`` subclasses the user's class), with its parameter groups, so that
    ``isinstance`` checks, torch's LR schedulers and clipping utilities work on it. Its ``step()``
    raises (the servers update); its ``state_dict()`` calls ``fetch`` (every server's state, by
    parameter of ``params``) and returns the class's own format over this worker's parameters
    (``torch.optim.AdamW(...).load_state_dict`` takes it)."""
    cls = type(optimizer)
    name = {"__module__": __name__, "__qualname__": f"server_side.{cls.__name__}"}
    sub: type[_ServerSide] = type(cls.__name__, (_ServerSide, cls), name)
    out = object.__new__(sub)  # the user's constructor is not run again: its groups, defaults and hooks are copied
    out.__dict__.update(optimizer.__dict__)
    out.state = defaultdict(dict)
    out._params, out._fetch = params, fetch
    return out
