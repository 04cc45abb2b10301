"""``bench``: the trainer against a bare Horovod loop and torch DDP, side by side, and the bound.

    python -m lab bench           # LeNet-5 at 1 and 2 ranks (make bench)
    python -m lab bench --models lenet5,resnet18 --np 1,2 --repeats 6
    python -m lab bench --model mypkg.net:build [--model-arg k=v] [--dataset mypkg.data:load]   # your own model
    python -m lab bench --task examples.gpt.task:build --model-arg max_chars=20000              # your own task
    python -m lab bench --optimizer adamw --weight-decay 0.1 --precision bf16-mixed             # your own recipe

Each measurement is its own ``mpirun`` job built by the project's launcher, so every
implementation starts the same way. The jobs alternate (trainer, horovod, ddp, trainer, ...) so
that a change in machine load hits all of them alike, and ratios are taken between the jobs of
the same round before their median is reported. The ``bound`` job is the same ranks at the same
time, each training alone on its shard (``train --strategy none``): what N ranks reach on this
machine with a free network; every implementation is also reported as a fraction of it
(``of bound``, same-round pairs), beside the classic efficiency (throughput / N x one rank's).
Every job excludes its warm-up steps and times wall clock over the rest, so the trainer's own overhead
(data, logging, metrics) counts against it. The machine's load average is recorded next to every
figure. Results: a table on stdout, and in the output directory ``bench.json``, ``tensorboard/``
(one run per implementation, step = ranks, a Custom Scalars chart per figure), ``hparams/`` (one
session per job) and ``jobs/`` (the trainer jobs' own runs, the bare loops' results).

The recipe (lab/common/recipe.py: ``--optimizer``, its arguments, ``--lr-schedule``, ``--precision``, as the
trainer's flags) reaches every job: the trainer's, and the bare loops', which build the same optimizer with the
trainer's own code and run their forward pass under the same autocast (at a constant LR: a schedule costs
nothing per step). Without recipe flags every implementation runs SGD with momentum 0.9 in float32. The table
says what each implementation ran, read back from its results.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from allreduce_train.config import DataConfig

from ..common import costmodel, engines, methods, recipe, tblog, usermodel
from ..common.jobs import TRAINER as TRAINER_MODULE
from ..common.jobs import free_port, loadavg, local_launcher, read_json, run

RANK_MODULE = "lab.bench.rank"  # the bare loops, on every rank
# Timed steps per model when --steps is not given: a few seconds per job on one core.
DEFAULT_STEPS = {"lenet5": 400, "resnet18": 12, "ptb-lstm-small": 60, "ptb-lstm-medium": 12}
DEFAULT_WARMUP = {"lenet5": 30, "resnet18": 3, "ptb-lstm-small": 5, "ptb-lstm-medium": 2}
BASELINES = ("horovod", "ddp")
BOUND = "bound"  # every implementation is also reported as a fraction of this one
# "trainer" is the trainer at its config's defaults (lab/common/methods.py ``defaults()``: ring-horovod); the
# other methods it times are the lab registry's, by their names: the other ring engines, the colocated PS (every
# rank trains, as with allreduce: the same number of workers computing) and the sharded stages on each engine.
TRAINER = "trainer"
METHODS = ("ring-mpi", "ring-torch", "ps-sync-colocated")
# the no-exchange bound: the same ranks at the same time, each on its shard, nothing exchanged per step
# (--strategy none), i.e. what N ranks reach on this machine with a free network
BOUND_FLAGS = ("--strategy", "none")
# the sharded stages run at 2 ranks and more only: one rank holds every shard and exchanges nothing
SHARDED_MIN_NP = 2
# what the bench reports stages 1 and 2 against: they move the ring's bytes (issue 41: within 5 % at 2 ranks)
SHARDED_WITHIN = 0.05


def trainer_methods() -> dict[str, methods.Method]:
    """The registry's methods bench times beside ``trainer``, by name (those the trainer accepts)."""
    reg = methods.registry()
    zero = [m for e in methods.ENGINES for m in methods.sharded_stages(e)]
    return {**{n: reg[n] for n in METHODS if n in reg}, **{m.name: m for m in zero}}


def sharded_impls() -> dict[str, tuple[str, int, str]]:
    """{name: (the ring implementation beside it, stage, engine)} of the sharded stages the trainer accepts; the
    ring on the trainer's default engine is ``trainer``."""
    ring = {methods.defaults().name: TRAINER}
    return {n: (ring.get(m.base, m.base), m.stage, m.engine) for n, m in trainer_methods().items() if m.stage}


def runs_at(impl: str, np: int, spec: BenchSpec | None = None) -> bool:
    """Whether ``impl`` (or the sharded implementation a variant varies) is timed at ``np`` ranks."""
    base = spec.variant(impl).base if spec else impl
    return np >= SHARDED_MIN_NP or base not in sharded_impls()


# The optimizer every implementation runs, so that the update costs the same everywhere (the
# trainer would otherwise take a model's recipe, e.g. the LSTM's clipping and no momentum); the user's
# recipe flags come after these and override them.
SAME_OPTIMIZER = ["--momentum", "0.9", "--weight-decay", "0", "--grad-clip", "0"]


@dataclass
class Override:
    """An implementation timed with other settings, as its own column:
    ``--variant "NAME=BASE [KEY=VALUE ...] [--flag ...]"``."""

    name: str
    base: str  # trainer, horovod, ddp, bound or a method of the registry (ring-mpi, ...)
    env: dict[str, str] = field(default_factory=dict)
    args: list[str] = field(default_factory=list)  # extra `train` flags (trainer bases only)


@dataclass
class BenchSpec:
    models: list[str] = field(default_factory=lambda: ["lenet5"])
    nps: list[int] = field(default_factory=lambda: [1, 2])
    impls: list[str] = field(default_factory=list)  # default: every strategy of the trainer + the baselines
    repeats: int = 4
    steps: int = 0  # 0: DEFAULT_STEPS of the model
    warmup: int = -1  # -1: DEFAULT_WARMUP of the model
    batch_size: int = 0  # 0: the model's own batch (ModelSpec.defaults), else 64
    threads: int = 1
    synthetic_samples: int = DataConfig.synthetic_samples  # the trainer's default
    out: str = ""
    timeout: float = 600.0
    oversubscribe: bool = False
    variants: list[Override] = field(default_factory=list)
    # A user's models (docs/own_model.md): MODULE:CALLABLE entries of ``models`` are --model references, those
    # also in ``tasks`` --task references; the keyword arguments apply to every user entry.
    tasks: list[str] = field(default_factory=list)
    dataset: str = ""  # "": synthetic for a registered model, the trainer's default (fashion-mnist) for a user's
    model_args: list[str] = field(default_factory=list)
    dataset_args: list[str] = field(default_factory=list)
    recipe: list[str] = field(default_factory=list)  # the trainer's recipe flags for every job (lab/common/recipe.py)

    def workload(self, model: str) -> usermodel.Workload:
        """The trainer's flags for a ``models`` entry, as a :class:`usermodel.Workload`."""
        if model in self.tasks:
            return usermodel.from_args("", task=model, model_args=self.model_args)
        if usermodel.is_reference(model):
            return usermodel.from_args(
                model,
                dataset=self.dataset,
                model_args=self.model_args,
                dataset_args=self.dataset_args if usermodel.is_reference(self.dataset) else (),
            )
        return usermodel.from_args(
            model,
            dataset=self.dataset or "synthetic",
            dataset_args=self.dataset_args if usermodel.is_reference(self.dataset) else (),
        )

    def steps_for(self, model: str) -> int:
        return self.steps or DEFAULT_STEPS.get(model, 50)

    def warmup_for(self, model: str) -> int:
        return self.warmup if self.warmup >= 0 else DEFAULT_WARMUP.get(model, 5)

    def batch_for(self, model: str) -> int:
        from models import MODELS

        spec = MODELS.get(model)
        return self.batch_size or int(spec.defaults.get("batch_size", 64) if spec else 64)

    def variant(self, impl: str) -> Override:
        """The settings an implementation runs with (a plain one: none)."""
        return next((v for v in self.variants if v.name == impl), Override(impl, impl))


def parse_variant(text: str, known: list[str]) -> Override:
    """``NAME=BASE [KEY=VALUE ...] [--flag value ...]`` -> a Override; ValueError says what is wrong."""
    import re
    import shlex

    name, eq, rest = text.partition("=")
    name = name.strip()
    if not eq or not re.fullmatch(r"[A-Za-z0-9_.+-]+", name):
        raise ValueError(
            f"expected NAME=BASE [KEY=VALUE ...] [--flag ...], e.g. "
            f'"cycle1=trainer HOROVOD_CYCLE_TIME=1" (got {text!r})'
        )
    if name in known:
        raise ValueError(f"name {name!r} is taken by an implementation; pick another")
    words = shlex.split(rest)
    words[:1] = [methods.canonical(w) for w in words[:1]]  # an older name (trainer-mpi) still names its method
    if not words or words[0] not in known:
        raise ValueError(f"{name}: the first word must be the implementation to vary, one of: {', '.join(known)}")
    v = Override(name, words[0])
    flags_from = next((i for i, w in enumerate(words[1:], 1) if w.startswith("-")), len(words))
    for w in words[1:flags_from]:
        key, eq, value = w.partition("=")
        if not eq or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
            raise ValueError(f"{name}: {w!r} is not an environment setting KEY=VALUE (flags come after them)")
        v.env[key] = value
    v.args = words[flags_from:]
    if v.args and not trainer_based(v.base):
        raise ValueError(
            f"{name}: flags ({' '.join(v.args)}) only apply to the trainer; {v.base} takes environment settings only"
        )
    return v


def trainer_based(impl: str) -> bool:
    """Whether an implementation is the project's ``train`` command (the bound included)."""
    return impl in (TRAINER, BOUND) or impl in trainer_methods()


def default_impls() -> list[str]:
    return [TRAINER, *BASELINES, *METHODS, BOUND, *sharded_impls()]


def job_args(impl: str, model: str, spec: BenchSpec, result: str, run_dir: str, name: str) -> tuple[str, list[str]]:
    """(module every rank runs, its arguments) for one measurement: the trainer, or the bare loops."""
    steps, warmup = spec.steps_for(model), spec.warmup_for(model)
    common = [
        *spec.workload(model).flags(),
        "--batch-size",
        str(spec.batch_for(model)),
        "--threads",
        str(spec.threads),
        "--synthetic-samples",
        str(spec.synthetic_samples),
        # every implementation with denormal floats flushed: a trajectory whose values underflow (the
        # bound's LSTM ranks, each on its own gradient) would otherwise time the CPU's slow path, not the code
        "--flush-denormal",
        *SAME_OPTIMIZER,
        *spec.recipe,  # after SAME_OPTIMIZER: the user's recipe wins
    ]
    variant = spec.variant(impl)
    impl = variant.base
    if trainer_based(impl):
        # "trainer": no exchange flag, the trainer's defaults
        exchange = list(BOUND_FLAGS if impl == BOUND else trainer_methods()[impl].flags if impl != TRAINER else ())
        never = str(warmup + steps + 1)  # evaluation and checkpoints only after the last timed step
        return TRAINER_MODULE, [
            *common,
            *exchange,
            "--steps",
            str(warmup + steps),
            "--perf-warmup-steps",
            str(warmup),
            "--eval-every",
            never,
            "--checkpoint-every",
            never,
            "--run-dir",
            run_dir,
            "--name",
            name,
            "--no-progress",
            *variant.args,
        ]
    return RANK_MODULE, [
        *common,
        "--impl",
        impl,
        "--steps",
        str(steps),
        "--warmup",
        str(warmup),
        "--port",
        str(free_port()),
        "--result",
        result,
    ]


def run_job(impl: str, model: str, np: int, spec: BenchSpec, out: str, tag: str) -> dict[str, Any]:
    run_dir = os.path.join(out, tblog.JOBS_DIR)  # beside the bare loops' result files
    name = f"{spec.workload(model).short}-{impl}-np{np}-{tag}"
    result = os.path.join(out, "jobs", name + ".json")
    module, args = job_args(impl, model, spec, result, run_dir, name)
    threads = str(spec.threads)
    # Same thread settings for every implementation: torch intra-op, OpenMP and MKL pools.
    env = {**os.environ, "OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads, **spec.variant(impl).env}
    cmd = local_launcher(np, args, module, oversubscribe=spec.oversubscribe)
    record: dict[str, Any] = {
        "impl": impl,
        "model": model,
        "np": np,
        "tag": tag,
        "command": cmd,
        "loadavg_before": loadavg(),
    }
    job = run(cmd, env=env, timeout=spec.timeout, tail_chars=2000)
    record.update(wall_s=round(job.seconds, 2), loadavg_after=loadavg(), returncode=job.returncode)
    path = os.path.join(run_dir, name, "metrics.json") if module == TRAINER_MODULE else result
    m = read_json(path) if job.ok else None
    if m is not None:
        # The trainer's wall-clock figure includes its logging and data between steps.
        record["samples_per_sec"] = m.get("wall_samples_per_sec", m["samples_per_sec"])
        record["workers"] = m.get("workers", np)
        record["cpu_ms_per_step"] = m.get("cpu_ms_per_step")
        record["comm_wait_ms"] = m.get("comm_wait_ms")  # the ring's exchange wait prices sharded stage 3's
        record["recipe"] = recipe.ran(m)
    else:
        record["error"] = job.error_line()
        record["output_tail"] = job.output  # what the job printed last, to see why
    return record


def summarise(jobs: list[dict[str, Any]], spec: BenchSpec, impls: list[str]) -> list[dict[str, Any]]:
    """One row per (model, ranks): medians and spread per implementation, paired ratios, efficiency."""
    rows = []
    for model in spec.models:
        for np in spec.nps:
            mine = [j for j in jobs if j["model"] == model and j["np"] == np]
            row: dict[str, Any] = {
                "model": model,
                "np": np,
                "impls": {},
                "ratios": {},
                "efficiency": {},
                "of_bound": {},
                "sharded": {},
                "rounds": len({j["tag"] for j in mine}),
            }
            loads = [j["loadavg_before"][0] for j in mine if j["loadavg_before"]]
            row["loadavg_1min"] = [min(loads), max(loads)] if loads else []
            for impl in impls:
                v = [j["samples_per_sec"] for j in mine if j["impl"] == impl and "samples_per_sec" in j]
                if v:
                    med = statistics.median(v)
                    cpu = [j["cpu_ms_per_step"] for j in mine if j["impl"] == impl and j.get("cpu_ms_per_step")]
                    row["impls"][impl] = {
                        "median": med,
                        "min": min(v),
                        "max": max(v),
                        "spread": (max(v) - min(v)) / med,
                        "n": len(v),
                        "cpu_ms_per_step": statistics.median(cpu) if cpu else None,
                    }
            by_tag: dict[str, dict[str, Any]] = {}
            for j in mine:
                by_tag.setdefault(j["tag"], {})[j["impl"]] = j.get("samples_per_sec")
            for base in (b for b in impls if b not in ("trainer", BOUND)):  # trainer/bound: of_bound below
                pairs = [r["trainer"] / r[base] for r in by_tag.values() if r.get("trainer") and r.get(base)]
                if pairs:
                    row["ratios"][f"trainer/{base}"] = {
                        "median": statistics.median(pairs),
                        "min": min(pairs),
                        "max": max(pairs),
                    }
            for impl in (i for i in impls if i != BOUND):  # of the bound: same-round pairs, as the ratios
                pairs = [r[impl] / r[BOUND] for r in by_tag.values() if r.get(impl) and r.get(BOUND)]
                if pairs:
                    row["of_bound"][impl] = {"median": statistics.median(pairs), "min": min(pairs), "max": max(pairs)}
            row["sharded"] = sharded_pairs(mine, spec, impls, model, np)
            rows.append(row)
    for row in rows:  # scaling efficiency: throughput at N ranks / (N x throughput at 1 rank)
        one = next((r for r in rows if r["model"] == row["model"] and r["np"] == 1), None)
        for impl, s in row["impls"].items():
            if one and impl in one["impls"]:
                row["efficiency"][impl] = s["median"] / (row["np"] * one["impls"][impl]["median"])
    return rows


WIDE_MAX = 6  # more implementations than this: one line per implementation instead of one per row


def long_table(rows: list[dict[str, Any]], impls: list[str]) -> str:
    """The same figures, one line per (model, ranks, implementation): readable with many variants."""
    lines = [
        "| model | ranks | implementation | samples/s | trainer/it | of bound | efficiency | CPU ms/step |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        for i in impls:
            s = r["impls"].get(i)
            q = r["ratios"].get(f"trainer/{i}")
            b = r["of_bound"].get(i)
            e = r["efficiency"].get(i)
            cells = [
                r["model"],
                str(r["np"]),
                i,
                f"{s['median']:.0f} ({s['min']:.0f}-{s['max']:.0f})"
                + ("" if s["n"] == r["rounds"] else f" [{s['n']} of {r['rounds']}]")
                if s
                else "failed"
                if runs_at(i, r["np"])
                else "-",
                "1" if i == "trainer" else f"{q['median']:.2f} ({q['min']:.2f}-{q['max']:.2f})" if q else "-",
                "1" if i == BOUND else f"{b['median']:.2f} ({b['min']:.2f}-{b['max']:.2f})" if b else "-",
                f"{e:.2f}" if e is not None and r["np"] > 1 else "-",
                f"{s['cpu_ms_per_step']:.1f}" if s and s.get("cpu_ms_per_step") else "-",
            ]
            lines.append("| " + " | ".join(cells) + " |")
    loads = [v for r in rows for v in r["loadavg_1min"]]
    if loads:
        lines += ["", f"1-minute load when the jobs started: {min(loads):.1f}-{max(loads):.1f}"]
    return "\n".join(lines)


def sharded_pairs(
    mine: list[dict[str, Any]],
    spec: BenchSpec,
    impls: list[str],
    model: str,
    np: int,
    zero: dict[str, tuple[str, int, str]] | None = None,
) -> dict[str, dict[str, Any]]:
    """Each sharded stage against the ring on its engine, from the jobs of the same rounds: samples/s
    sharded / ring (median, min, max of the pairs); for stage 3 also the cost model's figure for the same
    ratio: its bytes over the ring's (1.5x) applied to the ring's measured exchange wait W of the same round,
    T / (T + 0.5 W) with T the ring's step. ``zero``: the sharded implementations (:func:`sharded_impls`)."""
    by_tag: dict[str, dict[str, dict[str, Any]]] = {}
    for j in mine:
        if "samples_per_sec" in j:
            by_tag.setdefault(j["tag"], {})[j["impl"]] = j
    # the ratio of the bytes is the model's whatever its size: a megabyte of float32 gradient
    zero3, whole = (
        costmodel.method_cost(m, costmodel.ALLREDUCE, np, 1e6) for m in (costmodel.Method(shard=3), costmodel.BASELINE)
    )
    more = zero3.volume / whole.volume if whole.volume else 1.0
    out = {}
    for impl, (ring, stage, _) in (sharded_impls() if zero is None else zero).items():
        both = [r for r in by_tag.values() if impl in r and ring in r and impl in impls]
        if not both:
            continue
        pairs = [r[impl]["samples_per_sec"] / r[ring]["samples_per_sec"] for r in both]
        entry: dict[str, Any] = {
            "ring": ring,
            "stage": stage,
            "median": statistics.median(pairs),
            "min": min(pairs),
            "max": max(pairs),
        }
        if stage == 3:
            predicted = []
            for r in both:
                if r[ring].get("comm_wait_ms") is not None:
                    step = np * spec.batch_for(model) / r[ring]["samples_per_sec"]  # seconds per global batch
                    predicted.append(step / (step + (more - 1) * r[ring]["comm_wait_ms"] / 1e3))
            entry["bytes_over_ring"] = more
            entry["model"] = statistics.median(predicted) if predicted else None
        out[impl] = entry
    return out


def sharded_lines(rows: list[dict[str, Any]]) -> str:
    """Below the table: each sharded stage over the ring on its engine (samples/s, same-round pairs); stages 1
    and 2 against the 5 % they should be within (they move the ring's bytes), stage 3 against the cost model."""
    lines = []
    for r in rows:
        for impl, e in r["sharded"].items():
            fig = f"{e['median']:.3f} ({e['min']:.3f}-{e['max']:.3f})"
            line = f"- {r['model']}, {r['np']} ranks: {impl} / {e['ring']} = {fig}"
            if e["stage"] < 3:
                near = abs(e["median"] - 1) <= SHARDED_WITHIN
                line += (
                    f", {'within' if near else 'NOT within'} {100 * SHARDED_WITHIN:.0f} % of the ring "
                    "(the same bytes and messages)"
                )
            else:
                model = f"{e['model']:.3f}" if e.get("model") else "- (no exchange wait recorded)"
                line += (
                    f"; the cost model's {e['bytes_over_ring']:.1f}x of the ring's bytes on the ring's measured "
                    f"exchange wait predicts {model} (its latency per gathered module not counted: no latency "
                    "is measured here)"
                )
            lines.append(line)
    if not lines:
        return ""
    head = "Sharded beside the ring on the same engine (samples/s, same-round pairs; > 1: the sharded stage is faster):"
    return "\n\n" + "\n".join([head, "", *lines])


def table(rows: list[dict[str, Any]], impls: list[str]) -> str:
    """A Markdown table: samples/s as median (min-max), ratios as median of same-round pairs."""
    if len(impls) > WIDE_MAX:
        return long_table(rows, impls)
    ratio_keys = [f"trainer/{b}" for b in impls if b not in ("trainer", BOUND)]
    bounded = [i for i in impls if i != BOUND] if BOUND in impls else []
    head = [
        "model",
        "ranks",
        *(f"{i} samples/s" for i in impls),
        *ratio_keys,
        *(f"{i}/bound" for i in bounded),
        *(f"eff. {i}" for i in impls),
        "load 1 min",
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [r["model"], str(r["np"])]
        for i in impls:
            s = r["impls"].get(i)
            cells.append(
                f"{s['median']:.0f} ({s['min']:.0f}-{s['max']:.0f})" if s else "failed" if runs_at(i, r["np"]) else "-"
            )
        for k in ratio_keys:
            q = r["ratios"].get(k)
            cells.append(f"{q['median']:.2f} ({q['min']:.2f}-{q['max']:.2f})" if q else "-")
        for i in bounded:
            q = r["of_bound"].get(i)
            cells.append(f"{q['median']:.2f} ({q['min']:.2f}-{q['max']:.2f})" if q else "-")
        for i in impls:
            e = r["efficiency"].get(i)
            cells.append(f"{e:.2f}" if e is not None else "-")
        lo_hi = r["loadavg_1min"]
        cells.append(f"{lo_hi[0]:.1f}-{lo_hi[1]:.1f}" if lo_hi else "-")
        lines.append("| " + " | ".join(cells) + " |")
    # CPU time hardly depends on what else the machine runs, so it shows busy-polling even under load
    lines += [
        "",
        "CPU ms per step, all ranks together (median):",
        "",
        "| model | ranks | " + " | ".join(impls) + " |",
        "|" + "---|" * (len(impls) + 2),
    ]
    for r in rows:
        cpu = [r["impls"].get(i, {}).get("cpu_ms_per_step") for i in impls]
        lines.append(f"| {r['model']} | {r['np']} | " + " | ".join(f"{c:.1f}" if c else "-" for c in cpu) + " |")
    return "\n".join(lines)


def concept_engine(rows: list[dict[str, Any]]) -> str:
    """Below the table: per model and rank count > 1, the concept x engine split (:mod:`..engines`)."""
    lines: list[str] = []
    for r in rows:
        if r["np"] > 1:
            lines += engines.markdown(
                f"{r['model']}, {r['np']} ranks, concept x engine",
                {i: s["median"] for i, s in r["impls"].items()},
            )
    return "\n\n" + "\n".join(lines).rstrip() if lines else ""


BENCH_FIGURES = (
    "perf/samples_per_sec",
    "scaling/speedup",
    "scaling/efficiency",
    "scaling/of_bound",
    "perf/trainer_over",
)


def write_tensorboard(
    out: str, rows: list[dict[str, Any]], jobs: list[dict[str, Any]], spec: BenchSpec, text: str
) -> None:
    """``out/tensorboard``: one run per implementation, step = ranks, the same tags per model and a
    Custom Scalars chart per tag; ``out/hparams``: one HParams session per job."""
    series: tblog.Series = {}
    one = {(r["model"], i): s["median"] for r in rows if r["np"] == 1 for i, s in r["impls"].items()}
    for r in rows:
        m, n = r["model"], r["np"]
        for impl, s in r["impls"].items():
            tblog.add_point(series, impl, f"perf/samples_per_sec/{m}", n, s["median"])
            if (m, impl) in one:
                tblog.add_point(series, impl, f"scaling/speedup/{m}", n, s["median"] / one[(m, impl)])
        for impl, e in r["efficiency"].items():
            tblog.add_point(series, impl, f"scaling/efficiency/{m}", n, e)
        for k, q in r["ratios"].items():
            tblog.add_point(series, k.partition("/")[2], f"perf/trainer_over/{m}", n, q["median"])
        for impl, q in r["of_bound"].items():  # each implementation as a fraction of the no-exchange bound
            tblog.add_point(series, impl, f"scaling/of_bound/{m}", n, q["median"])
    tblog.write_comparison(
        os.path.join(out, tblog.COMPARISON_DIR), series, tblog.model_categories(spec.models, BENCH_FIGURES), text
    )
    sessions = []
    bound = {
        (j["model"], j["np"], j["tag"]): j["samples_per_sec"]
        for j in jobs
        if j["impl"] == BOUND and "samples_per_sec" in j
    }
    for j in jobs:
        v = spec.variant(j["impl"])
        # the baselines (a bare Horovod loop, DDP) are ring allreduce too
        concept, engine = engines.cell(v.base) or (engines.RING, {"ddp": "torch DDP"}.get(v.base, engines.HOROVOD))
        if v.base == BOUND:
            concept, engine = "no exchange", "-"
        if "--allreduce-engine" in v.args:  # a variant that switches the engine
            engine = {"mpi": engines.MPI4PY, "torch": engines.TORCH}.get(
                tblog.flag_value(v.args, "--allreduce-engine", ""), engines.HOROVOD
            )
        hp = {
            "impl": j["impl"],
            "base": v.base,
            "model": j["model"],
            "workers": j["np"],
            "concept": concept,
            "engine": engine,
            "settings": " ".join([*(f"{k}={x}" for k, x in v.env.items()), *v.args]) or "-",
        }
        ms = {}
        if "samples_per_sec" in j:
            base = one.get((j["model"], j["impl"]))
            ms = {
                "samples_per_sec": j["samples_per_sec"],
                "efficiency": j["samples_per_sec"] / (j["np"] * base) if base else math.nan,
            }
            if j.get("cpu_ms_per_step"):
                ms["cpu_ms_per_step"] = j["cpu_ms_per_step"]
            if (j["model"], j["np"], j["tag"]) in bound:  # the bound job of the same round
                ms["of_bound"] = j["samples_per_sec"] / bound[(j["model"], j["np"], j["tag"])]
        sessions.append((f"{j['model']}-{j['impl']}-np{j['np']}-{j['tag']}", hp, ms))
    tblog.write_hparams(os.path.join(out, tblog.HPARAMS_DIR), sessions)


def run_bench(spec: BenchSpec) -> int:
    impls = spec.impls or default_impls()
    out = spec.out or os.path.join("runs", time.strftime("bench-%Y%m%d-%H%M%S"))
    os.makedirs(os.path.join(out, "jobs"), exist_ok=True)
    jobs: list[dict[str, Any]] = []
    started = time.strftime("%Y-%m-%d %H:%M:%S")
    for model in spec.models:
        for np in spec.nps:
            for rep in range(spec.repeats):
                # rotate the order every round, so no implementation always runs right after another
                order = impls[rep % len(impls) :] + impls[: rep % len(impls)]
                for impl in (i for i in order if runs_at(i, np, spec)):
                    j = run_job(impl, model, np, spec, out, f"r{rep}")
                    jobs.append(j)
                    fig = f"{j['samples_per_sec']:.0f} samples/s" if "samples_per_sec" in j else f"FAILED: {j['error']}"
                    print(
                        f"{model} np{np} round {rep + 1}/{spec.repeats} {impl:>10}: {fig} "
                        f"(load {j['loadavg_before'][:1]})",
                        file=sys.stderr,
                        flush=True,
                    )
    rows = summarise(jobs, spec, impls)
    text = recipe_lines(spec, jobs) + table(rows, impls) + concept_engine(rows) + sharded_lines(rows)
    report = {
        "spec": asdict(spec),
        "impls": impls,
        "started": started,
        "finished": time.strftime("%Y-%m-%d %H:%M:%S"),
        "command": [os.path.basename(sys.executable), "-m", "lab", *sys.argv[1:]],
        "cores": os.cpu_count(),
        "rows": rows,
        "jobs": jobs,
        "table": text,
    }
    with open(os.path.join(out, "bench.json"), "w") as fh:
        json.dump(report, fh, indent=2)
        fh.write("\n")
    write_tensorboard(out, rows, jobs, spec, text)
    print(text)
    print(f"-> {os.path.join(out, 'bench.json')}; make tensorboard RUN={os.path.join(out, tblog.COMPARISON_DIR)}")
    failed = [j for j in jobs if "error" in j]
    return 1 if failed else 0


def recipe_lines(spec: BenchSpec, jobs: list[dict[str, Any]]) -> str:
    """Above the table: the recipe asked for, and what each implementation ran (from its results)."""
    lines = [f"Recipe: {recipe.describe(spec.recipe)}.", "Ran (optimizer, LR schedule, precision):"]
    lines += [f"- {line}" for line in recipe.ran_lines(jobs, "impl")]
    return "\n".join(lines) + "\n\n"


def _int_list(text: str) -> list[int]:
    return [int(v) for v in text.split(",") if v]


def cmd_bench(args: argparse.Namespace) -> int:
    from allreduce_train.cli import fail
    from allreduce_train.errors import UserError
    from models import MODELS

    given = [m for m in args.models.split(",") if m] if args.models is not None else []
    if args.models is None and not (args.model or args.task):
        given = ["lenet5"]
    models = list(dict.fromkeys([*given, *args.model, *args.task]))
    unknown = [m for m in models if m not in MODELS and not usermodel.is_reference(m)]
    if unknown:
        return fail(
            f"--models: unknown model {unknown[0]!r}; choose from: {', '.join(sorted(MODELS))}, "
            "or give your own as --model MODULE:CALLABLE"
        )
    own = BenchSpec(
        models=models,
        tasks=list(args.task),
        dataset=args.dataset,
        model_args=list(args.model_arg),
        dataset_args=list(args.dataset_arg),
        recipe=recipe.argv(args),
    )
    for m in models:  # the user's code and recipe, built once here: what fails is one line before any job
        try:
            w = own.workload(m)
            usermodel.first_batch(w, own.batch_for(m), 0, 1, synthetic_samples=args.synthetic_samples)
            if own.recipe:
                recipe.check(w, [*SAME_OPTIMIZER, *own.recipe])
        except UserError as e:
            return fail(str(e))
    try:
        nps = _int_list(args.np)
    except ValueError:
        return fail(f"--np {args.np!r}: expected a comma-separated list of rank counts, e.g. 1,2")
    if not nps or min(nps) < 1:
        return fail(f"--np {args.np!r}: rank counts must be >= 1")
    variants: list[Override] = []
    for text in args.variant:
        try:
            variants.append(parse_variant(text, default_impls() + [v.name for v in variants]))
        except ValueError as e:
            return fail(f"--variant: {e}")
    known = default_impls() + [v.name for v in variants]
    impls = [methods.canonical(i) for i in args.impls.split(",") if i] if args.impls else known
    bad = [i for i in impls if i not in known]
    if bad:
        return fail(f"--impls: unknown implementation {bad[0]!r}; choose from: {', '.join(known)}")
    for flag, v in (("--repeats", args.repeats), ("--threads", args.threads)):
        if v < 1:
            return fail(f"{flag} must be >= 1 (got {v})")
    if args.batch_size < 0:
        return fail(f"--batch-size must be >= 1, or 0 for each model's own (got {args.batch_size})")
    if args.steps < 0 or args.warmup < -1:
        return fail("--steps must be >= 0 and --warmup >= 0 (or -1 for the model's default)")
    spec = BenchSpec(
        models=models,
        nps=nps,
        impls=impls,
        repeats=args.repeats,
        steps=args.steps,
        warmup=args.warmup,
        batch_size=args.batch_size,
        threads=args.threads,
        synthetic_samples=args.synthetic_samples,
        out=args.out,
        timeout=args.timeout,
        oversubscribe=args.oversubscribe,
        variants=variants,
        tasks=own.tasks,
        dataset=own.dataset,
        model_args=own.model_args,
        dataset_args=own.dataset_args,
        recipe=own.recipe,
    )
    return run_bench(spec)


def add_arguments(b: argparse.ArgumentParser) -> None:
    b.add_argument(
        "--models",
        default=None,
        help="comma-separated models: registered names or your own "
        "MODULE:CALLABLE (default: lenet5 unless --model/--task is given)",
    )
    b.add_argument(
        "--model",
        action="append",
        default=[],
        metavar="MODULE:CALLABLE",
        help="your own model (a callable returning an nn.Module), timed beside --models; repeatable",
    )
    b.add_argument(
        "--task",
        action="append",
        default=[],
        metavar="MODULE:CALLABLE",
        help="your own task (a callable returning an allreduce_train.Task); repeatable",
    )
    b.add_argument(
        "--model-arg",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="keyword argument for every --model's/--task's callable (repeatable)",
    )
    b.add_argument(
        "--dataset",
        default="",
        help="every job's dataset: a name or your own MODULE:CALLABLE (default: "
        "synthetic for registered models, fashion-mnist for your own "
        "--model; give the same to time a registered and your own model "
        "on equal data)",
    )
    b.add_argument(
        "--dataset-arg",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="keyword argument for --dataset's callable (repeatable)",
    )
    b.add_argument("--np", default="1,2", help="comma-separated rank counts (default: 1,2)")
    b.add_argument(
        "--impls", default="", help=f"comma-separated subset of: {', '.join(default_impls())} (default: all)"
    )
    b.add_argument("--repeats", type=int, default=4, help="rounds of alternating jobs (default: 4)")
    b.add_argument(
        "--steps", type=int, default=0, help=f"timed steps per job (default per model: {DEFAULT_STEPS}, else 50)"
    )
    b.add_argument(
        "--warmup",
        type=int,
        default=-1,
        help=f"untimed steps at the start of every job (default per model: {DEFAULT_WARMUP}, else 5)",
    )
    b.add_argument(
        "--batch-size",
        type=int,
        default=0,
        help="per rank (default 0: the model's own, e.g. 64 for lenet5, 20 for ptb-lstm-small)",
    )
    b.add_argument("--threads", type=int, default=1, help="torch/OpenMP/MKL threads per rank (default: 1)")
    recipe.add_trainer_flag(b, "synthetic_samples", "synthetic dataset size, the trainer's")
    b.add_argument("--out", default="", help="output directory (default: runs/bench-<time>)")
    b.add_argument("--timeout", type=float, default=600.0, help="seconds before a job counts as hung (default: 600)")
    b.add_argument("--oversubscribe", action="store_true", help="allow more ranks than cores")
    recipe.add_arguments(b)
    b.add_argument(
        "--variant",
        action="append",
        default=[],
        metavar='"NAME=BASE [KEY=VALUE ...] [--flag ...]"',
        help="also time implementation BASE with these environment settings and (trainer only) flags, "
        'as column NAME; repeatable. E.g. --variant "cycle1=trainer HOROVOD_CYCLE_TIME=1" '
        '--variant "fp16=trainer --compression fp16"',
    )
