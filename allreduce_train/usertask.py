"""Your own model, data, loss and evaluation under the trainer: the public :class:`Task`.

A :class:`Task` is the unit a user hands the trainer (``--task MODULE:CALLABLE``, or
:func:`allreduce_train.fit`); ``--model MODULE:CALLABLE`` with ``--dataset MODULE:CALLABLE`` is the
same with the defaults: classification by cross-entropy, evaluation loss and accuracy -- which is also
how the registered image models train (:func:`.tasks.make_task`). :class:`TaskAdapter` gives a Task
the trainer's interface (:mod:`.tasks`), with the data sharded by index (:mod:`.data.indexed`; tensors
in memory, as the built-in image sets are, by one gather per batch in the same order).

What a task must satisfy (docs/own_model.md): ``build_model`` builds the same parameters on every
rank for the same seed (the trainer seeds torch before calling it, and broadcasts rank 0's anyway);
``datasets`` returns map-style datasets of (input, target) pairs that every rank reads alike
(index ``i`` is the same sample everywhere); ``loss`` is a mean over the batch, so that averaging
over workers gives the mean over the global batch; ``eval_sums`` returns *sums* over a batch, added
over batches and workers before ``eval_metrics`` divides.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from .data.images import ShardedBatches, TensorDataset, eval_shard
from .data.indexed import DatasetBatches, EvalPart, check_map_style
from .errors import ConfigError, UserError


class Task:
    """A model, its data, its loss and its evaluation. Subclass it and override what differs; the
    defaults are classification (cross-entropy; ``eval/loss`` and ``eval/accuracy``).

    Either pass ``model`` (an ``nn.Module`` or a callable returning one) and ``data`` (a pair of
    map-style datasets ``(train, eval)`` or a callable returning it), or override
    :meth:`build_model` and :meth:`datasets`.
    """

    words_per_sample: int = 0  #: tokens per sample, for a words/s figure (language models); 0 = none
    note: str = ""  #: a line for the run's log and TensorBoard about the data

    def __init__(self, model: Any = None, data: Any = None, optimizer: Any = None) -> None:
        """``optimizer``: a callable taking the model's parameter groups and returning a
        ``torch.optim.Optimizer`` (e.g. ``lambda groups: torch.optim.AdamW(groups, lr=3e-4)``)."""
        self._model, self._data, self._optimizer = model, data, optimizer

    def build_model(self) -> torch.nn.Module:
        """The model, built on every rank (the trainer seeds torch first)."""
        if self._model is None:
            raise NotImplementedError("Task: pass model= or override build_model()")
        return self._model() if callable(self._model) and not isinstance(self._model, torch.nn.Module) else self._model

    def datasets(self) -> tuple[Any, Any]:
        """``(train, eval)``: map-style datasets (``len()`` and ``[i]``) of (input, target) pairs."""
        if self._data is None:
            raise NotImplementedError("Task: pass data= or override datasets()")
        return self._data() if callable(self._data) else self._data

    def loss(self, model: torch.nn.Module, inputs: Any, targets: Any) -> torch.Tensor:
        """The mean loss over this batch (a scalar tensor that backward starts from)."""
        return F.cross_entropy(model(inputs), targets)

    def eval_sums(self, model: torch.nn.Module, inputs: Any, targets: Any) -> dict[str, float]:
        """Sums over one evaluation batch, by name; the same names for every batch. They are added
        over batches and workers and handed to :meth:`eval_metrics`."""
        logits = model(inputs)
        return {
            "loss": F.cross_entropy(logits, targets, reduction="sum").item(),
            "correct": (logits.argmax(-1) == targets).sum().item(),
            "count": len(targets),
        }

    def eval_metrics(self, sums: dict[str, float]) -> dict[str, float]:
        """The figures (logged as ``eval/<name>``; ``--target eval/<name>>=X`` stops on one) from the sums."""
        return {"loss": sums["loss"] / sums["count"], "accuracy": sums["correct"] / sums["count"]}

    def optimizer(self, model: torch.nn.Module) -> torch.optim.Optimizer | None:
        """This task's own optimizer over ``model``'s parameters, or None for the one the flags name
        (``--optimizer``, ``--lr``, ``--weight-decay``, ...; or ``Task(optimizer=...)``'s callable).
        Every concept runs it: the parameter server's servers run the same class on their shard. The
        LR schedule scales each group's LR every step."""
        return None

    def start_epoch(self, epoch: int) -> None:
        """Called on every worker before the first step of each epoch (and of a resumed epoch)."""

    def state_dict(self) -> dict[str, Any]:
        """This worker's state beyond the model (checkpointed per worker; a resume gets it back)."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` (a resumed run, before its first step)."""


class TaskAdapter:
    """A :class:`Task` with the built-in tasks' interface (:class:`.tasks.Task`), which the trainer uses."""

    def __init__(self, task: Task, flag: str, cfg: Any) -> None:
        self.task, self.flag, self.cfg = task, flag, cfg
        self.words_per_sample = int(getattr(task, "words_per_sample", 0) or 0)
        self.note = str(getattr(task, "note", "") or "")
        self.keys: list[str] | None = None  # the names of eval_sums, fixed by the first batch

    def _call(self, what: str, fn: Callable[..., Any], *args: Any) -> Any:
        try:
            return fn(*args)
        except UserError:
            raise
        except NotImplementedError as e:
            raise ConfigError(f"{self.flag}: {e}") from None
        except Exception as e:  # the user's code failed while setting up: one line, no traceback
            raise ConfigError(f"{self.flag}: {what} raised {type(e).__name__}: {e}") from None

    def data(self, rank: int, num_shards: int) -> tuple[DatasetBatches | ShardedBatches, EvalPart | TensorDataset]:
        cfg = self.cfg
        pair = self._call("datasets()", self.task.datasets)
        if not (isinstance(pair, (tuple, list)) and len(pair) == 2):
            raise ConfigError(
                f"{self.flag}: the datasets are a {type(pair).__name__}; return a pair (train dataset, eval dataset)"
            )
        train_set, eval_set = pair
        check_map_style(self.flag, "training", train_set)
        check_map_style(self.flag, "evaluation", eval_set)
        k = cfg.exchange.backward_passes_per_step
        batches: DatasetBatches | ShardedBatches
        if isinstance(train_set, TensorDataset):  # tensors in memory: a batch is one gather, in the same order
            batches = ShardedBatches(train_set, cfg.data.batch_size * k, rank, num_shards, cfg.train.seed)
        else:
            batches = DatasetBatches(
                train_set, cfg.data.batch_size * k, rank, num_shards, cfg.train.seed, workers=cfg.data.data_workers
            )
        if batches.steps_per_epoch == 0:
            raise ConfigError(
                f"{self.flag}: {len(train_set)} training samples are fewer than one global batch "
                f"({num_shards} workers x --batch-size {cfg.data.batch_size} x {k} passes); "
                "use fewer ranks (-np) or a smaller --batch-size"
            )
        if len(eval_set) < num_shards:
            raise ConfigError(
                f"{self.flag}: {len(eval_set)} evaluation samples for {num_shards} workers; use fewer ranks (-np)"
            )
        if isinstance(eval_set, TensorDataset):  # slices of the tensors: the same batches as EvalPart's
            return batches, eval_shard(eval_set, rank, num_shards)
        return batches, EvalPart(eval_set, rank, num_shards)

    def build_model(self) -> torch.nn.Module:
        model = self._call("building the model", self.task.build_model)
        if not isinstance(model, torch.nn.Module):
            raise ConfigError(f"{self.flag}: the model returned a {type(model).__name__}; return a torch.nn.Module")
        if not any(p.requires_grad for p in model.parameters()):
            raise ConfigError(f"{self.flag}: the model has no trainable parameters")
        return model

    def check(self, model: torch.nn.Module, inputs: Any, targets: Any) -> None:
        """One batch through the model and the loss before any rank trains: a model whose output does
        not fit the loss fails here with one line, not inside the first step. It leaves no trace:
        evaluation mode (no BatchNorm statistics move), no gradients, the RNG and the task's state restored."""
        was_training, saved = model.training, copy.deepcopy(self.task.state_dict())
        model.eval()
        try:
            with torch.no_grad(), torch.random.fork_rng(devices=[]):
                loss = self.task.loss(model, inputs, targets)
        except Exception as e:
            raise ConfigError(
                f"{self.flag}: the loss on one training batch (inputs {_shape(inputs)}, targets "
                f"{_shape(targets)}) raised {type(e).__name__}: {e}"
            ) from None
        finally:
            model.train(was_training)
            self.task.load_state_dict(saved)  # the check's call of loss() counts for nothing
        if not (isinstance(loss, torch.Tensor) and loss.numel() == 1 and loss.is_floating_point()):
            raise ConfigError(
                f"{self.flag}: the loss is {_shape(loss)}; return a scalar floating-point tensor "
                "(the mean over the batch)"
            )

    def optimizer(self, model: torch.nn.Module) -> torch.optim.Optimizer | None:
        """The task's own optimizer, checked (a callable that raises or returns no Optimizer: one line)."""
        from .optim import check_optimizer

        made = self._call("optimizer()", self.task.optimizer, model)
        if made is not None:
            return check_optimizer(f"{self.flag}: optimizer()", made, model)
        make = getattr(self.task, "_optimizer", None)  # Task(optimizer=fn), fit(optimizer=fn)
        if make is None:
            return None
        from .optim import callable_groups

        made = self._call("optimizer=", make, callable_groups(self.cfg.optim, model))
        return check_optimizer(f"{self.flag}: optimizer=", made, model)

    def start_epoch(self, epoch: int) -> None:
        self.task.start_epoch(epoch)

    def state_dict(self) -> dict[str, Any]:
        return self.task.state_dict()

    def load_state_dict(self, state: dict[str, Any], device: torch.device | None = None) -> None:
        self.task.load_state_dict(state)

    def loss(self, model: torch.nn.Module, x: Any, y: Any, rows: slice) -> torch.Tensor:
        return self.task.loss(model, x, y)

    def eval_sums(
        self, model: torch.nn.Module, part: EvalPart | TensorDataset, device: torch.device, batch_size: int
    ) -> torch.Tensor:
        totals: dict[str, float] = {}
        for x, y in part.batches(batch_size):
            sums = self.task.eval_sums(model, _to(x, device), _to(y, device))
            for name, v in sums.items():
                totals[name] = totals.get(name, 0.0) + float(v)
        if self.keys is None:
            self.keys = sorted(totals)
        if sorted(totals) != self.keys and totals:
            raise ValueError(
                f"{self.flag}: eval_sums returned {sorted(totals)}, earlier {self.keys}: return the "
                "same names every time"
            )
        return torch.tensor([totals.get(name, 0.0) for name in self.keys], dtype=torch.float64)

    def eval_metrics(self, totals: torch.Tensor) -> dict[str, float]:
        sums = dict(zip(self.keys or [], totals.tolist(), strict=False))
        return {
            name if name.startswith("eval/") else f"eval/{name}": float(v)
            for name, v in self.task.eval_metrics(sums).items()
        }


def _to(x: Any, device: torch.device) -> Any:
    return x.to(device, non_blocking=True) if isinstance(x, torch.Tensor) else x


def _shape(x: Any) -> str:
    if isinstance(x, torch.Tensor):
        return f"a tensor of shape {tuple(x.shape)} ({x.dtype})"
    return f"a {type(x).__name__}"
