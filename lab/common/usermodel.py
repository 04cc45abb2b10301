"""A user's model in the lab: ``--model PKG.MOD:FN`` (with ``--dataset``), or ``--task PKG.MOD:FN``, as the
trainer takes them (allreduce_train/usercode.py, usertask.py), for the experiments that time or predict a
model (bench, time-to-accuracy, recommend).

A :class:`Workload` is the model the way the trainer's command line names it; everything the lab needs of it
-- the trainer flags, the model built as the trainer builds it, its gradient's shapes, one batch and its loss --
comes from the trainer's own :func:`allreduce_train.tasks.make_task`, so the lab times and predicts exactly
what ``train`` runs. Registered names (``lenet5``) are workloads too.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any

from allreduce_train.config import DataConfig, TrainConfig
from allreduce_train.usercode import is_reference, label


@dataclass(frozen=True)
class Workload:
    """A model as the trainer's flags name it: ``model`` (registered or MODULE:CALLABLE) or ``task``
    (MODULE:CALLABLE), the ``dataset`` (name or MODULE:CALLABLE) and the callables' keyword arguments."""

    model: str = ""
    task: str = ""
    dataset: str = ""  # "": the trainer's default for the model
    model_args: tuple[str, ...] = ()
    dataset_args: tuple[str, ...] = ()

    @property
    def own(self) -> bool:
        """Whether this is a user's code (not a registered model)."""
        return bool(self.task) or is_reference(self.model)

    @property
    def name(self) -> str:
        """How reports name it: the registered name, or the reference as the user wrote it."""
        return self.task or self.model

    @property
    def short(self) -> str:
        """For file names: ``lenet5``, ``lenet.LeNet5``."""
        return label(self.name) if self.own else self.name

    def flags(self) -> list[str]:
        """The trainer flags that select this model and its data."""
        out = ["--task", self.task] if self.task else ["--model", self.model]
        for a in self.model_args:
            out += ["--model-arg", a]
        if self.dataset and not self.task:
            out += ["--dataset", self.dataset]
        for a in self.dataset_args:
            out += ["--dataset-arg", a]
        return out


def from_args(
    model: str,
    task: str = "",
    dataset: str = "",
    model_args: list[str] | tuple[str, ...] = (),
    dataset_args: list[str] | tuple[str, ...] = (),
) -> Workload:
    return Workload(
        model=model, task=task, dataset=dataset, model_args=tuple(model_args), dataset_args=tuple(dataset_args)
    )


def config(w: Workload, extra: list[str] | tuple[str, ...] = ()) -> Any:
    """The trainer's configuration for ``w`` (and ``extra`` train flags); a bad flag raises UserError."""
    from allreduce_train.cli import make_parser
    from allreduce_train.config import build_config

    return build_config(make_parser().parse_args(["train", *w.flags(), *extra]))


def task_of(w: Workload, extra: list[str] | tuple[str, ...] = ()) -> Any:
    """The trainer's task for ``w`` (imports and calls the user's code; a failure raises ConfigError)."""
    from allreduce_train.tasks import make_task
    from allreduce_train.usercode import ensure_cwd_importable

    ensure_cwd_importable()
    return make_task(config(w, extra))


def build(w: Workload, seed: int = TrainConfig.seed) -> Any:
    """The model as every rank of ``train --seed seed`` builds it, and its task."""
    import torch

    task = task_of(w, ["--seed", str(seed)])
    torch.manual_seed(seed)
    return task.build_model(), task


@functools.cache
def shapes(w: Workload) -> tuple[tuple[int, ...], ...]:
    """The shapes of the model's trainable parameters, in its order (the cost model's gradient)."""
    model, _ = build(w)
    return tuple(tuple(p.shape) for p in model.parameters() if p.requires_grad)


def modules(w: Workload) -> int:
    """The model's modules that hold trainable parameters of their own: what sharded stage 3 gathers one at a
    time (lab/common/gradients.py ``owning_modules``)."""
    from .gradients import owning_modules

    model, _ = build(w)
    return owning_modules(model)


def nbytes(w: Workload) -> int:
    """Bytes of the model's float32 gradient."""
    return 4 * sum(math.prod(s) for s in shapes(w))


def first_batch(
    w: Workload,
    batch_size: int,
    rank: int,
    size: int,
    seed: int = TrainConfig.seed,
    synthetic_samples: int = DataConfig.synthetic_samples,
) -> tuple[Any, Any, Any]:
    """(task, inputs, targets): this rank's share of the trainer's first global batch, and the task whose
    ``loss(model, x, y)`` the trainer takes on it."""
    extra = ["--batch-size", str(batch_size), "--seed", str(seed)]
    if not w.own and w.dataset == "synthetic":
        extra += ["--synthetic-samples", str(synthetic_samples)]
    task = task_of(w, extra)
    batches, _ = task.shards(config(w, extra), rank, size)
    x, y = next(iter(batches.batches(0)))
    return task, x, y
