"""The Python API for a user's own script, launched like the trainer:

    python -m launch -np 2 --script my_train.py -- --epochs 2 --strategy ps

Two levels (docs/own_model.md):

- :func:`fit` runs the trainer's own loop on a :class:`~.usertask.Task` (or a model and a pair
  of datasets): every strategy, engine and concept, checkpoints and ``--resume``, the watchdog,
  preemption, stragglers, TensorBoard and metrics.json, as ``python -m allreduce_train train``.
- :func:`init` gives a script with its own loop the exchange itself, as Horovod's ``hvd.init()``
  and ``hvd.DistributedOptimizer`` do: a :class:`Communicator` with the rank, the worker count,
  :meth:`Communicator.distributed_optimizer` (parameters and optimizer state broadcast from rank
  0, gradients averaged over the workers in ``step()``), sums for metrics, the sharded sampler, and
  the stop vote of preemption (:meth:`Communicator.stop_requested`).

Both run on the job's core (job.py), as the command line does.

Settings are the trainer's flags with ``_`` for ``-`` (``batch_size=32``, ``strategy="ps"``,
``ps_placement="colocated"``, ``compression="fp16"``); ``argv`` (e.g. ``sys.argv[1:]``) is read
as the trainer's command line and overrides them, so the launcher's restarts (``--max-restarts``
adds ``--resume auto``) reach a script that passes its arguments on.
"""

from __future__ import annotations

import sys
from typing import Any, NoReturn

import torch

__all__ = ["Communicator", "DistributedOptimizer", "fit", "init"]


def _reference(obj: Any) -> str:
    """A name for run directories and the checkpoint's model field, e.g. ``__main__:GPT``."""
    module = getattr(obj, "__module__", None) or "script"
    name = getattr(obj, "__qualname__", None) or type(obj).__qualname__  # an instance: its class
    if not all(part.isidentifier() for part in name.split(".")):  # a lambda, a class defined in a function
        name = "model"
    return f"{module}:{name}"


def fit(
    model: Any = None,
    data: Any = None,
    *,
    task: Any = None,
    optimizer: Any = None,
    argv: list[str] | None = None,
    **settings: Any,
) -> dict[str, Any] | None:
    """Train with the trainer's own loop; every rank of the job calls it alike.

    ``model``: an ``nn.Module`` or a callable returning one; ``data``: ``(train, eval)`` map-style
    datasets of (input, target) pairs, or a callable returning them -- classification by
    cross-entropy. Or ``task``: an :class:`allreduce_train.Task` for anything else. ``optimizer``: a
    name (``"adamw"``, as ``--optimizer``) or a callable taking the model's parameter groups and
    returning a ``torch.optim.Optimizer`` (the task's own ``optimizer()`` wins). ``argv``: the
    trainer's flags (``sys.argv[1:]``); ``settings``: the same by name (``epochs=2``).

    Returns the run's result (metrics.json's content) on the main rank (global rank 0), None on
    every other rank. A fault ends the process as the command line does
    (SystemExit with docs/faults.md's codes: 2 bad input, 65 diverged, 69 stalled, 75 preempted),
    after one line from the lowest failing rank.
    """
    from . import job
    from .usertask import Task

    if isinstance(optimizer, str):
        settings = {"optimizer": optimizer, **settings}
        optimizer = None
    elif optimizer is not None and not callable(optimizer):
        raise TypeError(f"fit(optimizer=...): got a {type(optimizer).__name__}; pass a name or a callable(groups)")
    if task is None:
        if model is None or data is None:
            raise TypeError("fit(): pass model= and data=, or task=")
        task = Task(model=model, data=data, optimizer=optimizer)
        label = _reference(model)
    elif not isinstance(task, Task):
        raise TypeError(f"fit(task=...): got a {type(task).__name__}; pass an allreduce_train.Task")
    else:
        label = _reference(type(task))
        if optimizer is not None:
            task._optimizer = optimizer  # read when the trainer builds the optimizer (Task.checked_optimizer)
    code, result = job.run(job.configure(argv, {"model": label, **settings}), task)
    if code:
        job.exit(code)
    return result if result is not None and result.get("is_main") else None


class DistributedOptimizer(torch.optim.Optimizer):
    """An optimizer whose ``step()`` first waits for this step's gradients averaged over the workers
    (started from the gradient hooks during backward), then updates: Horovod's
    ``DistributedOptimizer``. Made by :meth:`Communicator.distributed_optimizer`.

    Like Horovod's, the object is an instance of a subclass of *your* optimizer's class sharing its
    parameter groups and state, so ``isinstance(opt, torch.optim.AdamW)``, torch's
    ``lr_scheduler`` classes and ``torch.nn.utils.clip_grad_norm_`` work on it as on the original.

    Call :meth:`zero_grad` before each backward, as usual: it also tells the exchange whether the
    coming step's gradients travel (local SGD, DiLoCo and PowerSGD decide that per step)."""

    _schedule: Any
    _model: torch.nn.Module
    optimizer: torch.optim.Optimizer  # the engine's optimizer that applies the update
    steps: int  # updates applied so far
    _begun: bool
    _synced: bool

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise TypeError("DistributedOptimizer: made by Communicator.distributed_optimizer(model, optimizer)")

    @classmethod
    def wrap(cls, schedule: Any, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> DistributedOptimizer:
        """``optimizer``'s class with this one's methods first; the new object shares the parameter
        groups, the state and the defaults with ``optimizer`` (a shallow copy of its attributes), so
        an LR scheduler's changes to ``param_groups`` reach the update."""
        base = type(optimizer)
        made: Any = type(f"Distributed{base.__name__}", (cls, base), {})
        opt = made.__new__(made)
        opt.__dict__.update(optimizer.__dict__)
        opt._schedule, opt._model, opt.optimizer = schedule, model, optimizer
        opt.steps = 0
        opt._begun = opt._synced = False
        return opt

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.optimizer.zero_grad(set_to_none=set_to_none)
        self._schedule.begin(self.steps + 1)
        self._begun = True

    def synchronize(self) -> None:
        """Wait for the averaged gradients to be in ``.grad`` (clip after it, then :meth:`step`)."""
        self._schedule.synchronize()  # communication: this step's gradients, averaged over the workers
        self._synced = True

    def step(self, closure: Any = None) -> Any:
        if closure is not None:
            raise ValueError("DistributedOptimizer.step(): a closure would re-run backward without the exchange")
        if not self._begun:
            raise RuntimeError("DistributedOptimizer: call zero_grad() before each backward (it starts the step)")
        if not self._synced:
            self.synchronize()
        self.steps += 1
        self._schedule.apply(self.optimizer, self._model, self.steps)  # local SGD, DiLoCo: and the period's average
        self._begun = self._synced = False
        return None

    def state_dict(self) -> dict[str, Any]:
        return self.optimizer.state_dict()  # the parameter server's: fetched from the servers

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.optimizer.load_state_dict(state_dict)


class Communicator:
    """The job's exchange for a script with its own loop (:func:`init`)."""

    def __init__(self, exchange: Any, cfg: Any) -> None:
        from .distributed import make_schedule

        self._ex, self.config = exchange, cfg
        self._schedule = make_schedule(cfg.exchange, exchange)  # the wire format and schedule of the settings

    @property
    def rank(self) -> int:
        """This process's global rank."""
        return self._ex.rank

    @property
    def size(self) -> int:
        """Every process of the job, servers included."""
        return self._ex.size

    @property
    def num_workers(self) -> int:
        """The processes that train (scale the learning rate and the data by this)."""
        return self._ex.num_workers

    @property
    def worker_index(self) -> int:
        """This worker's index among the workers: which shard of the data it reads."""
        return self._ex.worker_index

    @property
    def is_main(self) -> bool:
        """Global rank 0: the one that writes logs and checkpoints."""
        return self._ex.is_main

    @property
    def local_rank(self) -> int:
        """This process's rank on its host (pin a GPU to it)."""
        return self._ex.local_rank

    def distributed_optimizer(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> DistributedOptimizer:
        """Broadcast rank 0's parameters and optimizer state to every worker and wrap ``optimizer`` so
        that its ``step()`` applies the gradient averaged over the workers. Call it once, after the
        model is on its device and before the first backward."""
        # communication: rank 0's parameters and optimizer state to every worker; the exchange's hooks
        return DistributedOptimizer.wrap(self._schedule, model, self._schedule.prepare(model, optimizer))

    def shard(self, dataset: Any, batch_size: int, seed: int = 0, data_workers: int = 0):
        """This worker's batches of a map-style dataset (``.batches(epoch)`` yields collated batches,
        ``.steps_per_epoch``): the global batch ``batch_size`` x workers in one order fixed by
        (seed, epoch), the same one the trainer uses."""
        from .data.indexed import DatasetBatches

        return DatasetBatches(dataset, batch_size, self.worker_index, self.num_workers, seed, workers=data_workers)

    def sum(self, values: torch.Tensor) -> torch.Tensor:
        """Element-wise sum of a small CPU tensor over the workers (metrics)."""
        return self._ex.sum_over_workers(values.detach().to("cpu", torch.float64))  # communication

    def mean(self, values: torch.Tensor) -> torch.Tensor:
        """Element-wise mean over the workers (a loss to log: the global figure, not rank 0's)."""
        return self.sum(values) / self.num_workers

    def broadcast_object(self, obj: Any, root: int = 0) -> Any:
        """A picklable object from ``root`` to every rank."""
        return self._ex.broadcast_object(obj, root)  # communication

    def whole_parameters(self, model: torch.nn.Module) -> None:
        """Make ``model``'s parameters whole on every worker before you read them (``state_dict()`` for a
        checkpoint or a dump): under ``--strategy sharded --shard-stage 3`` each worker holds only its shard
        between training steps, and this gathers them (a collective: every worker calls it); elsewhere it
        does nothing. The next training step shards them again."""
        self._ex.whole_parameters(model)  # communication where the parameters are sharded

    def stop_requested(self) -> bool:
        """Whether a stop signal (SIGTERM, SIGUSR1: preemption, docs/faults.md) reached any worker:
        the same answer on every worker, so all of them stop after the same step. Every worker calls
        it at the same point of the loop (after ``step()``, every step or every N); when it says so,
        write your checkpoint and call :meth:`exit_preempted`. :func:`init` records the signals
        instead of dying of them, as the trainer does: a loop that never asks runs on until the
        launcher's ``--grace-period`` is out (exit 143, nothing saved)."""
        from . import preempt

        flag = torch.tensor([float(bool(preempt.requested()))])
        return bool(self.sum(flag).item() > 0)  # communication: every worker's flag, one 8-byte sum

    def exit_preempted(self, step: int) -> NoReturn:
        """End this worker after :meth:`stop_requested` said so and your checkpoint is written: the
        main rank prints ``preempted (SIGUSR1) after step S``, the process group is left, and the
        process exits 75 (EX_TEMPFAIL: a scheduler requeues it; start again from your checkpoint).
        Every worker calls it."""
        from . import job, preempt
        from .errors import EXIT_PREEMPTED

        if self.is_main:
            signame = preempt.requested() or "a signal to another rank"
            print(f"allreduce_train: preempted ({signame}) after step {step}", file=sys.stderr, flush=True)
        # communication: every worker waits here for the main one, whose checkpoint is written and whose
        # line is out by now (mpirun ends the whole job as soon as one rank exits non-zero)
        self.sum(torch.zeros(1))
        self.close()
        job.exit(EXIT_PREEMPTED)

    def close(self) -> None:
        """Leave the process group (every rank, at the end)."""
        self._ex.close()


def init(argv: list[str] | None = None, **settings: Any) -> Communicator:
    """Form the process group of ``settings`` (the trainer's exchange flags: ``strategy``,
    ``allreduce_engine``, ``compression``, ``ps_placement``, ...) and return the :class:`Communicator`.

    With a dedicated parameter server (``strategy="ps"``, ``ps_placement="dedicated"``) the server
    ranks serve inside this call until the workers close, then leave the process (exit 0): only
    workers return. Bad settings: one line from rank 0, exit 2.
    """
    from . import job

    cfg = job.configure(argv, settings)
    ex = job.connect(cfg)
    if not ex.is_worker:
        ex.serve()
        ex.close()
        job.exit(0)
    return Communicator(ex, cfg)
