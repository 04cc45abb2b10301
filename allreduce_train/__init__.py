"""allreduce_train: data-parallel PyTorch training, ring allreduce (Horovod, an MPI ring) or a
parameter server behind one trainer, launched with mpirun (``python -m launch``).

The public surface (everything else may change between versions):

- :func:`fit` -- train your model and data, or your :class:`Task`, with the trainer's own loop.
- :class:`Task` -- your model, data, loss, evaluation and per-worker state (subclass it).
- :func:`init` -- the exchange for a script with its own loop: a :class:`Communicator`.
- :class:`Communicator` -- rank, worker count, ``distributed_optimizer``, ``shard``, ``sum``/``mean``,
  ``stop_requested``/``exit_preempted`` (preemption).
- :class:`DistributedOptimizer` -- an optimizer whose ``step()`` applies the averaged gradient.

The command line: ``python -m allreduce_train train|models`` (docs/training.md); your own code
there: ``--model MODULE:CALLABLE``, ``--dataset MODULE:CALLABLE``, ``--task MODULE:CALLABLE``
(docs/own_model.md). ``import allreduce_train`` stays light: the names above load on first use.
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"

__all__ = ["Communicator", "DistributedOptimizer", "Task", "fit", "init"]

_HOMES = {"Communicator": "api", "DistributedOptimizer": "api", "fit": "api", "init": "api", "Task": "usertask"}


def __getattr__(name: str) -> Any:
    """Load a public name on first use (torch is imported then, not by ``import allreduce_train``)."""
    if name in _HOMES:
        import importlib

        value = getattr(importlib.import_module(f".{_HOMES[name]}", __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
