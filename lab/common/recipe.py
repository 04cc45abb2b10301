"""The training recipe in the lab: the optimizer and its arguments, the LR schedule and the compute precision.

``bench``, ``time-to-accuracy`` and ``recommend`` take the trainer's own recipe flags -- every field of its
``[optim]`` section (``--optimizer``, ``--optimizer-arg``, ``--lr``, ``--betas``, ``--eps``, ``--weight-decay``,
``--no-decay-norm-bias``, ``--lr-schedule``, ``--warmup-steps``, ``--min-lr``, ...) and ``--precision`` -- made
here from allreduce_train.config's fields, their help and defaults read from there, and give them to every
training job they start: a measurement, and so a recommendation, is made under the recipe the user trains with
(AdamW changes how local SGD, DiLoCo and PowerSGD compare). A flag not given is not passed: the job takes the
trainer's default or the model's own recipe (the LSTM's). What a job ran is read back from its metrics.json
(:func:`ran`), which also catches DiLoCo's AdamW default.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Iterable, Sequence
from typing import Any

from allreduce_train import config
from launch import specflags

from . import usermodel

GROUP = "recipe"
# The recipe's fields beyond [optim]: the compute's precision (TrainConfig.precision)
TRAIN_FIELDS = ("precision",)


def fields() -> list[tuple[str, type, dataclasses.Field]]:
    """(section, class, field) of every recipe flag, in the trainer's order."""
    out: list[tuple[str, type, dataclasses.Field]] = [
        ("optim", config.OptimConfig, f) for f in dataclasses.fields(config.OptimConfig)
    ]
    out += [("train", config.TrainConfig, f) for f in dataclasses.fields(config.TrainConfig) if f.name in TRAIN_FIELDS]
    return out


def add_trainer_flag(p: argparse.ArgumentParser, name: str, help: str = "") -> None:
    """``--NAME`` (``name`` with ``_`` for ``-``) on a lab command that passes it on as the trainer's: its type,
    choices and default read from the trainer's config (``args.NAME`` holds that default when the flag is not
    given), so the lab copies none."""
    sections: list[Any] = [s.default_factory for s in dataclasses.fields(config.Config)]
    f = next(f for cls in sections for f in dataclasses.fields(cls) if config.key(cls, f.name) == name)
    default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
    kwargs: dict[str, Any] = {"type": type(default), "default": default}
    if specflags.choices(f):
        kwargs["choices"] = specflags.choices(f)
    p.add_argument(config.flag(name), help=f"{help or specflags.help_text(f)} (default: {default!r})", **kwargs)


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The recipe flags on a lab command's parser, as the trainer spells and explains them."""
    group = p.add_argument_group(
        GROUP,
        "the trainer's optimizer, LR schedule and precision flags, given to every training job "
        "(docs/training.md, the recipe); a flag not given leaves the trainer's default, or the model's own recipe",
    )
    for section, cls, f in fields():
        config.add_field_argument(group, section, cls, f)


def argv(args: argparse.Namespace) -> list[str]:
    """The recipe flags given on a lab command line, as the trainer's argv (in the trainer's field order)."""
    out: list[str] = []
    for section, cls, f in fields():
        value = getattr(args, f"{section}.{f.name}", None)
        name = config.flag(config.key(cls, f.name))
        if value is None:
            continue
        if isinstance(value, list):
            for v in value:
                out += [name, str(v)]
        elif isinstance(value, bool):
            out.append(name if value else "--no-" + name[2:])
        else:
            out += [name, str(value)]
    return out


def describe(flags: Sequence[str]) -> str:
    """How a report states the recipe it was asked for: the flags, or that there were none."""
    if not flags:
        defaults = {f.name: f.default for _, _, f in fields()}
        return (
            f"the trainer's defaults (no recipe flag given): --optimizer {defaults['optimizer']} (momentum "
            f"{defaults['momentum']}), --lr-schedule {defaults['lr_schedule']}, --precision {defaults['precision']}, "
            "or the model's own recipe"
        )
    return f"`{' '.join(flags)}` given to every training job"


def ran(metrics: dict[str, Any] | None) -> str:
    """What a job ran, from its metrics.json: ``AdamW, cosine schedule, bf16-mixed``; "" when not recorded."""
    if not metrics or "optimizer" not in metrics:
        return ""
    return f"{metrics['optimizer']}, {metrics.get('lr_schedule', '?')} schedule, {metrics.get('precision', '?')}"


def ran_lines(jobs: Iterable[dict[str, Any]], label: str) -> list[str]:
    """One line per recipe the jobs ran (their ``recipe`` from :func:`ran`), naming the jobs when they differ
    (``label``: the key that names a job, e.g. its method)."""
    by: dict[str, list[str]] = {}
    for j in jobs:
        if j.get("recipe"):
            names = by.setdefault(j["recipe"], [])
            if str(j[label]) not in names:
                names.append(str(j[label]))
    if len(by) == 1:
        return [f"{next(iter(by))}: every job"]
    return [f"{r}: {', '.join(names)}" for r, names in by.items()]


def check(w: usermodel.Workload, flags: list[str]) -> None:
    """Build what a training job of this recipe builds first -- the trainer's configuration, the model, the
    optimizer over it, the schedule's first factor, the precision on this machine's device -- so that a bad
    recipe (an unknown optimizer, a callable that raises or returns no Optimizer, 16-mixed without CUDA) is one
    line (the trainer's :class:`~allreduce_train.errors.UserError`) before any job starts."""
    import torch

    from allreduce_train.optim import LRSchedule, build_optimizer
    from allreduce_train.precision import Precision

    cfg = usermodel.config(w, flags)
    Precision(cfg.train.precision, torch.device("cuda" if torch.cuda.is_available() else "cpu"))
    task = usermodel.task_of(w, flags)
    build_optimizer(cfg.optim, task.build_model(), task)
    LRSchedule.make(cfg.optim, 1, 1, 1)
