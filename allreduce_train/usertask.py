"""Your own model, data, loss and evaluation under the trainer: the public :class:`Task`.

A :class:`Task` is the unit the trainer trains: a user's (``--task MODULE:CALLABLE``, or
:func:`allreduce_train.fit`), ``--model MODULE:CALLABLE`` with ``--dataset MODULE:CALLABLE`` (the
defaults: classification by cross-entropy, evaluation loss and accuracy), the registered image models
(the same defaults) and the language models (:class:`.tasks.LanguageModelTask`, a subclass); see
:func:`.tasks.make_task`. The methods a user overrides say *what* to compute; the trainer calls them
through the ones below them (:meth:`Task.shards`, :meth:`Task.checked_model`, :meth:`Task.check`,
:meth:`Task.evaluate`, ...), which shard the data by index (:mod:`.data.indexed`; tensors in memory,
as the built-in image sets are, by one gather per batch in the same order), add the evaluation sums
and turn what the user's code gets wrong into one line naming :attr:`Task.source`.

What a task must satisfy (docs/own_model.md): ``build_model`` builds the same parameters on every
rank for the same seed (the trainer seeds torch before calling it, and broadcasts rank 0's anyway);
``datasets`` returns map-style datasets of (input, target) pairs that every rank reads alike
(index ``i`` is the same sample everywhere); ``loss`` is a mean over the batch, so that averaging
over workers gives the mean over the global batch; ``eval_sums`` returns *sums* over a batch, added
over batches and workers before ``eval_metrics`` divides.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from typing import Any, Protocol

import torch
import torch.nn.functional as F

from .data.images import ShardedBatches, TensorDataset, eval_shard
from .data.indexed import DatasetBatches, EvalPart, check_map_style
from .errors import ConfigError, UserError


class Batches(Protocol):
    """A worker's training batches: ``data.images.ShardedBatches``, ``data.indexed.DatasetBatches`` or
    ``data.ptb.LMBatches``."""

    steps_per_epoch: int

    def batches(self, epoch: int, start_step: int = 0) -> Iterator[Any]:
        """(inputs, targets) of this worker for the steps ``start_step..`` of ``epoch``, in its order."""
        ...

    def sample_batch(self) -> Any:
        """One batch (inputs, targets) for :meth:`Task.check`."""
        ...


class Task:
    """A model, its data, its loss and its evaluation. Subclass it and override what differs; the
    defaults are classification (cross-entropy; ``eval/loss`` and ``eval/accuracy``).

    Either pass ``model`` (an ``nn.Module`` or a callable returning one) and ``data`` (a pair of
    map-style datasets ``(train, eval)`` or a callable returning it), or override
    :meth:`build_model` and :meth:`datasets`.
    """

    words_per_sample: int = 0  #: tokens per sample, for a words/s figure (language models); 0 = none
    note: str = ""  #: a line for the run's log and TensorBoard about the data
    #: what named this task (``fit()``, ``--task m:f``, ``--model NAME``): the trainer's error lines start with it
    source: str = "fit()"
    _optimizer: Any = None  # Task(optimizer=fn), fit(optimizer=fn): called by checked_optimizer
    _eval_names: list[str] | None = None  # the names of eval_sums, fixed by the first evaluation

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

    # The trainer's side: it calls these, which call the methods above; you need not override them.

    def _call(self, what: str, fn: Callable[..., Any], *args: Any) -> Any:
        try:
            return fn(*args)
        except UserError:
            raise
        except NotImplementedError as e:
            raise ConfigError(f"{self.source}: {e}") from None
        except Exception as e:  # the user's code failed while setting up: one line, no traceback
            raise ConfigError(f"{self.source}: {what} raised {type(e).__name__}: {e}") from None

    def shards(self, cfg: Any, rank: int, num_shards: int) -> tuple[Batches, Any]:
        """This worker's training batches (``--batch-size`` x ``--backward-passes-per-step`` rows each) and its
        share of the evaluation set (anything with ``batches(batch_size)`` for :meth:`evaluate`), from
        :meth:`datasets` (a language model cuts its text instead)."""
        pair = self._call("datasets()", self.datasets)
        if not (isinstance(pair, (tuple, list)) and len(pair) == 2):
            raise ConfigError(
                f"{self.source}: the datasets are a {type(pair).__name__}; return a pair (train dataset, eval dataset)"
            )
        train_set, eval_set = pair
        check_map_style(self.source, "training", train_set)
        check_map_style(self.source, "evaluation", eval_set)
        k = cfg.exchange.backward_passes_per_step
        batches: Batches
        if isinstance(train_set, TensorDataset):  # tensors in memory: a batch is one gather, in the same order
            batches = ShardedBatches(train_set, cfg.data.batch_size * k, rank, num_shards, cfg.train.seed)
        else:
            batches = DatasetBatches(
                train_set, cfg.data.batch_size * k, rank, num_shards, cfg.train.seed, workers=cfg.data.data_workers
            )
        if batches.steps_per_epoch == 0:
            raise ConfigError(
                f"{self.source}: {len(train_set)} training samples are fewer than one global batch "
                f"({num_shards} workers x --batch-size {cfg.data.batch_size} x {k} passes); "
                "use fewer ranks (-np) or a smaller --batch-size"
            )
        if len(eval_set) < num_shards:
            raise ConfigError(
                f"{self.source}: {len(eval_set)} evaluation samples for {num_shards} workers; use fewer ranks (-np)"
            )
        if isinstance(eval_set, TensorDataset):  # slices of the tensors: the same batches as EvalPart's
            return batches, eval_shard(eval_set, rank, num_shards)
        return batches, EvalPart(eval_set, rank, num_shards)

    def checked_model(self) -> torch.nn.Module:
        """:meth:`build_model`'s model, or one line saying why it cannot train."""
        model = self._call("building the model", self.build_model)
        if not isinstance(model, torch.nn.Module):
            raise ConfigError(f"{self.source}: the model returned a {type(model).__name__}; return a torch.nn.Module")
        if not any(p.requires_grad for p in model.parameters()):
            raise ConfigError(f"{self.source}: the model has no trainable parameters")
        return model

    def check(self, model: torch.nn.Module, inputs: Any, targets: Any) -> None:
        """One batch through the model and the loss before any rank trains: a model whose output does
        not fit the loss fails here with one line, not inside the first step. It leaves no trace:
        evaluation mode (no BatchNorm statistics move), no gradients, the RNG and the task's state restored."""
        was_training, saved = model.training, copy.deepcopy(self.state_dict())
        model.eval()
        try:
            with torch.no_grad(), torch.random.fork_rng(devices=[]):
                loss = self.loss(model, inputs, targets)
        except Exception as e:
            raise ConfigError(
                f"{self.source}: the loss on one training batch (inputs {_shape(inputs)}, targets "
                f"{_shape(targets)}) raised {type(e).__name__}: {e}"
            ) from None
        finally:
            model.train(was_training)
            self.load_state_dict(saved)  # the check's call of loss() counts for nothing
        if not (isinstance(loss, torch.Tensor) and loss.numel() == 1 and loss.is_floating_point()):
            raise ConfigError(
                f"{self.source}: the loss is {_shape(loss)}; return a scalar floating-point tensor "
                "(the mean over the batch)"
            )

    def checked_optimizer(self, model: torch.nn.Module, optim_cfg: Any) -> torch.optim.Optimizer | None:
        """The task's own optimizer (:meth:`optimizer`, else ``Task(optimizer=...)``'s callable over the
        groups of ``optim_cfg``), checked: a callable that raises or returns no Optimizer is one line."""
        from .optim import check_optimizer

        made = self._call("optimizer()", self.optimizer, model)
        if made is not None:
            return check_optimizer(f"{self.source}: optimizer()", made, model)
        make = self._optimizer
        if make is None:
            return None
        from .optim import callable_groups

        made = self._call("optimizer=", make, callable_groups(optim_cfg, model))
        return check_optimizer(f"{self.source}: optimizer=", made, model)

    def evaluate(self, model: torch.nn.Module, part: Any, device: torch.device | str, batch_size: int) -> torch.Tensor:
        """:meth:`eval_sums` added over this worker's evaluation share, by name in sorted order: a tensor
        for the sum over workers that :meth:`figures` reads."""
        totals: dict[str, float] = {}
        for x, y in part.batches(batch_size):
            sums = self.eval_sums(model, _to(x, device), _to(y, device))
            for name, v in sums.items():
                totals[name] = totals.get(name, 0.0) + float(v)
        if self._eval_names is None:
            self._eval_names = sorted(totals)
        if sorted(totals) != self._eval_names and totals:
            raise ValueError(
                f"{self.source}: eval_sums returned {sorted(totals)}, earlier {self._eval_names}: return the "
                "same names every time"
            )
        return torch.tensor([totals.get(name, 0.0) for name in self._eval_names], dtype=torch.float64)

    def figures(self, totals: torch.Tensor) -> dict[str, float]:
        """:meth:`eval_metrics` of the sums over all workers, named ``eval/<name>``."""
        sums = dict(zip(self._eval_names or [], totals.tolist(), strict=False))
        return {
            name if name.startswith("eval/") else f"eval/{name}": float(v)
            for name, v in self.eval_metrics(sums).items()
        }


def _to(x: Any, device: torch.device | str) -> Any:
    return x.to(device, non_blocking=True) if isinstance(x, torch.Tensor) else x


def _shape(x: Any) -> str:
    if isinstance(x, torch.Tensor):
        return f"a tensor of shape {tuple(x.shape)} ({x.dtype})"
    return f"a {type(x).__name__}"
