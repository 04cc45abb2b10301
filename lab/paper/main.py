"""``make paper`` = ``python -m lab paper``: the design of Jäger et al. (2018) run on this project's grids.

    python -m lab paper                               # the whole design (needs root: emulated hosts)
    python -m lab paper --dry-run                     # the commands it would run, nothing run
    python -m lab paper --report runs/paper/<time>    # the report again from the grids' results

The paper compared a centralized parameter server (TensorFlow 1.8: dedicated server processes) with a
decentralized one (MXNet 1.3: a server beside each worker) by throughput and speedup over workers, LeNet-5
on Fashion-MNIST and a 2x200 LSTM language model. Here the same trainer, models, data and engine serve both
placements, and the ring on two engines stands beside them, so concept and implementation come apart.
No runner of its own: it runs two existing grids, one after the other, and reads their results.json:

1. throughput and speedup: ``python -m lab scaling-netns`` -- both models, 1, 2 and 4 workers, one emulated
   host each (a dedicated server on a host of its own), at 1 Gbit/s and 100 Mbit/s per link; the dedicated
   PS (state K = --ps-servers), the colocated PS, the ring on Horovod and on the mpi4py engine; synchronous
   (the grid's plans, synthetic data; every job's no-exchange bound beside it);
2. time to a stated quality: ``python -m lab time-to-accuracy`` -- LeNet-5 on the real Fashion-MNIST to test
   accuracy 0.89 with the six exchanges (the ring on both engines; the PS synchronous and asynchronous, as
   both of the paper's frameworks offer, dedicated and colocated) on 4 emulated hosts at the same rates.

Output in ``runs/paper/<time>/``: ``report.md`` (a verdict per finding, with its conditions and the cost
model beside the measurement), ``paper.png`` (the paper's style of figure: throughput and speedup over
workers, one line per concept and rate; time to quality), ``paper.json``, ``tensorboard/`` (the same as a
Custom Scalars comparison: ``make tensorboard RUN=.../tensorboard``), and the grids' own outputs in
``throughput/`` and ``tta/``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from ..common import costmodel, engines, gradients, tblog
from ..common.links import RateError, link_network, parse_rates
from ..common.plots import STYLE, no_data

PAPER_MODELS = ("lenet5", "ptb-lstm-small")  # the paper's two workloads
SMALL, BIG = "lenet5", "ptb-lstm-small"  # "the small network" and "the bigger one" of its findings
STRATEGIES = ("ps-dedicated", "ps-colocated", "allreduce", "allreduce-mpi")
LABELS = {"ps-dedicated": "centralized PS (dedicated servers; TF 1.8's)",
          "ps-colocated": "decentralized PS (colocated; MXNet 1.3's)",
          "allreduce": "ring allreduce, Horovod", "allreduce-mpi": "ring allreduce, mpi4py engine"}
# the time-to-accuracy grid's methods as the comparison's runs (one colour per concept in every chart)
SHORT = {"ps-dedicated": "centralized PS (dedicated)", "ps-colocated": "decentralized PS (colocated)",
         "allreduce": "ring, Horovod", "allreduce-mpi": "ring, mpi4py engine"}
TTA_RUNS = {"ring-horovod": "allreduce", "ring-mpi": "allreduce-mpi", "ps-sync-dedicated": "ps-dedicated",
            "ps-sync-colocated": "ps-colocated", "ps-async-dedicated": "ps-dedicated-async",
            "ps-async-colocated": "ps-colocated-async"}
# Single jobs on a shared 2-core machine: repeated grids put throughput ratios 5-10 % apart
# (docs/emulated_cluster.md), so a difference under this is "no significant difference".
TOLERANCE = 0.10
RATE_STYLE = ("-", "--", ":", "-.")


@dataclass
class PaperConfig:
    models: list[str] = field(default_factory=lambda: list(PAPER_MODELS))
    hosts: list[int] = field(default_factory=lambda: [1, 2, 4])
    rates: list[str] = field(default_factory=lambda: ["1gbit", "100mbit"])
    ps_servers: int = 1  # K, the dedicated PS's servers (TensorFlow's ps tasks)
    steps: int = 0  # measured steps per throughput job; 0: the scaling grid's plan
    tta_models: list[str] = field(default_factory=lambda: [SMALL])
    tta_workers: list[int] = field(default_factory=lambda: [4])
    tta_rates: list[str] = field(default_factory=list)  # empty: the throughput grid's rates
    tta_max_epochs: int = 0  # 0: the workload's
    tta_target: str = ""  # MODEL=METRIC>=VALUE instead of the workload's (time-to-accuracy's --target)
    out_dir: str = ""


class PaperError(Exception):
    """Bad input; the message names the flag."""


def _ints(text: str, flag: str) -> list[int]:
    try:
        vals = sorted({int(v) for v in text.split(",") if v.strip()})
    except ValueError:
        raise PaperError(f"{flag}: expected comma-separated integers (got {text!r})") from None
    if not vals or vals[0] < 1:
        raise PaperError(f"{flag}: give worker counts >= 1, e.g. 1,2,4 (got {text!r})")
    return vals


def _models(text: str, flag: str, allow_none: bool = False) -> list[str]:
    vals = [v.strip() for v in text.split(",") if v.strip()]
    if allow_none and vals == ["none"]:
        return []
    bad = [v for v in vals if v not in PAPER_MODELS]
    if not vals or bad:
        raise PaperError(f"{flag}: the paper's models are {', '.join(PAPER_MODELS)} (got {text!r})"
                         + ("; 'none' skips the time-to-quality grid" if allow_none else ""))
    return vals


def config_from_args(args: argparse.Namespace) -> PaperConfig:
    rates = _rates(args.rates, "--rates")
    tta_rates = _rates(args.tta_rates, "--tta-rates") if args.tta_rates else []
    hosts = _ints(args.hosts, "--hosts")
    if 1 not in hosts:
        raise PaperError(f"--hosts: include 1, the speedup's baseline (got {args.hosts!r})")
    for flag, v, lo in (("--ps-servers", args.ps_servers, 1), ("--steps", args.steps, 0),
                        ("--tta-max-epochs", args.tta_max_epochs, 0)):
        if v < lo:
            raise PaperError(f"{flag} must be >= {lo} (got {v})")
    return PaperConfig(models=_models(args.models, "--models"), hosts=hosts, rates=rates,
                       ps_servers=args.ps_servers, steps=args.steps,
                       tta_models=_models(args.tta_models, "--tta-models", allow_none=True),
                       tta_workers=_ints(args.tta_workers, "--tta-workers"), tta_rates=tta_rates,
                       tta_max_epochs=args.tta_max_epochs, tta_target=_target(args.tta_target),
                       out_dir=args.out_dir)


def _target(text: str) -> str:
    """time-to-accuracy's --target, checked here so that a typo fails before the throughput grid runs."""
    if not text:
        return ""
    model, sep, target = text.partition("=")
    op = ">=" if ">=" in target else "<=" if "<=" in target else ""
    metric, _, value = target.partition(op) if op else ("", "", "")
    try:
        float(value)
    except ValueError:
        op = ""
    if not sep or model not in PAPER_MODELS or not op or not metric:
        raise PaperError(f"--tta-target {text!r}: write MODEL=METRIC>=VALUE (or <=), e.g. "
                         "lenet5=eval/accuracy>=0.89")
    return text


def _rates(text: str, flag: str) -> list[str]:
    try:
        return parse_rates(text)
    except RateError as e:
        raise PaperError(str(e).replace("--rates", flag)) from None


def plan(cfg: PaperConfig, out: str) -> list[tuple[str, list[str]]]:
    """The grids to run, as (what, argv): the existing ``python -m lab`` commands, nothing of its own."""
    py = [sys.executable, "-m", "lab"]
    steps = [("throughput", [*py, "scaling-netns", "--hosts", ",".join(map(str, cfg.hosts)),
                             "--rates", ",".join(cfg.rates), "--models", ",".join(cfg.models),
                             "--strategies", ",".join(STRATEGIES), "--ps-servers", str(cfg.ps_servers),
                             *(["--steps", str(cfg.steps)] if cfg.steps else []),
                             "--out-dir", os.path.join(out, "throughput")])]
    if cfg.tta_models:
        workers = ",".join(map(str, cfg.tta_workers))
        steps.append(("time to quality", [
            *py, "time-to-accuracy", "--models", ",".join(cfg.tta_models), "--methods", ",".join(TTA_RUNS),
            "--workers", workers, "--emulate-from", str(min(cfg.tta_workers)),
            "--rates", ",".join(cfg.tta_rates or cfg.rates),
            *(["--max-epochs", str(cfg.tta_max_epochs)] if cfg.tta_max_epochs else []),
            *(["--target", cfg.tta_target] if cfg.tta_target else []),
            "--out-dir", os.path.join(out, "tta")]))
    return steps


# ------------------------------------------------------------------------- reading the grids

def _read(path: str) -> Any:
    try:
        with open(path) as fh:
            return json.load(fh)
    except (OSError, ValueError):
        return None


def collect(out: str) -> dict[str, Any]:
    """The figures the report needs, from the grids' results.json under ``out``.

    points: one per (model, rate, strategy, N) -- measured samples/s (mean over repeats), speedup over the
    same strategy's N = 1, and the cost model's step beside the measured one (scaling-netns): predicted
    samples/s = measured samples/s x measured step / predicted step. tta: every time-to-accuracy job."""
    top = _read(os.path.join(out, "throughput", "results.json")) or {}
    pred = {(r["rate"], r["model"], r["strategy"], r["workers"]): r for r in top.get("rows", []) if r.get("ok")}
    points, loads = [], {}
    for rate in top.get("rates", []):
        grid = _read(os.path.join(out, "throughput", rate, "results.json")) or {}
        loads[rate] = grid.get("loadavg", "")
        # the 1-minute load average before each job: on a shared machine the jobs' figures move with it
        before = {(j["model"], j["strategy"], j["workers"]): j.get("loadavg_before") for j in grid.get("jobs", [])}
        for r in grid.get("rows", []):
            if r["strategy"] not in STRATEGIES or not r["repeats"]:
                continue
            p = pred.get((rate, r["model"], r["strategy"], r["workers"]), {})
            pt = {"model": r["model"], "rate": rate, "strategy": r["strategy"], "workers": r["workers"],
                  "samples_per_sec": r["samples_per_sec_mean"], "samples_per_sec_std": r["samples_per_sec_std"],
                  "speedup": r["speedup"], "step_ms": p.get("step_ms"), "wait_ms": p.get("wait_ms"),
                  "pred_step_ms": p.get("pred_step_ms"), "model_mb_per_step": (p.get("model_bytes_per_step") or 0) / 1e6,
                  "load": _first(before.get((r["model"], r["strategy"], r["workers"])))}
            pt["pred_samples_per_sec"] = (pt["samples_per_sec"] * pt["step_ms"] / pt["pred_step_ms"]
                                          if pt["step_ms"] and pt["pred_step_ms"] else math.nan)
            points.append(pt)
    one = {(p["model"], p["rate"], p["strategy"]): p for p in points if p["workers"] == 1}
    for p in points:
        b = one.get((p["model"], p["rate"], p["strategy"]))
        p["pred_speedup"] = p["pred_samples_per_sec"] / b["pred_samples_per_sec"] if b else math.nan
    tta = _read(os.path.join(out, "tta", "results.json")) or {}
    tta_cmd = tta.get("command", "")
    return {"points": points, "loads": loads, "tta": tta.get("jobs", []), "targets": tta.get("targets", {}),
            "tta_command": shlex.join(tta_cmd) if isinstance(tta_cmd, list) else tta_cmd,
            "throughput_command": top.get("command", ""), "throughput_minutes": top.get("minutes"), "tta_minutes": tta.get("minutes"),
            "mpi_allreduce": top.get("mpi_allreduce", "")}


def _first(load: Any) -> float | None:
    """The 1-minute figure of a job's load average (recorded as [1, 5, 15] or one number)."""
    if isinstance(load, (list, tuple)):
        return load[0] if load else None
    return load


def _ratio_word(r: float, better: str, worse: str) -> str:
    if math.isnan(r):
        return "no figure"
    if r > 1 + TOLERANCE:
        return better
    if r < 1 - TOLERANCE:
        return worse
    return f"no significant difference (within {TOLERANCE:.0%})"


def findings(data: dict[str, Any]) -> list[dict[str, Any]]:
    """Per model, rate and N > 1: the decentralized (colocated) PS against the centralized (dedicated) one,
    in speedup (the paper's figure) and in throughput (what a user gets), measured and modelled, and the
    verdict on the paper's finding for that model (small: decentralized scales better; big: no
    significant difference)."""
    at = {(p["model"], p["rate"], p["strategy"], p["workers"]): p for p in data["points"]}
    out = []
    for (model, rate, strategy, n), col in sorted(at.items()):
        ded = at.get((model, rate, "ps-dedicated", n))
        if strategy != "ps-colocated" or n == 1 or ded is None:
            continue
        sp = col["speedup"] / ded["speedup"] if ded["speedup"] else math.nan
        thr = col["samples_per_sec"] / ded["samples_per_sec"]
        pthr = col["pred_samples_per_sec"] / ded["pred_samples_per_sec"] if ded["pred_samples_per_sec"] else math.nan
        psp = col["pred_speedup"] / ded["pred_speedup"] if ded["pred_speedup"] else math.nan
        if model == SMALL:
            claim = "decentralized PS scales better"
            holds = sp > 1 + TOLERANCE
        else:
            claim = "no significant difference"
            holds = abs(sp - 1) <= TOLERANCE
        out.append({"model": model, "rate": rate, "workers": n, "claim": claim,
                    "speedup_dedicated": ded["speedup"], "speedup_colocated": col["speedup"],
                    "speedup_ratio": sp, "pred_speedup_ratio": psp, "throughput_ratio": thr,
                    "pred_throughput_ratio": pthr, "holds": bool(holds),
                    "speedup_says": _ratio_word(sp, "decentralized scales better", "centralized scales better"),
                    "throughput_says": _ratio_word(thr, "decentralized faster", "centralized faster")})
    return out


# ------------------------------------------------------------------------- outputs

def markdown(data: dict[str, Any], meta: dict[str, Any]) -> str:
    f = findings(data)
    out = ["# The paper's findings on this project", "",
           f"`{meta['command']}`, started {meta['started']}, {meta['minutes']:.1f} min on {meta['cpus']} cores "
           f"(load average {meta['load']}). One job per point: a ratio within {TOLERANCE:.0%} of 1 counts as "
           "no significant difference. Load average (1 min) before the throughput jobs: "
           + (", ".join(f"{r}: {v}" for r, v in data.get("loads", {}).items() if v) or "not recorded")
           + f" on {meta['cpus']} cores: where it is far above the core count the jobs shared the cores with "
           "other work, and single ratios carry that noise.", "",
           "The grids' own commands (their reports: throughput/report.md, tta/report.md): "
           + "; ".join(f"`{c}` ({m:.1f} min)" if isinstance(m, (int, float)) else f"`{c}`"
                       for c, m in ((data["throughput_command"], data["throughput_minutes"]),
                                    (data["tta_command"], data["tta_minutes"])) if c) + ".", "",
           "Centralized PS = dedicated servers (the paper's TensorFlow 1.8 setup), decentralized PS = a server "
           "beside each worker (its MXNet 1.3 setup); both on this trainer's mpi4py engine, synchronous. "
           "Speedup = samples/s at N / the same strategy's at N = 1; the cost model (lab/common/costmodel.py) "
           "predicts each step as the job's measured compute plus the modelled exchange at the link rate.", "",
           "## Verdicts per finding", "",
           "| model | rate | N | paper's finding | speedup ded. | speedup col. | col./ded. speedup (model) | "
           "col./ded. samples/s (model) | speedup says | holds here |",
           "|---|---|---:|---|---:|---:|---:|---:|---|---|"]
    for r in f:
        out.append(f"| {r['model']} | {r['rate']} | {r['workers']} | {r['claim']} | {r['speedup_dedicated']:.2f} | "
                   f"{r['speedup_colocated']:.2f} | {r['speedup_ratio']:.2f} ({r['pred_speedup_ratio']:.2f}) | "
                   f"{r['throughput_ratio']:.2f} ({r['pred_throughput_ratio']:.2f}) | {r['speedup_says']} | "
                   f"{'yes' if r['holds'] else 'no'} |")
    if not f:
        out.append("| no pair of dedicated and colocated PS jobs measured | | | | | | | | | |")
    out += ["", "## Throughput and speedup", "",
            "| model | rate | strategy | N | samples/s | speedup | model's samples/s | step ms | wait ms | "
            "model's step ms | load |", "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for p in sorted(data["points"], key=lambda p: (p["model"], p["rate"], STRATEGIES.index(p["strategy"]),
                                                    p["workers"])):
        out.append(f"| {p['model']} | {p['rate']} | {p['strategy']} | {p['workers']} | {p['samples_per_sec']:.1f} | "
                   f"{p['speedup']:.2f} | {_f(p['pred_samples_per_sec'], '.1f')} | {_f(p['step_ms'], '.1f')} | "
                   f"{_f(p['wait_ms'], '.1f')} | {_f(p['pred_step_ms'], '.1f')} | {_f(p.get('load'), '.1f')} |")
    out += k_markdown(data)
    out += ["", "## Concept and implementation apart", ""]
    keys = sorted({(p["model"], p["rate"], p["workers"]) for p in data["points"] if p["workers"] > 1})
    for model, rate, n in keys:
        speed = {p["strategy"]: p["samples_per_sec"] for p in data["points"]
                 if (p["model"], p["rate"], p["workers"]) == (model, rate, n)}
        out += engines.markdown(f"{model}, {n} hosts at {rate}", speed, engines.SCALING, "samples/s", ".1f")
    out += tta_markdown(data)
    return "\n".join(out) + "\n"


def k_rows(data: dict[str, Any]) -> list[dict[str, Any]]:
    """The cost model's answer to "under which conditions": per model and rate at the largest N, the
    colocated PS's step against the dedicated PS's with K = 1, 2 and N servers, each at the compute
    measured in the colocated job (step - wait) and the emulated link (alpha = 0)."""
    out = []
    for p in data["points"]:
        top = max(q["workers"] for q in data["points"] if q["model"] == p["model"])
        if p["strategy"] != "ps-colocated" or p["workers"] != top or top < 2 or not p["step_ms"]:
            continue
        n, net, size = top, link_network(p["rate"]), gradients.nbytes(p["model"])
        compute = max(0.0, (p["step_ms"] - (p["wait_ms"] or 0.0)) / 1e3)
        col = compute + costmodel.exchange_time(costmodel.PS_COLOCATED, n, size, net)
        ded = {k: compute + costmodel.exchange_time(costmodel.PS_DEDICATED, n, size, net, servers=k)
               for k in sorted({1, 2, n})}
        out.append({"model": p["model"], "rate": p["rate"], "workers": n, "mb": size / 1e6,
                    "compute_ms": 1e3 * compute, "colocated_ms": 1e3 * col,
                    "dedicated_ms": {k: 1e3 * v for k, v in ded.items()},
                    "ratio": {k: v / col for k, v in ded.items()}})
    return out


def k_markdown(data: dict[str, Any]) -> list[str]:
    rows = k_rows(data)
    if not rows:
        return []
    ks = sorted({k for r in rows for k in r["ratio"]})
    out = ["", "## The cost model: which K makes the placements equal", "",
           "Colocated PS's samples/s over the dedicated PS's (= dedicated step / colocated step) as the cost "
           "model predicts it with K dedicated servers, each on a host of its own, at the compute measured in "
           "the colocated job: the dedicated servers' links carry N x S / K in and then out per step (push, then "
           "pull), a colocated host's link 2(N-1)/N x S each way at once (lab/common/costmodel.py).", "",
           "| model | rate | N | S (MB) | compute ms | colocated step ms | " +
           " | ".join(f"K={k}: ded./col." for k in ks) + " |", "|---|---|---:|---:|---:|---:|" + "---:|" * len(ks)]
    for r in rows:
        out.append(f"| {r['model']} | {r['rate']} | {r['workers']} | {r['mb']:.2f} | {r['compute_ms']:.1f} | "
                   f"{r['colocated_ms']:.1f} | " + " | ".join(_f(r["ratio"].get(k), ".2f") for k in ks) + " |")
    return out


def tta_markdown(data: dict[str, Any]) -> list[str]:
    jobs = data["tta"]
    if not jobs:
        return ["## Time to quality", "", "Not run (--tta-models none) or no results.", ""]
    out = ["## Time to quality", "", "Targets: " + ", ".join(f"{m}: `{t}`" for m, t in data["targets"].items())
           + " (the time-to-accuracy grid's; real data).", "",
           "| model | rate | N | method | samples/s | reached | seconds | steps | vs its sync peer (s) |",
           "|---|---|---:|---|---:|---|---:|---:|---:|"]
    by = {(j["model"], j.get("link_rate"), j["workers"], j["method"]): j for j in jobs}
    for j in jobs:
        if not j.get("ok"):
            out.append(f"| {j['model']} | {j.get('link_rate')} | {j['workers']} | {j['method']} | failed: "
                       f"{j.get('error', '')} | | | | |")
            continue
        peer = by.get((j["model"], j.get("link_rate"), j["workers"], j["method"].replace("-async-", "-sync-")))
        vs = ("–" if peer is j or not peer or not j.get("reached") or not peer.get("reached")
              else f"{j['seconds_to_target'] / peer['seconds_to_target']:.2f}x")
        out.append(f"| {j['model']} | {j.get('link_rate')} | {j['workers']} | {j['method']} | "
                   f"{j['samples_per_sec']:.0f} | {'yes' if j.get('reached') else 'no'} | "
                   f"{_f(j.get('seconds_to_target'), '.1f')} | {j.get('steps_to_target', j.get('steps'))} | {vs} |")
    return out + [""]


def _f(v: Any, spec: str) -> str:
    return "–" if v is None or (isinstance(v, float) and math.isnan(v)) else format(v, spec)


def plot(path: str, data: dict[str, Any]) -> None:
    """paper.png, the paper's figure: per model, samples/s and speedup over workers (one colour per concept,
    one line style per link rate), and the time to quality per method."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = list(dict.fromkeys(p["model"] for p in data["points"])) or list(PAPER_MODELS)
    rates = list(dict.fromkeys(p["rate"] for p in data["points"]))
    tta = [j for j in data["tta"] if j.get("ok")]
    cols = 3 if tta else 2
    fig, axes = plt.subplots(len(models), cols, figsize=(5.2 * cols, 3.9 * len(models)), squeeze=False)
    for row, model in zip(axes, models):
        pts = [p for p in data["points"] if p["model"] == model]
        if not pts:
            for ax in row:
                no_data(ax, f"{model}: no throughput job finished")
            continue
        ns = sorted({p["workers"] for p in pts})
        row[1].plot(ns, ns, color="0.6", ls=":", label="ideal")
        for s in STRATEGIES:
            color, marker = STYLE.get(s, ("black", "x"))
            for i, rate in enumerate(rates):
                line = sorted((p for p in pts if p["strategy"] == s and p["rate"] == rate), key=lambda p: p["workers"])
                if not line:
                    continue
                kw = dict(color=color, marker=marker, ls=RATE_STYLE[i % len(RATE_STYLE)], label=f"{SHORT[s]}, {rate}")
                row[0].errorbar([p["workers"] for p in line], [p["samples_per_sec"] for p in line],
                                yerr=[p["samples_per_sec_std"] for p in line], capsize=3, **kw)
                row[1].plot([p["workers"] for p in line], [p["speedup"] for p in line], **kw)
        for ax, what in ((row[0], "throughput (samples/s, all workers)"), (row[1], "speedup over N = 1")):
            ax.set_title(f"{model}: {what}", fontsize=9)
            ax.set_xlabel("workers N (one emulated host each)")
            ax.set_xticks(ns)
            ax.grid(alpha=0.3)
        row[0].set_ylim(bottom=0)
        row[1].set_ylim(bottom=0)
        row[1].legend(fontsize=6, loc="upper left", framealpha=0.6, ncol=1)
        if tta:
            _plot_tta(row[2], model, [j for j in tta if j["model"] == model], data["targets"].get(model, ""))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _plot_tta(ax, model: str, jobs: list[dict[str, Any]], target: str) -> None:
    if not jobs:
        no_data(ax, f"{model}: no time-to-quality job (--tta-models)")
        return
    labels, values, colors = [], [], []
    for j in jobs:
        run = TTA_RUNS.get(j["method"], j["method"])
        labels.append(f"{j['method']} N={j['workers']} {j.get('link_rate') or ''}")
        values.append(j["seconds_to_target"] if j.get("reached") else 0.0)
        colors.append(STYLE.get(run.replace("-async", ""), ("0.5", ""))[0])
    bars = ax.barh(range(len(values)), values, color=colors)
    for b, j in zip(bars, jobs):
        if not j.get("reached"):
            ax.text(0, b.get_y() + b.get_height() / 2, " not reached", va="center", fontsize=7)
        elif not j["synchronous"]:
            b.set_hatch("//")
    ax.set_yticks(range(len(values)))
    ax.set_yticklabels(labels, fontsize=6)
    ax.invert_yaxis()
    ax.set_xlabel("seconds to the target (async hatched)")
    ax.set_title(f"{model}: time to {target}", fontsize=9)
    ax.grid(alpha=0.3, axis="x")


def write_tensorboard(out: str, data: dict[str, Any]) -> None:
    """The comparison logdir: one run per concept (the asynchronous PS runs of their own), step = N, tags
    ``paper/samples_per_sec|speedup|time_to_target_s/<model>/<rate>``, one chart per figure, model and rate."""
    series: tblog.Series = {}
    charts: dict[str, list[tuple[str, str]]] = {}
    for p in data["points"]:
        m, rate = p["model"], p["rate"]
        tblog.add_point(series, p["strategy"], f"paper/samples_per_sec/{m}/{rate}", p["workers"], p["samples_per_sec"])
        tblog.add_point(series, p["strategy"], f"paper/speedup/{m}/{rate}", p["workers"], p["speedup"])
    for j in data["tta"]:
        if j.get("ok") and j.get("reached"):
            tblog.add_point(series, TTA_RUNS.get(j["method"], j["method"]),
                            f"paper/time_to_target_s/{j['model']}/{j.get('link_rate')}", j["workers"],
                            j["seconds_to_target"])
    tags = sorted({t for tags in series.values() for t in tags})
    titles = {"samples_per_sec": "samples/s, all workers", "speedup": "speedup = samples/s(N) / samples/s(1)",
              "time_to_target_s": "seconds to the quality target"}
    for t in tags:
        _, fig, model, rate = t.split("/")
        charts.setdefault(model, []).append((f"{model} at {rate}: {titles[fig]}", t))
    tblog.write_comparison(os.path.join(out, tblog.COMPARISON_DIR), series, list(charts.items()),
                           "Step = number of workers N (one emulated host each); one run per concept; the link rate "
                           "in the tag. docs/paper.md reads these figures against the paper's findings.")


def report(out: str, meta: dict[str, Any]) -> dict[str, Any]:
    """report.md, paper.json, paper.png and tensorboard/ from the grids' results under ``out``."""
    data = collect(out)
    res = {**meta, "findings": findings(data), "k_model": k_rows(data), **data}
    with open(os.path.join(out, "paper.json"), "w") as fh:
        json.dump(res, fh, indent=1, default=str)
        fh.write("\n")
    with open(os.path.join(out, "report.md"), "w") as fh:
        fh.write(markdown(data, meta))
    plot(os.path.join(out, "paper.png"), data)
    if data["points"] or data["tta"]:
        write_tensorboard(out, data)
    return res


# ------------------------------------------------------------------------- command line

def add_arguments(p: argparse.ArgumentParser) -> None:
    d = PaperConfig()
    p.add_argument("--models", default=",".join(d.models), help="throughput grid's models (default: both of the "
                                                                "paper's: lenet5,ptb-lstm-small)")
    p.add_argument("--hosts", default=",".join(map(str, d.hosts)), help="worker counts, one emulated host each; "
                                                                        "1 is the speedup's baseline (default: 1,2,4)")
    p.add_argument("--rates", default=",".join(d.rates), help="link rates per direction (default: 1gbit,100mbit: "
                                                              "a commodity cluster's Ethernet and a tenth of it)")
    p.add_argument("--ps-servers", type=int, default=d.ps_servers, help="K, the dedicated PS's servers (default: 1)")
    p.add_argument("--steps", type=int, default=0, help="measured steps per throughput job (default: the plan's)")
    p.add_argument("--tta-models", default=",".join(d.tta_models),
                   help="models of the time-to-quality grid, or none (default: lenet5)")
    p.add_argument("--tta-workers", default=",".join(map(str, d.tta_workers)), help="its worker counts (default: 4)")
    p.add_argument("--tta-rates", default="", help="its link rates (default: --rates)")
    p.add_argument("--tta-max-epochs", type=int, default=0, help="its epoch limit (default: the workload's)")
    p.add_argument("--tta-target", default="", metavar="MODEL=METRIC>=VALUE",
                   help="its quality target (default: the workload's, lenet5=eval/accuracy>=0.89)")
    p.add_argument("--out-dir", default="", help="default: runs/paper/<time>")
    p.add_argument("--dry-run", action="store_true", help="print the commands and run nothing")
    p.add_argument("--report", default="", metavar="DIR", help="run nothing: write DIR's report again")


def main(args: argparse.Namespace) -> int:
    try:
        cfg = config_from_args(args)
    except PaperError as e:
        print(f"paper: error: {e}", file=sys.stderr)
        return 2
    command = shlex.join(["python", "-m", "lab", *sys.argv[1:]])
    if args.report:
        if not os.path.isfile(os.path.join(args.report, "paper.json")) and not os.path.isdir(
                os.path.join(args.report, "throughput")):
            print(f"paper: error: --report {args.report}: no paper run there (no throughput/ nor paper.json)",
                  file=sys.stderr)
            return 2
        old = _read(os.path.join(args.report, "paper.json")) or {}
        meta = {k: old.get(k, v) for k, v in _meta(command, cfg, 0.0).items()}
        report(args.report, meta)
        print(f"-> {args.report}/report.md, paper.png", flush=True)
        return 0
    out = cfg.out_dir or os.path.join("runs", "paper", time.strftime("%Y%m%d-%H%M%S"))
    steps = plan(cfg, out)
    if args.dry_run:
        for what, argv in steps:
            print(f"# {what}\n{shlex.join(argv)}")
        return 0
    os.makedirs(out, exist_ok=True)
    t0, rcs, started = time.monotonic(), [], time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    for what, argv in steps:
        print(f"== {what}\n+ {shlex.join(argv)}", flush=True)
        rcs.append(subprocess.run(argv, check=False).returncode)
        if rcs[-1] in (2, 130):  # bad input or Ctrl-C: the next grid would fail or be unwanted too
            break
    meta = _meta(command, cfg, (time.monotonic() - t0) / 60, started)
    meta["grids"] = {what: {"command": shlex.join(argv), "returncode": rc} for (what, argv), rc in zip(steps, rcs)}
    report(out, meta)
    print(f"-> {out}/report.md, {out}/paper.png; make tensorboard RUN={out}/{tblog.COMPARISON_DIR}", flush=True)
    return 0 if rcs and all(rc == 0 for rc in rcs) and len(rcs) == len(steps) else 1


def _meta(command: str, cfg: PaperConfig, minutes: float, started: str = "") -> dict[str, Any]:
    load = os.getloadavg() if hasattr(os, "getloadavg") else (math.nan,) * 3
    return {"command": command, "started": started or time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "minutes": minutes,
            "cpus": os.cpu_count(), "load": f"{load[0]:.1f} at the end", "config": asdict(cfg)}
