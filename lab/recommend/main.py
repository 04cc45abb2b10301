"""``recommend``: which concept reaches a quality target fastest for YOUR model, on a cluster you describe.

    python -m lab recommend --task examples.gpt.task:build --model-arg max_chars=40000 \\
        --target 'eval/loss<=2.5' --workers 8,64,512 --link 10gbit,100gbit --latency 50us
    python -m lab recommend --model mypkg.net:build --dataset mypkg.data:load --target 'eval/accuracy>=0.9'
    python -m lab recommend --task examples.gpt.task:build --target 'eval/loss<=2.5' \\
        --optimizer adamw --lr 3e-4 --lr-schedule cosine --warmup-steps 20 --precision bf16-mixed

Time to the target = steps to the target x time per step. The cost model (lab/common/costmodel.py, validated on
emulated hosts) predicts the time per step of each concept (float32, 16-bit, PowerSGD, local SGD on a ring
allreduce) from the model's compute per step and its gradient; the steps come from training: each concept's
steps to the target over synchronous float32's, measured here on 2 emulated hosts (lab/emulation; root) by the
time-to-accuracy grid (``python -m lab time-to-accuracy``, run as a job: experiments do not import each other).
Measured here:

* compute per step: one worker, one thread, the trainer's first batch, forward + backward + the recipe's
  optimizer step (median);
* the gradient: the model's trainable parameters' shapes (PowerSGD's bytes depend on which are matrices);
* the steps ratio of each concept to float32 at 2 workers (``--steps-from DIR`` reuses a finished grid's).

All of it under the user's recipe: the trainer's recipe flags (lab/common/recipe.py: ``--optimizer``, its
arguments, ``--lr-schedule``, ``--precision``) reach the compute measurement and every job of the steps grid, so
the recommendation is made for the optimizer the user trains with (AdamW changes how local SGD and PowerSGD
compare with float32); a grid given with ``--steps-from`` must have run under the same recipe flags.

Given: workers, link rates and the latency (assumed: nothing here measures your cluster). Modelled: each
concept's bytes, messages and extra compute (costmodel.method_cost). The steps ratio is measured at 2 workers
only: for other worker counts it is used as it is and every such answer says so. Where the model is known to
miss (lab/common/trust.py), an answer whose margin is within the miss says "not decided"; so does one that rests on
a concept whose check on the emulated hosts missed the model's prediction by more than that factor.

Memory (``--memory-per-rank 16GiB``): beside the fastest concept, the fastest of those whose per-rank memory fits
(allreduce_train/distributed/memcost.py ``per_rank``: parameters, gradients and optimizer state of each rank;
activations and the engine's buffers apart). The ring's concepts (float32, 16-bit, PowerSGD, local SGD) hold the
whole model on every rank; the sharded stages (``zero1``, ``zero2``, ``zero3``, which then join the candidates)
hold 1/N of the optimizer state, of the gradients too, of the parameters too. It rests on the model's parameter
count and the recipe's optimizer state per parameter (measured here: the optimizer after one step, e.g. AdamW 8
bytes, SGD with momentum 4, plain SGD 0). A concept that does not fit is named with what it needs.

Output (``--out``, default runs/recommend/<time>): the summary on stdout (one screen), report.md,
recommend.json (every input with its source, every cell) and recommend.png (the map: the fastest concept to the
target by link rate and workers, the asked points circled, the undecided region hatched), steps/ (the grid).
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

from ..common import costmodel, recipe, trust, usermodel
from ..common.methods import STAGES, registry

DEFAULT_METHODS = ("fp32", "fp16", "powersgd-r4", "localsgd-h4", "localsgd-h16")
SHARDED_METHODS = tuple(f"zero{s}" for s in STAGES)  # join the candidates when --memory-per-rank asks
MEASURED_WORKERS = 2  # the emulated hosts the steps ratios are measured on
ENGINE = "mpi"  # the grid's ring on mpi4py: the engine the cost model's ring matched (0.98-1.12, trust.py)


class RecommendError(ValueError):
    """Bad input; the message names the flag."""


@dataclass
class Inputs:
    """What the recommendation rests on, each with where it came from."""

    model: str
    shapes: list[tuple[int, ...]]
    compute_s: float
    batch: int
    latency_s: float
    steps_ratio: dict[str, float | None]  # concept label -> its steps to the target / float32's (None: not reached)
    ratio_workers: int = MEASURED_WORKERS
    sources: dict[str, str] = field(default_factory=dict)
    failed: dict[str, str] = field(default_factory=dict)  # concept label -> its job's error line (a crash, not slow)
    host: costmodel.Host = costmodel.HOST
    recipe: str = ""  # the recipe asked for (lab/common/recipe.py describe)
    modules: int = 0  # the modules sharded stage 3 gathers (0: one per tensor, costmodel.method_cost)
    memory_limit: float = 0.0  # --memory-per-rank in bytes (0: not asked)
    state_bytes_per_param: float = 0.0  # the recipe's optimizer state per parameter (bytes)

    @property
    def grad_bytes(self) -> int:
        return 4 * sum(math.prod(s) for s in self.shapes)

    @property
    def n_params(self) -> int:
        return sum(math.prod(s) for s in self.shapes)


def tta_method(label: str) -> str:
    """The time-to-accuracy grid's method for a concept label: fp32 -> ring-mpi, fp16 -> ring-mpi-fp16."""
    return f"ring-{ENGINE}" + ("" if label == "fp32" else f"-{label}")


def parse_latency(text: str) -> float:
    """``50us``, ``1ms``, ``0.5ms``, ``0`` -> seconds."""
    t = text.strip().lower()
    for unit, scale in (("us", 1e-6), ("ms", 1e-3), ("s", 1.0)):
        if t.endswith(unit):
            t, mult = t[: -len(unit)], scale
            break
    else:
        mult = 1e-6 if t not in ("0", "") else 0.0
    try:
        v = float(t) * mult
    except ValueError:
        raise RecommendError(f"--latency {text!r}: write a time such as 50us or 1ms") from None
    if not (v >= 0 and math.isfinite(v)):
        raise RecommendError(f"--latency {text!r}: must be >= 0")
    return v


SIZE_POWERS = {"": 0, "k": 1, "m": 2, "g": 3, "t": 4}


def parse_size(text: str, flag: str = "--memory-per-rank") -> float:
    """``512MiB``, ``16GiB``, ``2G`` (binary, as Slurm's --mem), ``16GB`` (decimal), ``1.5TiB`` -> bytes."""
    import re

    m = re.fullmatch(r"([0-9.]+)\s*(?:([kmgt])(i?)(b?)|(b?))", text.strip().lower())
    try:
        v = float(m.group(1)) if m else math.nan
    except ValueError:
        v = math.nan
    if m and m.group(2):
        decimal = m.group(4) and not m.group(3)  # GB: 1000s; G, GiB: 1024s
        v *= (1000 if decimal else 1024) ** SIZE_POWERS[m.group(2)]
    if not (v > 0 and math.isfinite(v)):
        raise RecommendError(f"{flag} {text!r}: write a size such as 512MiB, 16GiB or 2G")
    return v


def fmt_bytes(n: float) -> str:
    """Bytes in the binary units --memory-per-rank is written in: GiB, MiB or KiB, whichever is >= 1."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20)):
        if n >= scale:
            return f"{n / scale:.{2 if unit == 'GiB' else 1}f} {unit}"
    return f"{n / 2**10:.1f} KiB"


def memory_need(inp: Inputs, label: str, n: int) -> float:
    """Bytes of parameters, gradients and optimizer state one of ``n`` workers holds under concept ``label``
    (memcost.per_rank: a ring concept holds the whole model, zeroS its stage's shards)."""
    from allreduce_train.distributed.memcost import per_rank

    stage = costmodel.Method.parse(label).shard
    need = per_rank(
        inp.n_params,
        n,
        "sharded" if stage else "ring",
        stage=stage,
        state_bytes_per_param=inp.state_bytes_per_param,
    )
    return float(need["total"])


def parse_links(text: str) -> list[tuple[str, float]]:
    """``10gbit,100gbit`` -> [(name, bytes/s)]."""
    from ..emulation.netns import parse_rate

    out = []
    for r in (v.strip() for v in text.split(",") if v.strip()):
        try:
            bits = parse_rate(r)
        except ValueError as e:
            raise RecommendError(str(e).replace("--link-rate", "--link")) from None
        if not bits:
            raise RecommendError(f"--link {r}: give a rate, e.g. 10gbit")
        out.append((r, bits / 8))
    if not out:
        raise RecommendError("--link: give at least one rate, e.g. 10gbit,100gbit")
    return out


# ------------------------------------------------------------------------- the plan (pure: tested on small inputs)


def predict_cell(
    inp: Inputs,
    n: int,
    bandwidth: float,
    methods: list[str],
    latency_s: float | None = None,
    compute_s: float | None = None,
) -> dict[str, Any]:
    """One (workers, link): each concept's predicted step and time to the target relative to float32's, the
    winner, and whether the model decides it (trust.decisive) and the ratio was measured at ``n``."""
    net = costmodel.Network(alpha=inp.latency_s if latency_s is None else latency_s, bandwidth=bandwidth)
    compute = inp.compute_s if compute_s is None else compute_s
    steps, rel = {}, {}
    for label in ["fp32", *[m for m in methods if m != "fp32"]]:
        p = costmodel.predict_method(
            costmodel.Method.parse(label),
            costmodel.ALLREDUCE,
            n,
            inp.shapes,
            compute,
            inp.batch,
            net,
            host=inp.host,
            modules=inp.modules,
        )
        steps[label] = p.step_s
        ratio = 1.0 if label == "fp32" else inp.steps_ratio.get(label)
        if ratio is not None:
            rel[label] = ratio * p.step_s / steps["fp32"]
    order = sorted(rel, key=rel.__getitem__)
    base_ex = costmodel.predict_method(
        costmodel.BASELINE, costmodel.ALLREDUCE, n, inp.shapes, compute, inp.batch, net
    ).exchange_s
    best = order[0]
    runner = order[1] if len(order) > 1 else None
    margin = runner is None or trust.decisive(rel[best], rel[runner], base_ex, compute)
    memory: dict[str, Any] = {}
    if inp.memory_limit:
        need = {m: memory_need(inp, m, n) for m in ["fp32", *[m for m in methods if m != "fp32"]]}
        fitting = [m for m in order if need[m] <= inp.memory_limit]
        memory = {
            "memory_need": need,
            "fits": [m for m in need if need[m] <= inp.memory_limit],
            "fastest_fitting": fitting[0] if fitting else None,
        }
    return {
        **memory,
        "workers": n,
        "bandwidth": bandwidth,
        "winner": best,
        "runner_up": runner,
        "time_vs_fp32": rel,
        "step_s": steps,
        "fp32_exchange_s": base_ex,
        "compute_s": compute,
        "in_region": trust.in_region(base_ex, compute),
        "decided": margin,
        "margin_decided": margin,  # by the untrusted region's rule alone (judge() may undecide it on the check)
        "ratio_measured_here": n == inp.ratio_workers,
        "not_reached": [m for m in methods if m != "fp32" and inp.steps_ratio.get(m) is None and m not in inp.failed],
        "failed": {m: inp.failed[m] for m in methods if m in inp.failed},
    }


def judge(cell: dict[str, Any], check: dict[str, Any] | None) -> dict[str, Any]:
    """``cell`` with the check on emulated hosts applied: where a concept's measured time missed the model's by
    more than the trust factor (trust.check_holds), the cell is not decided if that concept is its pick (the
    model's figure for it is not what the jobs measured) or is ranked and measured faster than predicted (it
    may be the real pick). ``check_missed`` names those concepts with both figures: the reason shown."""
    missed = {m: c for m, c in (check or {}).get("methods", {}).items() if not c.get("within_trust", True)}
    if not missed:
        return cell
    against = {
        m: c
        for m, c in missed.items()
        if m == cell["winner"] or (m in cell["time_vs_fp32"] and c["measured"] < c["predicted"])
    }
    why = {m: f"predicted {c['predicted']:.2f}, measured {c['measured']:.2f}" for m, c in against.items()}
    return {**cell, "decided": cell["decided"] and not against, "check_missed": why}


def plan(
    inp: Inputs,
    workers: list[int],
    links: list[tuple[str, float]],
    methods: list[str],
    check: dict[str, Any] | None = None,
) -> list[dict[str, Any]]:
    """Every asked (workers, link) cell, judged against the check on emulated hosts (None: no check)."""
    return [judge({**predict_cell(inp, n, bw, methods), "link": name}, check) for n in workers for name, bw in links]


def summary(
    inp: Inputs, cells: list[dict[str, Any]], methods: list[str], check: dict[str, Any] | None, out: str = ""
) -> str:
    """The one-screen answer: the inputs with their sources, the pick per (workers, link), what it rests on."""
    lines = [f"Which concept reaches the target fastest for {inp.model}", ""]
    src = inp.sources
    ratios = ", ".join(
        f"{m} {inp.steps_ratio[m]:.2f}"
        if inp.steps_ratio.get(m) is not None
        else f"{m} failed"
        if m in inp.failed
        else f"{m} not reached"
        for m in methods
        if m != "fp32"
    )
    lines += [
        "inputs:",
        f"  compute per step  {1e3 * inp.compute_s:.1f} ms at batch {inp.batch}  [{src.get('compute', 'given')}]",
        f"  gradient          {inp.grad_bytes / 1e6:.3f} MB float32, {len(inp.shapes)} tensors  "
        f"[{src.get('shapes', 'measured here')}]",
        f"  steps to target / float32's, at {inp.ratio_workers} workers: {ratios}  [{src.get('steps', 'given')}]",
        f"  latency           {1e6 * inp.latency_s:g} us per message  [assumed: --latency]",
        f"  recipe            {inp.recipe or recipe.describe([])}  [{src.get('recipe', 'given')}]",
        "  bytes, messages, extra compute per concept  [modelled: costmodel.method_cost; host "
        f"{inp.host.mem_bw / 1e9:g} GB/s, {inp.host.flops / 1e9:g} GFLOP/s assumed]",
        "",
    ]
    links = list(dict.fromkeys(c["link"] for c in cells))
    lines.append("| workers | " + " | ".join(links) + " |")
    lines.append("|---:|" + "---|" * len(links))
    for n in dict.fromkeys(c["workers"] for c in cells):
        row = [str(n)]
        for link in links:
            c = next(c for c in cells if c["workers"] == n and c["link"] == link)
            t = c["time_vs_fp32"][c["winner"]]
            txt = f"**{c['winner']}** {t:.2f}" if c["decided"] else f"{c['winner']} {t:.2f}"  # bold: a pick
            if c["runner_up"]:
                txt += f" ({c['runner_up']} {c['time_vs_fp32'][c['runner_up']]:.2f})"
            why = ("" if c["margin_decided"] else "*") + ("†" if c.get("check_missed") else "")
            marks = ("" if c["decided"] else f" not decided{why}") + ("" if c["ratio_measured_here"] else " +")
            row.append(txt + marks)
        lines.append("| " + " | ".join(row) + " |")
    lines += ["", "cells: the fastest concept's time to the target over float32's (the runner-up's)"]
    if any(not c["ratio_measured_here"] for c in cells):
        lines.append(
            f"+ steps ratio measured at {inp.ratio_workers} workers, not at this N: used as it is, not "
            "extrapolated (local SGD's and PowerSGD's steps usually grow with N: check at your N)"
        )
    if any(not c["margin_decided"] for c in cells):
        lines.append("* " + trust.note())
    against = sorted({m for c in cells for m in c.get("check_missed", {})})
    if against:
        lines.append(
            f"† the check below missed by more than {trust.MISS:.2f}x (lab/common/trust.py) for {', '.join(against)}, "
            "which these picks rest on: the model lacks a cost those jobs paid, so they are not decided"
        )
    missed = sorted({m for c in cells for m in c["not_reached"]})
    if missed:
        lines.append(f"not ranked (did not reach the target in the measurement): {', '.join(missed)}")
    for m, line in inp.failed.items():  # a crash is a failure of that concept's job, never a slow concept
        lines.append(f"not ranked, {m} failed: {line}")
    if check:
        lines.append(check_line(check))
    if inp.memory_limit:
        lines += ["", *memory_lines(inp, cells, links), ""]
    if out:
        lines.append(f"-> {out}/report.md, recommend.json, recommend.png")
    return "\n".join(lines)


def memory_lines(inp: Inputs, cells: list[dict[str, Any]], links: list[str]) -> list[str]:
    """The "fits in M per rank" answer: per worker count, what each concept needs per rank, and per link the
    fastest concept to the target among those that fit."""
    out = [
        f"fits in {fmt_bytes(inp.memory_limit)} per rank (parameters, gradients, optimizer state; "
        f"{inp.n_params:,} parameters, {inp.state_bytes_per_param:g} bytes of optimizer state each "
        f"[{inp.sources.get('state', 'given')}]; activations and buffers apart):",
        "",
        "| workers | " + " | ".join(f"fastest that fits, {link}" for link in links) + " | does not fit (needs) |",
        "|---:|" + "---|" * (len(links) + 1),
    ]
    for n in dict.fromkeys(c["workers"] for c in cells):
        mine = [next(c for c in cells if c["workers"] == n and c["link"] == link) for link in links]
        row = [str(n)]
        for c in mine:
            f = c["fastest_fitting"]
            if f is None:
                row.append("none fits")
            else:
                row.append(f"{f} {c['time_vs_fp32'][f]:.2f}" + ("" if f == c["winner"] else f" (not {c['winner']})"))
        need = mine[0]["memory_need"]
        over = [f"{m} {fmt_bytes(b)}" for m, b in need.items() if m not in mine[0]["fits"]]
        row.append(", ".join(over) if over else "-")
        out.append("| " + " | ".join(row) + " |")
    return out


def check_line(check: dict[str, Any]) -> str:
    parts = [
        f"{m} {c['predicted']:.2f} / {c['measured']:.2f}" + ("" if c.get("within_trust", True) else " missed†")
        for m, c in check["methods"].items()
    ]
    return (
        f"check, {MEASURED_WORKERS} emulated hosts at {check['rate']} (time to target / float32's, predicted / "
        f"measured): " + ", ".join(parts)
    )


# ------------------------------------------------------------------------- measurements


def measure_state_bytes(w: usermodel.Workload, flags: list[str] | tuple[str, ...] = ()) -> float:
    """Bytes of optimizer state per trainable parameter of the recipe's optimizer (the task's own when it has
    one): built on the model as the trainer builds it, one step on zero gradients (optimizers create their
    state on the first step), its state's tensors counted. AdamW: 8 (two moments), SGD with momentum: 4."""
    import torch

    from allreduce_train.optim import build_optimizer

    cfg = usermodel.config(w, flags)
    model, task = usermodel.build(w)
    opt = build_optimizer(cfg.optim, model, task)
    params = [p for p in model.parameters() if p.requires_grad]
    for p in params:
        p.grad = torch.zeros_like(p)
    opt.step()
    # a state tensor per parameter counts; per-tensor scalars (Adam's step count) are not per parameter
    held = sum(
        v.nelement() * v.element_size()
        for st in opt.state.values()
        for v in st.values()
        if torch.is_tensor(v) and v.dim() > 0
    )
    return held / max(1, sum(p.numel() for p in params))


def measure_compute(
    w: usermodel.Workload, batch: int, flags: list[str] | tuple[str, ...] = (), steps: int = 12, warmup: int = 3
) -> float:
    """Median seconds of one training step of one worker with one thread under the recipe ``flags``: forward
    and loss under the trainer's autocast, backward, the trainer's optimizer (the task's own when it has one)."""
    import torch

    from allreduce_train.optim import build_optimizer
    from allreduce_train.precision import Precision

    torch.set_num_threads(1)
    task, x, y = usermodel.first_batch(w, batch, 0, 1)
    cfg = usermodel.config(w, flags)
    torch.manual_seed(42)
    model = task.build_model()
    opt = build_optimizer(cfg.optim, model, task)
    precision = Precision(cfg.train.precision, torch.device("cpu"))  # 16-mixed: one line (CUDA only)
    times = []
    for i in range(warmup + steps):
        t0 = time.perf_counter()
        opt.zero_grad()
        with precision.forward_context():
            loss = task.loss(model, x, y)
        loss.backward()
        opt.step()
        if i >= warmup:
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def steps_from(
    results_path: str, model: str, methods: list[str]
) -> tuple[dict[str, float | None], int, dict, dict[str, str]]:
    """(steps ratios, the worker count, the float32 and concept jobs, the failed concepts' error lines) from a
    time-to-accuracy results.json. A job that failed (its record's ``ok`` false, its ``error`` the job's one
    line: lab/tta/main.py from lab/common/jobs.py's ``error_line``) is named as failed, not as slow."""
    try:
        with open(results_path) as fh:
            res = json.load(fh)
        mine = [j for j in res["jobs"] if j["model"] == model]
        jobs = [j for j in mine if j.get("ok")]
        crashed = [j for j in mine if not j.get("ok")]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise RecommendError(f"--steps-from: {results_path} is not a time-to-accuracy results.json ({e})") from None
    base = [j for j in jobs if j["method"] == tta_method("fp32") and j.get("reached")]
    if not base:
        bad = next((j for j in crashed if j["method"] == tta_method("fp32")), None)
        if bad is not None:
            raise RecommendError(
                f"--steps-from {results_path}: float32 ({tta_method('fp32')}) failed for {model}: "
                f"{bad.get('error', 'no error line recorded')} (see its log: {bad.get('log', 'the grid')})"
            )
        raise RecommendError(
            f"--steps-from {results_path}: float32 ({tta_method('fp32')}) did not reach the target "
            f"for {model}: no ratio to take (a lower target, or more --max-epochs)"
        )
    n = base[0]["workers"]
    by = {j["method"]: j for j in jobs if j["workers"] == n}
    errors = {j["method"]: j.get("error", "no error line recorded") for j in crashed if j["workers"] == n}
    ratios: dict[str, float | None] = {}
    failed: dict[str, str] = {}
    for m in methods:
        j = by.get(tta_method(m))
        ratios[m] = j["steps_to_target"] / by[tta_method("fp32")]["steps_to_target"] if j and j.get("reached") else None
        if j is None and tta_method(m) in errors:
            failed[m] = errors[tta_method(m)]
    return ratios, n, by, failed


def grid_recipe(results_path: str) -> list[str]:
    """The recipe flags a time-to-accuracy grid ran under (none recorded: the trainer's defaults)."""
    try:
        with open(results_path) as fh:
            return list(json.load(fh).get("config", {}).get("recipe", []))
    except (OSError, ValueError, AttributeError) as e:
        raise RecommendError(f"--steps-from: {results_path} is not a time-to-accuracy results.json ({e})") from None


def emulated_check(by: dict[str, dict], inp: Inputs, methods: list[str]) -> dict[str, Any] | None:
    """The model's time to the target over float32's for the emulated jobs (their own compute, their link, no
    latency) against the measured one, and whether the two agree within the trust factor (trust.check_holds)."""
    from ..common.links import link_network

    base = by.get(tta_method("fp32"))
    if not base or not base.get("reached") or not base.get("link_rate") or base.get("comm_wait_ms") is None:
        return None
    compute = max(0.0, (base["step_ms"] - base["comm_wait_ms"]) / 1e3)
    net = link_network(base["link_rate"])
    cell = predict_cell(inp, base["workers"], net.bandwidth, methods, latency_s=0.0, compute_s=compute)
    out = {"rate": base["link_rate"], "compute_ms": 1e3 * compute, "methods": {}}
    for m in methods:
        j = by.get(tta_method(m))
        if m != "fp32" and j and j.get("reached") and m in cell["time_vs_fp32"]:
            predicted, measured = cell["time_vs_fp32"][m], j["seconds_to_target"] / base["seconds_to_target"]
            out["methods"][m] = {
                "predicted": predicted,
                "measured": measured,
                "within_trust": trust.check_holds(predicted, measured),
            }
    return out


def steps_grid_argv(
    w: usermodel.Workload,
    target: str,
    methods: list[str],
    rate: str,
    out: str,
    max_epochs: int,
    evals_per_epoch: int,
    extra: list[str],
    batch: int,
    flags: list[str],
) -> list[str]:
    """The command of the time-to-accuracy grid at 2 emulated hosts for this model, under the recipe ``flags``."""
    argv = [
        sys.executable,
        "-m",
        "lab",
        "time-to-accuracy",
        "--workers",
        str(MEASURED_WORKERS),
        "--emulate-from",
        str(MEASURED_WORKERS),
        "--link-rate",
        rate,
        "--target",
        target if w.own else f"{w.model}={target}",
        "--methods",
        ",".join(tta_method(m) for m in methods),
        "--max-epochs",
        str(max_epochs),
        "--evals-per-epoch",
        str(evals_per_epoch),
        "--out-dir",
        out,
        *flags,  # the recipe, for every job of the grid
    ]
    argv += ["--task", w.task] if w.task else ["--model", w.model] if w.own else ["--models", w.model]
    for a in w.model_args:
        argv += ["--model-arg", a]
    if w.dataset and w.own and not w.task:
        argv += ["--dataset", w.dataset]
    for a in w.dataset_args:
        argv += ["--dataset-arg", a]
    for e in ["--batch-size", str(batch), *extra]:  # the batch whose compute was measured
        argv.append(f"--extra={e}")
    return argv


def run_steps_grid(argv: list[str], out: str, what: str) -> str:
    """Run the grid of :func:`steps_grid_argv` into ``out`` (``what``: the line that says so); returns its
    results.json."""
    from ..common.jobs import run

    print(what, flush=True)
    res = run(argv, timeout=24 * 3600, log_path=os.path.join(out + ".log"))
    path = os.path.join(out, "results.json")
    if not os.path.exists(path):
        raise RecommendError(f"the steps measurement failed: {res.error_line()} (see {out}.log)")
    return path


# ------------------------------------------------------------------------- the map

COLOURS = {
    "fp32": "#9e9e9e",
    "fp16": "#1f77b4",
    "bf16": "#17becf",
    "powersgd": "#ff7f0e",
    "localsgd": "#2ca02c",
    "localsgd-h16": "#98df8a",
    "zero": "#5e3c99",
}


def colour(label: str) -> str:
    """One colour per concept (concept-map's), local SGD H = 16 lighter than the other periods, every sharded
    stage alike."""
    if label in COLOURS:
        return COLOURS[label]
    if label.startswith("zero"):
        return COLOURS["zero"]
    return COLOURS.get(
        "powersgd" if label.startswith("powersgd") else "localsgd" if label.startswith("localsgd") else label, "black"
    )


def plot(
    path: str, inp: Inputs, cells: list[dict[str, Any]], methods: list[str], check: dict[str, Any] | None = None
) -> None:
    """The fastest concept to the target by link rate (x) and workers (y), the asked cells circled, the cells the
    model does not decide (its untrusted region, or a check that missed) hatched."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    bws = [0.01 * (40000 ** (i / 47)) for i in range(48)]  # 10 Mbit/s to 400 Gbit/s
    ns = [2 ** (1 + i / 4) for i in range(41)]  # 2 to 2048 workers
    fig, ax = plt.subplots(figsize=(7.5, 5.2))
    seen = set()
    for i, n in enumerate(ns):
        for j, g in enumerate(bws):
            c = judge(predict_cell(inp, max(2, round(n)), g * 1e9 / 8, methods), check)
            x0, x1 = (bws[j - 1] * g) ** 0.5 if j else g, (g * bws[j + 1]) ** 0.5 if j + 1 < len(bws) else g
            y0, y1 = (ns[i - 1] * n) ** 0.5 if i else n, (n * ns[i + 1]) ** 0.5 if i + 1 < len(ns) else n
            ax.fill_between(
                [x0, x1],
                y0,
                y1,
                color=colour(c["winner"]),
                alpha=1.0 if c["decided"] else 0.45,
                hatch=None if c["decided"] else "//",
                linewidth=0,
            )
            seen.add(c["winner"])
    for c in cells:
        g = c["bandwidth"] * 8 / 1e9
        ax.plot([g], [c["workers"]], "o", mfc="none", mec="black", ms=11, mew=1.8)
        ax.annotate(
            f"{c['winner']}{'' if c['decided'] else '?'}",
            (g, c["workers"]),
            textcoords="offset points",
            xytext=(8, 6),
            fontsize=8,
        )
    ax.set_xscale("log")
    ax.set_yscale("log", base=2)
    ax.set_xlabel("link rate per worker, Gbit/s")
    ax.set_ylabel("workers")
    ax.set_title(
        f"{inp.model}: fastest to the target (steps ratio from {inp.ratio_workers} workers), "
        f"latency {1e6 * inp.latency_s:g} us",
        fontsize=9,
    )
    handles = [Patch(color=colour(m), label=m) for m in methods if m in seen]
    handles.append(Patch(facecolor="white", edgecolor="black", hatch="//", label="not decided by the model"))
    ax.legend(handles=handles, fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ------------------------------------------------------------------------- command line


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--model",
        default="",
        metavar="MODULE:CALLABLE",
        help="your own model (a callable returning an nn.Module), or a registered name",
    )
    p.add_argument("--task", default="", metavar="MODULE:CALLABLE", help="your own task (an allreduce_train.Task)")
    p.add_argument(
        "--model-arg",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="keyword argument for --model's/--task's callable (repeatable)",
    )
    p.add_argument(
        "--dataset",
        default="",
        help="your own --model's data: MODULE:CALLABLE or a name (default: the trainer's, fashion-mnist)",
    )
    p.add_argument(
        "--dataset-arg",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="keyword argument for --dataset's callable (repeatable)",
    )
    p.add_argument(
        "--target",
        required=True,
        help="the quality target, as the trainer's --target: 'eval/accuracy>=0.85', 'eval/loss<=2.5'",
    )
    p.add_argument("--workers", default="8,64,512", help="worker counts of your cluster (default: 8,64,512)")
    p.add_argument("--link", default="10gbit,100gbit", help="link rates per worker (default: 10gbit,100gbit)")
    p.add_argument("--latency", default="50us", help="per-message latency of your network, assumed (default: 50us)")
    p.add_argument(
        "--methods",
        default=",".join(DEFAULT_METHODS),
        help=f"concepts to compare (default: {','.join(DEFAULT_METHODS)}; fp32 is always in; the sharded "
        "stages are zero1, zero2, zero3)",
    )
    p.add_argument(
        "--memory-per-rank",
        default="",
        metavar="SIZE",
        help="memory per rank (e.g. 16GiB, 512MiB, 2G): also answer which concept is fastest among those whose "
        "parameters, gradients and optimizer state fit; adds zero1,zero2,zero3 to --methods",
    )
    recipe.add_trainer_flag(p, "batch_size", "per worker, as the trainer's")
    p.add_argument(
        "--compute-ms",
        type=float,
        default=0.0,
        help="compute per step of one worker on YOUR hardware, instead of measuring it here",
    )
    p.add_argument(
        "--steps-from",
        default="",
        metavar="DIR",
        help="take the steps ratios from a finished time-to-accuracy grid (its results.json) instead of measuring them",
    )
    p.add_argument(
        "--measure-rate",
        default="1gbit",
        help="the emulated hosts' link rate for the steps measurement and the check (default: 1gbit)",
    )
    p.add_argument("--max-epochs", type=int, default=5, help="the measurement's epoch limit per job (default: 5)")
    p.add_argument(
        "--evals-per-epoch",
        type=int,
        default=8,
        help="evaluations per epoch in the measurement: the steps' resolution (default: 8)",
    )
    p.add_argument(
        "--extra",
        action="append",
        default=[],
        metavar="ARG",
        help="an extra trainer argument for the measurement's jobs, e.g. --extra=--lr --extra=0.003",
    )
    p.add_argument("--out", default="", help="output directory (default: runs/recommend/<time>)")
    recipe.add_arguments(p)


def _ints(text: str, flag: str) -> list[int]:
    try:
        vals = sorted({int(v) for v in text.split(",") if v.strip()})
    except ValueError:
        raise RecommendError(f"{flag} {text!r}: expected comma-separated integers, e.g. 8,64,512") from None
    if not vals or vals[0] < 2:
        raise RecommendError(f"{flag} {text!r}: worker counts must be >= 2")
    return vals


def parse_methods(text: str) -> list[str]:
    out = ["fp32"]
    for v in (v.strip() for v in text.split(",") if v.strip()):
        try:
            m = costmodel.Method.parse(v)
        except ValueError as e:
            raise RecommendError(f"--methods: {e}") from None
        if "+" in m.label:
            raise RecommendError(f"--methods {v}: local SGD with 16 bits is not in the time-to-accuracy grid")
        if m.label not in out:
            out.append(m.label)
    return out


def recommend(args: argparse.Namespace) -> dict[str, Any]:
    from allreduce_train.config import parse_target
    from allreduce_train.errors import UserError

    if bool(args.model) == bool(args.task):
        raise RecommendError("give your model as --model MODULE:CALLABLE (with --dataset) or --task MODULE:CALLABLE")
    try:
        parse_target(args.target)
    except UserError as e:
        raise RecommendError(str(e)) from None
    workers, links = _ints(args.workers, "--workers"), parse_links(args.link)
    latency, methods = parse_latency(args.latency), parse_methods(args.methods)
    memory_limit = parse_size(args.memory_per_rank) if args.memory_per_rank else 0.0
    if memory_limit:  # the stages the trainer runs on the grid's engine (lab/common/methods.py)
        methods += [m for m in SHARDED_METHODS if m not in methods and tta_method(m) in registry()]
    if args.batch_size < 1 or args.compute_ms < 0 or args.max_epochs < 1 or args.evals_per_epoch < 1:
        raise RecommendError("--batch-size, --max-epochs and --evals-per-epoch must be >= 1, --compute-ms >= 0")
    parse_links(args.measure_rate)
    w = usermodel.from_args(
        args.model, task=args.task, dataset=args.dataset, model_args=args.model_arg, dataset_args=args.dataset_arg
    )
    out = args.out or os.path.join("runs", "recommend", time.strftime("%Y%m%d-%H%M%S"))
    flags = recipe.argv(args)
    if args.steps_from:
        ran_under = grid_recipe(os.path.join(args.steps_from, "results.json"))
        if ran_under != flags:
            raise RecommendError(
                f"--steps-from {args.steps_from}: its grid ran under {recipe.describe(ran_under)}; this "
                f"recommendation asks for {recipe.describe(flags)}: give the same recipe flags, or leave out "
                "--steps-from to measure the steps under yours"
            )
    try:
        if flags:
            recipe.check(w, [*flags, *args.extra])
        shapes = [tuple(s) for s in usermodel.shapes(w)]
        modules = usermodel.modules(w)
        compute = args.compute_ms / 1e3 if args.compute_ms else measure_compute(w, args.batch_size, flags)
        state = measure_state_bytes(w, flags) if memory_limit else 0.0
    except UserError as e:
        raise RecommendError(str(e)) from None
    sources = {
        "compute": "given: --compute-ms"
        if args.compute_ms
        else "measured here: 1 worker, 1 thread, median of 12 steps of the recipe",
        "shapes": "measured here: the model's trainable parameters",
    }
    if memory_limit:
        sources["state"] = "measured here: the recipe's optimizer after one step"
    os.makedirs(out, exist_ok=True)
    if args.steps_from:
        results = os.path.join(args.steps_from, "results.json")
        sources["steps"] = f"measured: {results}"
    else:
        from ..emulation.netns import unavailable_reason

        reason = unavailable_reason()
        if reason:
            raise RecommendError(f"measuring the steps needs emulated hosts: {reason}; or give --steps-from DIR")
        grid = os.path.join(out, "steps")
        argv = steps_grid_argv(
            w,
            args.target,
            methods,
            args.measure_rate,
            grid,
            args.max_epochs,
            args.evals_per_epoch,
            args.extra,
            args.batch_size,
            flags,
        )
        what = (
            f"measuring the steps to {args.target} on {MEASURED_WORKERS} emulated hosts at {args.measure_rate}: "
            f"{len(methods)} training jobs -> {grid}"
        )
        results = run_steps_grid(argv, grid, what)
        sources["steps"] = f"measured here: {MEASURED_WORKERS} emulated hosts at {args.measure_rate}, {results}"
    ratios, n_measured, jobs, failed = steps_from(results, w.name, methods)
    ran = recipe.ran_lines(jobs.values(), "method")
    sources["recipe"] = "the steps grid ran: " + ("; ".join(ran) if ran else "not recorded")
    inp = Inputs(
        w.name,
        shapes,
        compute,
        args.batch_size,
        latency,
        ratios,
        n_measured,
        sources,
        failed,
        recipe=recipe.describe(flags),
        modules=modules,
        memory_limit=memory_limit,
        state_bytes_per_param=state,
    )
    check = emulated_check(jobs, inp, methods)
    cells = plan(inp, workers, links, methods, check)
    text = summary(inp, cells, methods, check, out)
    plot(os.path.join(out, "recommend.png"), inp, cells, methods, check)
    res = {
        "command": ["python", "-m", "lab", *sys.argv[1:]],
        "inputs": asdict(inp),
        "cells": cells,
        "check": check,
        "methods": methods,
        "target": args.target,
        "trust": {"miss": trust.MISS, "note": trust.note()},
    }
    with open(os.path.join(out, "recommend.json"), "w") as fh:
        json.dump(res, fh, indent=1, default=str)
        fh.write("\n")
    with open(os.path.join(out, "report.md"), "w") as fh:
        fh.write(f"`{' '.join(res['command'])}`\n\n{text}\n\n![map](recommend.png)\n")
    print(text, flush=True)
    return res


def main(args: argparse.Namespace) -> int:
    try:
        recommend(args)
    except RecommendError as e:
        print(f"recommend: error: {e}", file=sys.stderr)
        return 2
    return 0
