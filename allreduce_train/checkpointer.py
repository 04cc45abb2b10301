"""The run's checkpoint owner (torchtitan's ``CheckpointManager``): what a checkpoint holds, when it is
written, and how a run resumes from it. Each stateful object saves and loads itself through its
``state_dict``/``load_state_dict``; the training loop only says when (:meth:`Checkpointer.due`,
:meth:`Checkpointer.save`).

A checkpoint is one file (:mod:`.checkpoint` writes it atomically and keeps what ``--keep-checkpoints``
and ``--keep-best`` ask), a dict of:

* ``model`` and ``optimizer``: whole, on the main rank, through the exchange's one door
  (:meth:`~.distributed.base.GradientExchange.model_state_dict` and ``optimizer_state_dict``): the
  parameter servers' float32 master parameters; where the exchange's ``optimizer_shard`` gives one (the
  sharded concept on the mpi and Horovod engines) each worker writes its shard of the optimizer state to
  a file of its own (:func:`.checkpoint.shard_file`) and ``optimizer`` holds the parameter groups and
  those files' names (:func:`.checkpoint.load` joins them), so no worker gathers the whole state;
* ``step``: the data position as well (each epoch's shard order follows from the seed and the epoch;
  the step says where in it), ``config`` (a resumed run must keep the model, task and batch size),
  ``lr_schedule`` (described: the LR follows from it and the step), ``precision`` (the loss scaler's
  scale), ``best`` (:class:`.checkpoint.Kept`'s best evaluation so far);
* ``workers``: one :class:`.checkpoint.WorkerState` per worker, by worker index: its RNG, its task's
  state (an LSTM's hidden state), its wire format's residuals (PowerSGD's error feedback) and its
  schedule's own state (local SGD, DiLoCo, Adasum).

A resume runs in two halves: :meth:`Checkpointer.load` while the run is built (the main rank reads the
file into the model and the optimizer, which the exchange's ``prepare`` then gives every worker), and
:meth:`Checkpointer.restore` once the exchange is prepared (every worker gets the step, the loss
scale, the best so far and its own part).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from .checkpoint import CHECKPOINT_NAME, Kept, WorkerState, init_weights, load, save, shard_file
from .errors import ConfigError, Diverged

if TYPE_CHECKING:
    from .config import Config
    from .distributed.base import GradientExchange
    from .distributed.schedules import Sync
    from .optim import LRSchedule
    from .precision import Precision
    from .run_logger import NullLogger
    from .usertask import Batches


@dataclass
class Parts:
    """The run's stateful objects that a checkpoint holds, once the exchange has prepared them."""

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer  # the schedule's prepare() returned it: the one that steps and is saved
    schedule: Sync  # with its wire format (``schedule.wire``: PowerSGD's residuals)
    task: Any
    precision: Precision
    lr_schedule: LRSchedule
    batches: Batches  # its steps_per_epoch: where a step lies in the data, and the default cadence
    device: torch.device


class Checkpointer:
    """Loads, restores and saves a run's checkpoints and decides when (``--resume``, ``--init-from``,
    ``--checkpoint-every``, ``--keep-checkpoints``, ``--keep-best``). ``agree`` makes the model whole and
    alike on every worker before it is saved (the trainer's :meth:`~.trainer.Trainer.agree_buffers`)."""

    def __init__(
        self, cfg: Config, ex: GradientExchange, run_dir: str, agree: Callable[[torch.nn.Module], None]
    ) -> None:
        self.cfg, self.ex, self.agree = cfg, ex, agree
        # the checkpoints kept besides the latest: step checkpoints, the best evaluation
        self.kept = Kept(run_dir, cfg.run.keep_checkpoints, cfg.train.target if cfg.run.keep_best else "")
        self.path = os.path.join(run_dir, CHECKPOINT_NAME) if cfg.run.resume == "auto" else cfg.run.resume
        self.parts: Parts | None = None  # restore() attaches them
        self.every = cfg.run.checkpoint_every  # restore() makes 0 (the default) once an epoch
        self.read: dict[str, Any] = {}  # what load() read on the main rank for restore(): workers, precision
        self.task_state: Any = None  # this worker's saved task state, until its epoch starts (resume_task)

    # ---------------------------------------------------------------- resuming
    def load(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> int:
        """While the run is built, on the main rank: ``--resume``'s checkpoint into ``model`` and ``optimizer``
        (the exchange's ``prepare`` gives them to every worker) and the step to continue from; or
        ``--init-from``'s weights alone (fine-tuning). 0 on the other ranks and for a fresh run."""
        cfg = self.cfg
        if not self.ex.is_main:
            return 0
        # --resume auto with nothing saved yet starts fresh: the same command line serves the first
        # run and every restart after a preemption
        if cfg.run.resume and (cfg.run.resume != "auto" or os.path.isfile(self.path)):
            state = load(self.path)
            self._check_config(state["config"])
            model.load_state_dict(state["model"])
            self._load_optimizer(optimizer, state["optimizer"])
            self.read = {"workers": state.get("workers"), "precision": state.get("precision")}
            self.kept.load_state_dict(state)
            return int(state["step"])
        if cfg.run.init_from:
            init_weights(model, cfg.run.init_from)
        return 0

    def _check_config(self, saved: dict[str, Any]) -> None:
        cfg = self.cfg
        for section, key in (("model", "model"), ("model", "task"), ("data", "batch_size")):
            if saved[section].get(key, "") != getattr(getattr(cfg, section), key):
                raise ConfigError(
                    f"--resume {self.path}: checkpoint has {section}.{key}={saved[section].get(key, '')!r}, "
                    f"this run {getattr(getattr(cfg, section), key)!r}; run with the same value"
                )

    def _load_optimizer(self, optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> None:
        initial = [g["initial_lr"] for g in optimizer.param_groups]
        try:
            optimizer.load_state_dict(state)
        except (ValueError, KeyError) as e:
            raise ConfigError(
                f"--resume {self.path}: the checkpoint's optimizer state does not fit this run's optimizer "
                f"({type(optimizer).__name__}, {len(optimizer.param_groups)} group(s)): {e}; resume with the "
                "saved run's --optimizer and --decay-norm-bias setting"
            ) from None
        for group, lr in zip(optimizer.param_groups, initial, strict=True):
            group["initial_lr"] = lr  # this run's --lr (the schedule scales it), not the saved run's

    def restore(self, parts: Parts, start: int, log: NullLogger) -> int:
        """Every worker, once the exchange has prepared ``parts``: the step to continue from (``start``:
        the main rank's, from :meth:`load`), the loss scale, the best evaluation so far and this worker's
        own state (collective over the workers). With another worker count than the checkpoint's (an
        elastic restart) the per-worker state starts afresh, and the log says what changed."""
        self.parts = p = parts
        self.every = self.cfg.run.checkpoint_every or p.batches.steps_per_epoch
        ex = self.ex
        step = ex.broadcast_object(start)  # communication: the resumed step, from rank 0
        resumed = ex.broadcast_object(self.read.get("workers"))  # communication: each worker's saved state
        if p.precision.scaler is not None:
            p.precision.load_state_dict(ex.broadcast_object(self.read.get("precision")))  # communication: the scale
        self.kept.best = ex.broadcast_object(self.kept.best)  # communication: a resumed run's best evaluation
        self.read = {}
        if resumed and len(resumed) == ex.num_workers:
            self._load_worker_state(WorkerState.from_dict(resumed[ex.worker_index], self.cfg.run.resume))
        elif resumed:
            old, new = len(resumed), ex.num_workers
            cfg = self.cfg
            batch = cfg.data.batch_size * cfg.exchange.backward_passes_per_step
            log.message(
                f"elastic: resumed with {new} workers from a checkpoint of {old}: global batch "
                f"{old * batch} -> {new * batch}, LR {p.lr_schedule.lr(step, cfg.optim.lr, old):g} -> "
                f"{p.lr_schedule.lr(step, cfg.optim.lr, new):g}; RNG and task state start afresh"
            )
        return step

    def _load_worker_state(self, mine: WorkerState) -> None:
        p = self._parts()
        torch.set_rng_state(mine.rng)
        if mine.cuda_rng is not None and p.device.type == "cuda":
            torch.cuda.set_rng_state(mine.cuda_rng)
        self.task_state = mine.task  # the task takes it when its epoch has started (resume_task)
        if p.schedule.state_key in mine.schedule:
            p.schedule.load_state_dict(mine.schedule[p.schedule.state_key], p.model, p.optimizer)
        p.schedule.wire.load_state_dict(mine.exchange)

    def resume_task(self, in_epoch: int) -> None:
        """After the task's ``start_epoch`` of the run's first epoch: a run resumed mid-epoch (``in_epoch``
        steps into it) gives the task its state of the saved step; later epochs start afresh."""
        if self.task_state is not None and in_epoch:
            self._parts().task.load_state_dict(self.task_state)
        self.task_state = None

    # ---------------------------------------------------------------- saving
    def record(self, step: int, figures: dict[str, float]) -> bool:
        """An evaluation's global figures (the same on every worker, so that all decide alike): True when
        ``--keep-best`` is to write it as the best so far (:meth:`.checkpoint.Kept.record`)."""
        return self.kept.record(step, figures)

    def due(self, step: int, last: bool) -> bool:
        """Whether step ``step`` writes the latest checkpoint: every ``--checkpoint-every`` steps (once an
        epoch by default) and at the run's ``last`` step (its end, ``--exit-after-steps``, a target reached,
        a stop signal)."""
        return step % self.every == 0 or last

    def save(self, step: int, latest: bool = True, best: bool = False) -> None:
        """Write the checkpoint of step ``step`` as the latest and/or as the best evaluation so far
        (collective over the workers; the main rank writes). Every worker checks its own copy of the
        parameters first (identical, so all decide alike): a diverged model raises :class:`Diverged`
        and never replaces the last good checkpoint."""
        p = self._parts()
        self.agree(p.model)
        for name, param in p.model.named_parameters():
            if not _finite(param):
                raise Diverged(step, f"parameter {name}", param[~torch.isfinite(param)].flatten()[0].item())
        mine, shards = self.ex.optimizer_shard(p.optimizer), None
        if mine is not None:  # the sharded concept: each worker writes its own shard of the optimizer state
            ex = self.ex
            shards = [shard_file(step, r, ex.size) for r in range(ex.size)]
            save(os.path.join(self.kept.run_dir, shards[ex.rank]), mine)
        state = self.state_dict(step, shards)  # (its gather: every shard is written before the manifest)
        if state is not None:
            self.kept.write(state, latest, best)
            if shards is not None:
                self.kept.prune_shards(step, shards)  # the old ones, once the new manifest is in place

    def state_dict(self, step: int, shards: list[str] | None = None) -> dict[str, Any] | None:
        """The checkpoint of step ``step`` on the main rank, None elsewhere (collective over the workers).
        ``shards``: the files under the run directory that hold the optimizer's state, one per worker
        (written already; the checkpoint is their manifest), instead of the state gathered here."""
        p = self._parts()
        # communication: every worker's own state, so that a resumed run continues bit-exactly mid-epoch
        # (dropout masks, the text's state, the wire's residuals); the optimizer's state where it is
        # sharded (the sharded concept gathers the model's there too: before model_state_dict)
        workers = self.ex.gather_from_workers(self.worker_state().to_dict())
        if shards is None:
            optimizer_state = self.ex.optimizer_state_dict(p.optimizer)
        else:
            optimizer_state = {**self.ex.optimizer_groups(p.optimizer), "shards": shards}
        if not self.ex.is_main:
            return None
        return {
            "model": self.ex.model_state_dict(p.model),  # the parameter servers' master copy where they hold it
            "optimizer": optimizer_state,
            "step": step,
            "config": self.cfg.to_dict(),
            "workers": workers,
            "lr_schedule": p.lr_schedule.describe(),  # the LR follows from it and the step
            "precision": p.precision.state_dict(),  # 16-mixed: the loss scaler's scale
        }

    def worker_state(self) -> WorkerState:
        """This worker's part of the checkpoint."""
        p = self._parts()
        sch = p.schedule
        return WorkerState(
            torch.get_rng_state(),
            p.task.state_dict(),
            exchange=sch.wire.state_dict(),  # e.g. PowerSGD's error feedback and Qs
            # local SGD, DiLoCo: each worker's own parameters and momentum between averagings
            schedule={sch.state_key: sch.state_dict(p.model, p.optimizer)} if sch.state_key else {},
            cuda_rng=torch.cuda.get_rng_state() if torch.cuda.is_available() else None,
        )

    def _parts(self) -> Parts:
        assert self.parts is not None, "restore() attaches the run's parts first"
        return self.parts


def _finite(t: torch.Tensor) -> bool:
    """Whether every element of ``t`` is finite, a million at a time: a model that fits a memory limit only
    sharded has no room for a mask of its largest parameter's size."""
    return all(bool(torch.isfinite(chunk).all()) for chunk in t.detach().reshape(-1).split(1 << 20))
