"""Every combination the configuration accepts trains, at real ranks, on a model with odd tensors.

How the set is generated (nothing here lists a combination by hand):

* the primary axes come from the configuration's own choices: the engine (``--strategy``, and under
  ``allreduce`` and ``sharded`` each ``--allreduce-engine``), the wire format (``--compression``), the schedule
  (synchronous, ``--average-every 2``: local SGD, ``--diloco-every 2``: DiLoCo), ``--reduce-op``, and the
  parameter server's ``--ps-placement`` and ``--ps-mode`` (varied under ``--strategy ps`` only: no other
  engine reads them). Their product is filtered by building each candidate's ``Config``: what raises
  ``ConfigError`` (a row of ``config.COMBINATIONS``) is left out, every other combination is a job;
* the secondary axes are spread over those jobs instead of multiplied with them: the recipe
  (``--precision`` 32 and bf16-mixed, ``--optimizer`` sgd and adamw) for every engine, and an engine's own
  choices for its jobs (``--horovod-backend``, ``--mpi-algorithm``, ``--shard-stage``). Each job takes the
  accepted secondary values that pair most not-yet-run secondary values with its primary values, so that every
  secondary value runs with every primary value of its engine (bf16-mixed with DiLoCo, adamw with PowerSGD,
  ...) wherever the configuration accepts the two together; where a primary value has fewer jobs than that needs (DiLoCo
  and PowerSGD have one each, ``--strategy none`` has one in all), a job is repeated with the missing values.

Each job trains 4 steps (one epoch, a checkpoint at its end, one evaluation) of tests/helpers.py's
``userpkg.net:odd`` -- a matrix PowerSGD compresses, two too small to, a bias-only layer, a BatchNorm -- at
2 ranks (3 for a dedicated parameter server: one server, two workers), and must exit 0. Where the concept
makes the workers' models identical at the end, the dumped parameters and buffers are bit-identical on
every worker: everything but the asynchronous PS (each worker ends with the parameters of its own last
pull) and ``--strategy none`` (nothing exchanged: there they must differ, the control that the comparison
sees a difference where there is one). Local SGD and DiLoCo synchronise every 2 steps, so the 4th, the
last, is a synchronising one.

``long``: 69 jobs of 5 to 13 s each (24 of them ``--strategy sharded``: 3 engines x wire formats x stages;
the 45 others took 5 min in all on this 2-core machine under a load of 4) (make test-long, which CI runs).
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import json
import math
import os
from collections.abc import Iterator

import pytest
import torch

from allreduce_train.config import (
    OPTIMIZERS,
    STRATEGIES,
    ExchangeConfig,
    HorovodConfig,
    MPIConfig,
    PSConfig,
    TrainConfig,
)
from allreduce_train.errors import ConfigError
from launch import specflags

from helpers import check, launch, load_params, parse, run_args, write_user_package

pytestmark = [pytest.mark.mpi, pytest.mark.long]

STEPS = 4
RUN = [
    "--model",
    "userpkg.net:odd",
    "--dataset",
    "userpkg.data:build",
    "--dataset-arg",
    "n=64",  # 2 workers x batch 8: one epoch of 4 steps
    "--dataset-arg",
    "evaluation=16",
    "--batch-size",
    "8",
    "--steps",
    str(STEPS),
    "--eval-every",
    str(STEPS),
    "--warmup-steps",
    "0",
    "--no-progress",
    "--no-tensorboard",
    "--log-every",
    str(STEPS),
]
# The schedules are flags with a period, not choices: H = 2 divides STEPS, so the last step synchronises
SCHEDULES = {"sync": [], "localsgd": ["--average-every", "2"], "diloco": ["--diloco-every", "2"]}
# Recipe values for every engine; 16-mixed is CUDA's (a loss scaler for float16), adam is adamw's code path
RECIPE = {"--precision": ("32", "bf16-mixed"), "--optimizer": ("sgd", "adamw")}


def choices(cls: type, name: str) -> tuple[str, ...]:
    """A config field's choices, as its flag offers them."""
    return next(tuple(specflags.choices(f) or ()) for f in dataclasses.fields(cls) if f.name == name)


# An engine's own choices, spread over that engine's jobs (the torch engine's backend is Gloo on CPU)
ENGINE_OWN = {
    "horovod": {"--horovod-backend": choices(HorovodConfig, "backend")},
    "mpi": {"--mpi-algorithm": choices(MPIConfig, "algorithm")},
}
assert set(RECIPE["--precision"]) < set(choices(TrainConfig, "precision"))
assert set(RECIPE["--optimizer"]) < set(OPTIMIZERS)


# --strategy sharded runs on each allreduce engine; its stage is spread over its jobs like an engine's own choice
for _engine in choices(ExchangeConfig, "allreduce_engine"):
    ENGINE_OWN[f"sharded-{_engine}"] = {
        **ENGINE_OWN.get(_engine, {}),
        "--shard-stage": tuple(map(str, choices(ExchangeConfig, "shard_stage"))),
    }


def engines() -> Iterator[tuple[str, list[str]]]:
    for strategy in STRATEGIES:
        if strategy in ("allreduce", "sharded"):
            for engine in choices(ExchangeConfig, "allreduce_engine"):
                name = engine if strategy == "allreduce" else f"sharded-{engine}"
                yield name, ["--strategy", strategy, "--allreduce-engine", engine]
        else:
            yield strategy, ["--strategy", strategy]


@functools.cache
def accepted(argv: tuple[str, ...]) -> bool:
    """Whether `train RUN ARGV` builds a Config (the CLI's own parser and checks)."""
    try:
        parse([*RUN, *argv])
    except ConfigError:
        return False
    return True


Pair = tuple[str, str]  # (axis, value): ("--compression", "fp16"), ("schedule", "diloco")


def primary(engine: str, flags: list[str]) -> list[tuple[str, list[str], list[Pair]]]:
    """Every accepted (wire, schedule, reduce-op[, placement, mode]) of one engine: (id, flags, its values)."""
    axes = ["--compression", "schedule", "--reduce-op"] + (["--ps-placement", "--ps-mode"] if engine == "ps" else [])
    values = {
        "--compression": choices(ExchangeConfig, "compression"),
        "schedule": tuple(SCHEDULES),
        "--reduce-op": choices(ExchangeConfig, "reduce_op"),
        "--ps-placement": choices(PSConfig, "placement"),
        "--ps-mode": choices(PSConfig, "mode"),
    }
    out = []
    for combo in itertools.product(*(values[a] for a in axes)):
        pairs = list(zip(axes, combo, strict=True))
        argv = flags + [f for a, v in pairs for f in (SCHEDULES[v] if a == "schedule" else [a, v])]
        if accepted(tuple(argv)):
            out.append(("-".join([engine, *(v.replace("none", "float32") for v in combo)]), argv, pairs))
    return out


def with_recipe(argv: list[str], pick: tuple[Pair, ...]) -> list[str]:
    return [*argv, *(x for pair in pick for x in pair)]


def engine_jobs(engine: str, flags: list[str]) -> list[tuple[str, list[str]]]:
    """One engine's jobs: each accepted primary combination once, the secondary values spread over them so
    that each runs with each primary value at least once where the configuration accepts the two together."""
    combos = primary(engine, flags)
    axes = {**RECIPE, **ENGINE_OWN.get(engine, {})}
    picks = [tuple(zip(axes, values, strict=True)) for values in itertools.product(*axes.values())]

    def fits(argv: list[str], pick: tuple[Pair, ...]) -> bool:
        return accepted(tuple(with_recipe(argv, pick)))

    def covers(pairs: list[Pair], pick: tuple[Pair, ...]) -> set[tuple[Pair, Pair]]:
        return {(p, s) for p in pairs for s in pick}

    need = {c for _, argv, pairs in combos for pick in picks if fits(argv, pick) for c in covers(pairs, pick)}
    jobs = []

    def take(name: str, argv: list[str], pairs: list[Pair], options: list[tuple[Pair, ...]]) -> int:
        """Add the job with the option that covers the most of ``need`` (the first of the best); how many."""
        fitting = [p for p in options if fits(argv, p)]
        assert fitting, f"{name}: no secondary values fit"
        best = max(fitting, key=lambda p: len(need & covers(pairs, p)))
        got = len(need & covers(pairs, best))
        need.difference_update(covers(pairs, best))
        jobs.append((f"{name}+" + "+".join(v for _, v in best), with_recipe(argv, best)))
        return got

    for i, (name, argv, pairs) in enumerate(combos):
        # rotated, so that where several picks cover as much, consecutive jobs take different ones
        take(name, argv, pairs, picks[i % len(picks) :] + picks[: i % len(picks)])
    while need:  # a primary value in fewer jobs than it has secondary values: repeat the job that covers most
        name, argv, pairs = max(combos, key=lambda c: max(len(need & covers(c[2], p)) for p in picks if fits(c[1], p)))
        assert take(name, argv, pairs, picks) > 0
    return jobs


def matrix() -> list[tuple[str, list[str]]]:
    """The jobs: (test id, trainer flags beyond RUN); the module docstring says how they are chosen."""
    return [job for engine, flags in engines() for job in engine_jobs(engine, flags)]


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    return write_user_package(tmp_path_factory.mktemp("combinations") / "site")


@pytest.mark.parametrize("argv", [pytest.param(argv, id=name) for name, argv in matrix()])
def test_every_accepted_combination_trains_and_ends_alike_on_every_worker(tmp_path, site, argv):
    cfg = parse([*RUN, *argv])
    x = cfg.exchange
    # a dedicated PS: rank 0 only serves, ranks 1 and 2 train
    np_, ranks = (3, [1, 2]) if x.strategy == "ps" and cfg.ps.placement == "dedicated" else (2, [0, 1])
    env = {"PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])}
    check(launch(np_, RUN + argv + run_args(tmp_path, "c"), env=env, oversubscribe=np_ > 2))
    assert json.loads((tmp_path / "c" / "metrics.json").read_text())["steps"] == STEPS
    dumps = [load_params(tmp_path / f"c-{r}.pt") for r in ranks]
    assert all(math.isfinite(float(v.float().sum())) for d in dumps for v in d.values())
    alike = [all(torch.equal(dumps[0][k], d[k]) for k in dumps[0]) for d in dumps[1:]]
    if x.strategy == "none":
        assert not any(alike), "--strategy none: the workers trained on different shards, yet ended alike"
    elif not (x.strategy == "ps" and cfg.ps.mode == "async"):
        for d in dumps[1:]:
            for k in dumps[0]:
                assert torch.equal(dumps[0][k], d[k]), f"{k} differs between workers"
