"""``scaling``: ring allreduce and the parameter server side by side, as workers are added.

    python -m allreduce_train scaling                    # the default grid (make scaling)
    python -m allreduce_train scaling --models lenet5 --workers 1,2,4 --repeats 5

The grid is strategies x models x worker counts x repeats; every point is a real mpirun job of
the trainer (synthetic data by default, one thread per rank, fixed warm-up and measured steps)
whose metrics.json is read back. Repeats are the outer loop, so that a change in machine load
spreads over every configuration instead of hitting one. Before the grid, a short ``commbench``
run calibrates the cost model (:mod:`.costmodel`), which then predicts every measured point and
the scaling to 1024 workers on a given network.

Output in ``runs/scaling/<time>/``: ``runs/<model>/<strategy>-n<N>-r<k>/`` (each job's TensorBoard
run and metrics.json), ``summary/`` (speedup, efficiency and samples/s against the worker count
as the TensorBoard step, every strategy in one chart through a Custom Scalars layout),
``results.csv``, ``results.json``, ``report.md``, ``scaling.png``, ``predicted.png``, ``logs/``.

How jobs start is one function, :func:`default_launcher` (worker count and trainer arguments in,
argv out); a multi-host runner passes its own to :func:`run`.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

from . import commbench, costmodel

Launcher = Callable[[int, list[str], str], list[str]]

DEFAULT_MODELS = ("lenet5", "ptb-lstm-small", "resnet18")
DEFAULT_WORKERS = (1, 2)
REPORT_WORKERS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)


@dataclass(frozen=True)
class Variant:
    """One way to exchange gradients, as trainer flags, with the processes it adds beside workers."""

    name: str
    strategy: str  # the trainer's --strategy
    flags: tuple[str, ...]
    servers: int  # processes that only serve
    kind: str  # the cost model's exchange
    commbench_impl: str  # the commbench row that calibrates it
    description: str


def variants(ps_servers: int = 1) -> dict[str, Variant]:
    k = str(ps_servers)
    return {v.name: v for v in (
        Variant("allreduce", "allreduce", (), 0, costmodel.ALLREDUCE, "horovod", "Horovod ring allreduce"),
        Variant("ps-dedicated", "ps", ("--ps-placement", "dedicated", "--ps-servers", k), ps_servers,
                costmodel.PS_DEDICATED, "ps-dedicated", f"parameter server, {k} dedicated server process(es)"),
        Variant("ps-colocated", "ps", ("--ps-placement", "colocated"), 0, costmodel.PS_COLOCATED,
                "ps-colocated", "parameter server colocated with the workers (each serves 1/N)"),
    )}


@dataclass(frozen=True)
class Plan:
    """Per-model job settings that keep one job at a few seconds on one core."""

    batch_size: int
    warmup: int
    steps: int  # measured steps, after the warm-up
    samples: int  # synthetic samples (a tenth is the evaluation set scored at the end of the job)


PLANS = {
    "lenet5": Plan(batch_size=64, warmup=10, steps=40, samples=6400),
    "ptb-lstm-small": Plan(batch_size=20, warmup=3, steps=12, samples=400),
    "resnet18": Plan(batch_size=8, warmup=2, steps=8, samples=320),
}
FALLBACK_PLAN = Plan(batch_size=16, warmup=3, steps=10, samples=512)


@dataclass
class GridConfig:
    strategies: list[str] = field(default_factory=lambda: list(variants()))
    models: list[str] = field(default_factory=lambda: list(DEFAULT_MODELS))
    workers: list[int] = field(default_factory=lambda: list(DEFAULT_WORKERS))
    repeats: int = 3
    data: str = "synthetic"  # or "real": each model's own dataset
    steps: int = 0  # 0: the model's plan
    warmup_steps: int = -1  # -1: the model's plan
    batch_size: int = 0  # 0: the model's plan
    ps_servers: int = 1
    out_dir: str = ""
    commbench: bool = True
    commbench_sizes: str = "4K,64K,1M,4M,16M"
    calibration: str = ""  # an existing commbench.json instead of running one
    net_gbps: float = 10.0
    net_latency_us: float = 50.0
    horovod_cycle_ms: str = "auto"  # "auto": the fastest in the calibration commbench; "default": Horovod's
    horovod_fusion_mb: float = -1.0
    extra: list[str] = field(default_factory=list)
    job_timeout: float = 900.0

    def plan(self, model: str) -> Plan:
        p = PLANS.get(model, FALLBACK_PLAN)
        return Plan(self.batch_size or p.batch_size, p.warmup if self.warmup_steps < 0 else self.warmup_steps,
                    self.steps or p.steps, p.samples)


class GridError(Exception):
    """Bad grid input; the message names the flag."""


def default_launcher(np_: int, args: list[str], command: str = "train") -> list[str]:
    """argv of one job of ``np_`` processes on this machine (more ranks than cores are allowed)."""
    return [sys.executable, "-m", "launch", "-np", str(np_), "--oversubscribe", "--command", command, "--", *args]


def train_flags() -> set[str]:
    """Every flag the trainer accepts now (strategies add theirs as they land)."""
    from .config import add_arguments

    p = argparse.ArgumentParser(add_help=False)
    add_arguments(p)
    return set(p._option_string_actions)


def available(cfg: GridConfig) -> tuple[list[Variant], list[str], list[str]]:
    """(variants, models) that exist in this checkout, and a note for each one that does not."""
    from models import MODELS

    from .distributed import STRATEGIES

    table, flags = variants(cfg.ps_servers), train_flags()
    notes, vs, ms = [], [], []
    for name in cfg.strategies:
        v = table[name]
        missing = [f for f in v.flags if f.startswith("--") and f not in flags]
        if v.strategy not in STRATEGIES or missing:
            notes.append(f"strategy {name}: skipped, the trainer has no --strategy {v.strategy}"
                         + (f" with {' '.join(missing)}" if missing else "") + " in this checkout")
        else:
            vs.append(v)
    for m in cfg.models:
        if m in MODELS:
            ms.append(m)
        else:
            notes.append(f"model {m}: skipped, not in the model registry of this checkout")
    return vs, ms, notes


def gradient_bytes(model: str) -> int:
    from models import MODELS

    return 4 * sum(p.numel() for p in MODELS[model].build().parameters() if p.requires_grad)


def dataset_args(cfg: GridConfig, model: str, plan: Plan) -> list[str]:
    if cfg.data == "synthetic":
        return ["--dataset", "synthetic", "--synthetic-samples", str(plan.samples)]
    from models import MODELS

    # each model's own data: Fashion-MNIST for the CNNs, the PTB-format corpus for the LMs
    return ["--dataset", "ptb" if MODELS[model].task == "lm" else "fashion-mnist"]


@dataclass
class Job:
    model: str
    variant: Variant
    workers: int
    repeat: int

    @property
    def world(self) -> int:
        return self.workers + self.variant.servers

    @property
    def name(self) -> str:
        return f"{self.variant.name}-n{self.workers}-r{self.repeat}"


def trainer_args(cfg: GridConfig, job: Job, run_dir: str) -> list[str]:
    plan = cfg.plan(job.model)
    total = plan.warmup + plan.steps
    return ["--model", job.model, *dataset_args(cfg, job.model, plan), "--batch-size", str(plan.batch_size),
            "--strategy", job.variant.strategy, *job.variant.flags,
            "--threads", "1", "--steps", str(total), "--perf-warmup-steps", str(plan.warmup),
            "--eval-every", str(total), "--checkpoint-every", str(total), "--log-every", str(max(1, total // 4)),
            # A synchronous PS cannot clip the global gradient norm (no server sees all of it), so no
            # job clips (the LSTM's recipe would): every strategy then does the same work per step.
            "--grad-clip", "0",
            "--no-progress", "--run-dir", run_dir, "--name", job.name, *cfg.extra]


def job_env(cfg: GridConfig, cycle_ms: float | None) -> dict[str, str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "ALLREDUCE_TRAIN_PROGRESS": "0"}
    if cycle_ms is not None:
        env["HOROVOD_CYCLE_TIME"] = f"{cycle_ms:g}"
    if cfg.horovod_fusion_mb >= 0:
        env["HOROVOD_FUSION_THRESHOLD"] = str(int(cfg.horovod_fusion_mb * (1 << 20)))
    return env


def run_job(cfg: GridConfig, job: Job, out: str, launcher: Launcher, cycle_ms: float | None = None) -> dict[str, Any]:
    """One grid point: launch it, wait, read back its metrics.json."""
    run_dir = os.path.join(out, "runs", job.model)
    argv = launcher(job.world, trainer_args(cfg, job, run_dir), "train")
    log_path = os.path.join(out, "logs", f"{job.model}-{job.name}.log")
    load = os.getloadavg()[0]
    t0 = time.perf_counter()
    with open(log_path, "w") as log:
        try:
            rc = subprocess.run(argv, stdout=log, stderr=subprocess.STDOUT, env=job_env(cfg, cycle_ms),
                                timeout=cfg.job_timeout).returncode
        except subprocess.TimeoutExpired:
            rc = "timeout"
    record = {"model": job.model, "strategy": job.variant.name, "workers": job.workers,
              "servers": job.variant.servers, "world_size": job.world, "repeat": job.repeat,
              "seconds": time.perf_counter() - t0, "loadavg_before": load, "log": os.path.relpath(log_path, out),
              "run": os.path.relpath(os.path.join(run_dir, job.name), out), "argv": argv}
    metrics_path = os.path.join(run_dir, job.name, "metrics.json")
    if rc == 0 and os.path.exists(metrics_path):
        with open(metrics_path) as fh:
            m = json.load(fh)
        record.update(ok=True, samples_per_sec=m["samples_per_sec"], step_ms=m["step_ms"],
                      comm_wait_ms=m["comm_wait_ms"], global_batch=m["global_batch"])
    else:
        with open(log_path) as fh:
            tail = fh.read()[-600:]
        record.update(ok=False, error=f"exit {rc}: " + tail.strip().splitlines()[-1] if tail.strip() else f"exit {rc}")
    return record


# ------------------------------------------------------------------------- aggregation

def _stats(values: list[float]) -> tuple[float, float, float, float]:
    """mean, sample standard deviation (0 for one value), min, max."""
    if not values:
        return math.nan, math.nan, math.nan, math.nan
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return statistics.fmean(values), sd, min(values), max(values)


def aggregate(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per (model, strategy, workers): mean and spread over repeats, speedup, efficiency.

    speedup(N) = throughput(N) / throughput(1) of the same strategy; its spread is propagated from
    the relative standard deviations of both throughputs.
    """
    groups: dict[tuple, list[dict]] = {}
    for r in records:
        groups.setdefault((r["model"], r["strategy"], r["workers"]), []).append(r)
    rows = []
    for (model, strategy, n), rs in sorted(groups.items()):
        ok = [r for r in rs if r["ok"]]
        row = {"model": model, "strategy": strategy, "workers": n, "servers": rs[0]["servers"],
               "world_size": rs[0]["world_size"], "repeats": len(ok), "failed": len(rs) - len(ok)}
        for key in ("samples_per_sec", "step_ms", "comm_wait_ms"):
            mean, sd, lo, hi = _stats([r[key] for r in ok])
            row.update({f"{key}_mean": mean, f"{key}_std": sd, f"{key}_min": lo, f"{key}_max": hi})
        row["samples_per_sec_values"] = [r["samples_per_sec"] for r in ok]
        rows.append(row)
    base = {(r["model"], r["strategy"]): r for r in rows if r["workers"] == 1}
    for row in rows:
        b = base.get((row["model"], row["strategy"]))
        t, s = row["samples_per_sec_mean"], row["samples_per_sec_std"]
        if b and b["repeats"] and row["repeats"]:
            sp = t / b["samples_per_sec_mean"]
            # the baseline against itself is 1 exactly
            rel = 0.0 if b is row else math.hypot(s / t, b["samples_per_sec_std"] / b["samples_per_sec_mean"])
            row.update(speedup=sp, speedup_std=sp * rel, efficiency=sp / row["workers"],
                       efficiency_std=sp * rel / row["workers"])
        else:
            row.update(speedup=math.nan, speedup_std=math.nan, efficiency=math.nan, efficiency_std=math.nan)
    return rows


# ------------------------------------------------------------------------- cost model

CYCLE_CANDIDATES = "0.2,5"  # besides Horovod's default of 1 ms


def choose_cycle(commbench_report: dict[str, Any]) -> tuple[float | None, str]:
    """The HOROVOD_CYCLE_TIME whose allreduce sweep was fastest (geometric mean over the sizes
    every configuration measured): (ms or None for Horovod's default, the commbench job label)."""
    times: dict[str, dict[int, float]] = {}
    for r in commbench_report["results"]:
        job = r.get("job", "default")
        if r["impl"] == "horovod" and r["workload_kind"] == "size" and (job == "default" or job.startswith("cycle=")):
            times.setdefault(job, {})[r["bytes"]] = r["time_s"]
    if not times:
        return None, "default"
    common = set.intersection(*(set(t) for t in times.values()))
    if not common:
        return None, "default"
    best = min(times, key=lambda j: sum(math.log(times[j][b]) for b in common))
    return (None if best == "default" else float(best[len("cycle="):-len("ms")])), best


def calibrate(commbench_report: dict[str, Any], vs: list[Variant], horovod_job: str = "default") -> dict[str, dict[str, Any]]:
    """alpha and B per strategy, fitted to its commbench size sweep (Horovod: the knobs the grid used)."""
    out = {}
    for v in vs:
        want = horovod_job if v.commbench_impl == "horovod" else ("default", f"K={v.servers}")
        pts = [r for r in commbench_report["results"]
               if r["impl"] == v.commbench_impl and r["workload_kind"] == "size"
               and r.get("job", "default") in want]
        if not pts or pts[0]["workers"] < 2:
            continue
        n, k = pts[0]["workers"], max(1, pts[0]["servers"])
        net = costmodel.fit_alpha_beta(v.kind, n, [(r["bytes"], r["time_s"]) for r in pts], servers=k)
        out[v.name] = {"impl": v.commbench_impl, "workers": n, "alpha_s": net.alpha,
                       "bandwidth_Bps": net.bandwidth, "points": len(pts)}
    return out


def compute_times(rows: list[dict[str, Any]], plans: dict[str, Plan]) -> dict[str, float]:
    """Seconds of compute per step and model: the one-worker allreduce step (from its throughput,
    so that the prediction at N=1 reproduces it) minus its exchange wait; any strategy's
    one-worker run when allreduce has none."""
    out: dict[str, float] = {}
    for any_strategy in (False, True):
        for r in rows:
            if r["workers"] == 1 and r["repeats"] and (any_strategy or r["strategy"] == "allreduce"):
                step_s = plans[r["model"]].batch_size / r["samples_per_sec_mean"]
                out.setdefault(r["model"], max(0.0, step_s - r["comm_wait_ms_mean"] / 1e3))
    return out


def predictions(rows, vs: list[Variant], models: list[str], plans: dict[str, Plan], calib, given: costmodel.Network,
                sizes: dict[str, int]) -> tuple[dict, dict]:
    """(beside each measured row: the calibrated prediction; per model and strategy: the curve to
    1024 workers on the given network)."""
    compute = compute_times(rows, plans)
    table = {v.name: v for v in vs}
    for r in rows:
        v, c = table.get(r["strategy"]), compute.get(r["model"])
        cal = calib.get(r["strategy"])
        if v is None or c is None or cal is None:
            r.update(predicted_samples_per_sec=math.nan, predicted_efficiency=math.nan, prediction_error_pct=math.nan)
            continue
        net = costmodel.Network(cal["alpha_s"], cal["bandwidth_Bps"])
        p = costmodel.predict(v.kind, r["workers"], sizes[r["model"]], c, plans[r["model"]].batch_size, net,
                              servers=max(1, v.servers))
        err = 100 * (p.samples_per_sec - r["samples_per_sec_mean"]) / r["samples_per_sec_mean"]
        r.update(predicted_samples_per_sec=p.samples_per_sec, predicted_efficiency=p.efficiency,
                 prediction_error_pct=err)
    curves: dict[str, dict[str, list[dict]]] = {}
    for m in models:
        if m not in compute:
            continue
        for v in vs:
            curves.setdefault(m, {})[v.name] = [
                asdict(costmodel.predict(v.kind, n, sizes[m], compute[m], plans[m].batch_size, given,
                                         servers=max(1, v.servers)))
                for n in REPORT_WORKERS]
    return compute, curves


# ------------------------------------------------------------------------- outputs

CSV_FIELDS = ("model", "strategy", "workers", "servers", "world_size", "repeats", "failed",
              "samples_per_sec_mean", "samples_per_sec_std", "samples_per_sec_min", "samples_per_sec_max",
              "speedup", "speedup_std", "efficiency", "efficiency_std",
              "step_ms_mean", "step_ms_std", "comm_wait_ms_mean", "comm_wait_ms_std",
              "predicted_samples_per_sec", "predicted_efficiency", "prediction_error_pct")


def write_csv(path: str, rows: list[dict]) -> None:
    with open(path, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=CSV_FIELDS, extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow({k: (f"{v:.6g}" if isinstance(v, float) else v) for k, v in r.items()})


def write_tensorboard(path: str, rows: list[dict], curves: dict, models: list[str], given_label: str) -> None:
    """The summary run: TensorBoard step = worker count; one Multiline chart per figure and model."""
    from torch.utils.tensorboard import SummaryWriter

    w = SummaryWriter(log_dir=path)
    for r in rows:
        if not r["repeats"]:
            continue
        m, s, n = r["model"], r["strategy"], r["workers"]
        w.add_scalar(f"perf/samples_per_sec/{m}/{s}", r["samples_per_sec_mean"], n)
        if not math.isnan(r["speedup"]):
            w.add_scalar(f"scaling/speedup/{m}/{s}", r["speedup"], n)
            w.add_scalar(f"scaling/efficiency/{m}/{s}", r["efficiency"], n)
    for m, per in curves.items():
        for s, pts in per.items():
            for p in pts:
                w.add_scalar(f"scaling/predicted_efficiency/{m}/{s}", p["efficiency"], p["workers"])
                w.add_scalar(f"scaling/predicted_speedup/{m}/{s}", p["speedup"], p["workers"])
    layout = {m: {"speedup vs workers": ["Multiline", [rf"scaling/speedup/{m}/.*"]],
                  "efficiency vs workers": ["Multiline", [rf"scaling/efficiency/{m}/.*"]],
                  "samples/s vs workers": ["Multiline", [rf"perf/samples_per_sec/{m}/.*"]],
                  f"predicted efficiency, {given_label}": ["Multiline", [rf"scaling/predicted_efficiency/{m}/.*"]]}
              for m in models}
    w.add_custom_scalars(layout)
    w.close()


STYLE = {"allreduce": ("tab:blue", "o"), "ps-dedicated": ("tab:red", "s"), "ps-colocated": ("tab:green", "^")}


def plot_measured(path: str, rows: list[dict], models: list[str]) -> None:
    """scaling.png: per model, measured speedup (with its spread) and the calibrated prediction."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(models), figsize=(4.6 * len(models), 4.0), squeeze=False)
    for ax, m in zip(axes[0], models):
        sel = [r for r in rows if r["model"] == m and r["repeats"]]
        ns = sorted({r["workers"] for r in sel}) or [1]
        ax.plot(ns, ns, color="0.6", ls=":", label="ideal")
        for s in sorted({r["strategy"] for r in sel}):
            pts = sorted((r for r in sel if r["strategy"] == s and not math.isnan(r["speedup"])),
                         key=lambda r: r["workers"])
            if not pts:
                continue
            color, marker = STYLE.get(s, ("black", "x"))
            ax.errorbar([r["workers"] for r in pts], [r["speedup"] for r in pts],
                        yerr=[r["speedup_std"] for r in pts], color=color, marker=marker, capsize=3, label=s)
            pred = [(r["workers"], r["predicted_efficiency"] * r["workers"]) for r in pts
                    if not math.isnan(r.get("predicted_efficiency", math.nan))]
            if pred:
                ax.plot(*zip(*pred), color=color, ls="--", marker=marker, mfc="none", alpha=0.7,
                        label=f"{s} (model)")
        ax.set_title(m)
        ax.set_xlabel("workers N")
        ax.set_ylabel("speedup = throughput(N) / throughput(1)")
        ax.set_xticks(ns)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="best", framealpha=0.6)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_predicted(path: str, curves: dict, given_label: str) -> None:
    """predicted.png: the cost model's efficiency to 1024 workers on the given network."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = list(curves)
    fig, axes = plt.subplots(1, max(1, len(models)), figsize=(4.6 * max(1, len(models)), 4.0), squeeze=False)
    for ax, m in zip(axes[0], models):
        for s, pts in curves[m].items():
            color, marker = STYLE.get(s, ("black", "x"))
            # dashed: the colocated PS's curve lies on the ring's (same bytes, same messages)
            ax.plot([p["workers"] for p in pts], [p["efficiency"] for p in pts], color=color, marker=marker,
                    ms=4, ls="--" if s == "ps-colocated" else "-", label=s)
        ax.set_xscale("log", base=2)
        ax.set_ylim(0, 1.05)
        ax.set_title(f"{m}: predicted, {given_label}", fontsize=9)
        ax.set_xlabel("workers N")
        ax.set_ylabel("efficiency = speedup / N")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def code_version() -> str:
    """The checkout's commit, marked when the working tree differs from it (figures depend on the code)."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                               text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return (head + (" with uncommitted changes" if dirty else "")) if head else "unknown"


def _load_summary(records: list[dict]) -> str:
    loads = [r["loadavg_before"] for r in records]
    return f"median {statistics.median(loads):.1f}, max {max(loads):.1f}" if loads else "–"


def _fmt(v: float, spec: str = ".3g") -> str:
    return "–" if v is None or (isinstance(v, float) and math.isnan(v)) else format(v, spec)


def report_markdown(res: dict[str, Any]) -> str:
    cfg, rows = res["config"], res["rows"]
    L = [f"# Scaling: ring allreduce vs parameter server ({res['started']})", "",
         f"Command: `{' '.join(res['command'])}`  ",
         f"Machine: {res['machine']['cores']} cores, {res['machine']['platform']}; every rank runs one thread; "
         f"grid took {res['seconds'] / 60:.1f} min. Code: {res['code']}.  ",
         f"Data: {cfg['data']}; {cfg['repeats']} repeat(s) per point (repeats are the outer loop); worker counts "
         f"{', '.join(map(str, cfg['workers']))}. HOROVOD_CYCLE_TIME of the allreduce jobs: "
         f"{res['horovod_cycle']['knob']} (`--horovod-cycle-ms {cfg['horovod_cycle_ms']}`). "
         f"Load average before the jobs: {res['loadavg']} (other work on the machine slows the jobs it overlaps).",
         "",
         "## Definitions", "",
         "- throughput = samples per second over the measured steps (warm-up excluded), all workers together;",
         "- speedup(N) = throughput(N) / throughput(1), each strategy against its own one-worker run;",
         "- efficiency(N) = speedup(N) / N;",
         "- N counts workers; a dedicated parameter server's extra processes are listed beside it (servers) "
         "and run on the same cores;",
         "- ± is the sample standard deviation over repeats (propagated for speedup and efficiency);",
         "- model = the calibrated cost model's prediction for the same point; error = (model - measured) / "
         "measured.", ""]
    for m in res["models"]:
        plan = res["plans"][m]
        L += [f"## {m}", "",
              f"{plan['batch_size']} samples per worker and step, {plan['warmup']} warm-up + {plan['steps']} "
              f"measured steps, gradient {res['gradient_bytes'][m] / 1e6:.2f} MB.", "",
              "| strategy | N | servers | samples/s | speedup | efficiency | step ms | comm wait ms | "
              "model samples/s | error |",
              "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for r in (r for r in rows if r["model"] == m):
            if not r["repeats"]:
                L.append(f"| {r['strategy']} | {r['workers']} | {r['servers']} | failed | | | | | | |")
                continue
            L.append(f"| {r['strategy']} | {r['workers']} | {r['servers']} | "
                     f"{_fmt(r['samples_per_sec_mean'], '.1f')} ± {_fmt(r['samples_per_sec_std'], '.1f')} | "
                     f"{_fmt(r['speedup'], '.2f')} ± {_fmt(r['speedup_std'], '.2f')} | "
                     f"{_fmt(r['efficiency'], '.2f')} | {_fmt(r['step_ms_mean'], '.1f')} | "
                     f"{_fmt(r['comm_wait_ms_mean'], '.2f')} | {_fmt(r['predicted_samples_per_sec'], '.1f')} | "
                     f"{_fmt(r['prediction_error_pct'], '+.0f')}{'' if math.isnan(r['prediction_error_pct']) else ' %'} |")
        L.append("")
    L += ["![measured speedup](scaling.png)", ""]
    if res["notes"]:
        L += ["## Skipped or failed", ""] + [f"- {n}" for n in res["notes"]] + [""]
    L += ["## Cost model", "",
          "step = compute + exchange (no overlap assumed); exchange per strategy, with N workers, gradient S bytes, "
          "latency alpha per message and link bandwidth B:", "",
          "- ring allreduce: 2(N-1) alpha + 2(N-1)/N S/B",
          "- PS, K dedicated servers: 2 max(K, N) alpha + 2 max(S/B, N S/(K B)) (push + pull)",
          "- PS colocated: 2(N-1) alpha + 2(N-1)/N S/B", "",
          "Compute per step = the one-worker allreduce step minus its exchange wait: "
          + ", ".join(f"{m} {1e3 * c:.1f} ms" for m, c in res["compute_s"].items()) + ".", ""]
    if res["calibration"]:
        L += [f"Calibrated from `{res['calibration_source']}` (least squares on relative error over the size sweep):",
              "", "| strategy | from commbench | N | alpha us | B GB/s |", "|---|---|---:|---:|---:|"]
        for s, c in res["calibration"].items():
            L.append(f"| {s} | {c['impl']} | {c['workers']} | {1e6 * c['alpha_s']:.1f} | "
                     f"{c['bandwidth_Bps'] / 1e9:.3f} |")
        L.append("")
    else:
        L += ["No calibration (commbench skipped or failed): the measured table has no model column.", ""]
    if res["curves"]:
        given = res["given_network"]
        L += [f"### Predicted efficiency to 1024 workers, {given['label']}", "",
              "Same compute per step as measured here, a network of the given link speed and latency "
              f"(`--net-gbps {given['gbps']:g} --net-latency-us {given['latency_us']:g}`):", "",
              "| model | strategy | " + " | ".join(f"N={n}" for n in (2, 8, 64, 256, 1024)) + " |",
              "|---|---|" + "---:|" * 5]
        for m, per in res["curves"].items():
            for s, pts in per.items():
                by_n = {p["workers"]: p for p in pts}
                L.append(f"| {m} | {s} | " + " | ".join(f"{by_n[n]['efficiency']:.2f}" for n in (2, 8, 64, 256, 1024))
                         + " |")
        L += ["", "The ring and the colocated PS move the same bytes in the same number of messages, so the model "
                  "gives them one curve; what separates them in the measured tables is the implementations.", "",
              "![predicted efficiency](predicted.png)", ""]
    L += ["## Files", "",
          "- `results.csv`, `results.json`: every figure above, with min/max and each repeat's throughput;",
          "- `commbench/commbench.md`: the calibration run, the exchange alone (when it ran);",
          "- `runs/<model>/<strategy>-n<N>-r<k>/`: each job's TensorBoard run and metrics.json; `logs/`: its output;",
          "- `summary/`: speedup, efficiency and samples/s against the worker count (TensorBoard step = N), "
          "strategies overlaid in the Custom Scalars tab:", "",
          f"      .venv/bin/tensorboard --logdir {res['out_dir']} --host 127.0.0.1 --port 6006", ""]
    return "\n".join(L)


# ------------------------------------------------------------------------- the run

def run_commbench(cfg: GridConfig, vs: list[Variant], out: str, launcher: Launcher) -> str:
    """A short commbench at 2 workers for calibration; returns the path of its commbench.json."""
    impls = sorted({v.commbench_impl for v in vs})
    args = argparse.Namespace(np=2, impls=",".join(impls), sizes=cfg.commbench_sizes, models="", iters=0, warmup=3,
                              budget=0.25,
                              ps_servers=cfg.ps_servers, ps_servers_list=str(cfg.ps_servers),
                              horovod_cycle_ms={"auto": CYCLE_CANDIDATES, "default": ""}.get(cfg.horovod_cycle_ms,
                                                                                              cfg.horovod_cycle_ms),
                              horovod_fusion_mb="", timeline_size="", out=None, out_dir=os.path.join(out, "commbench"),
                              dump_dir="",
                              job_timeout=cfg.job_timeout)
    commbench.run_front(args, launcher=launcher)
    return os.path.join(out, "commbench", "commbench.json")


def run(cfg: GridConfig, launcher: Launcher = default_launcher) -> dict[str, Any]:
    """Run the grid and write every output; returns the results (as in results.json)."""
    started, code = time.strftime("%Y-%m-%d %H:%M:%S"), code_version()
    t_start = time.perf_counter()
    vs, models, notes = available(cfg)
    if not vs or not models:
        raise GridError("nothing to run: " + "; ".join(notes))
    out = cfg.out_dir or os.path.join("runs", "scaling", time.strftime("%Y%m%d-%H%M%S"))
    os.makedirs(os.path.join(out, "logs"), exist_ok=True)
    print(f"scaling grid -> {out}", flush=True)
    for n in notes:
        print(f"  note: {n}", flush=True)

    calib_path = cfg.calibration
    if not calib_path and cfg.commbench:
        try:
            calib_path = run_commbench(cfg, vs, out, launcher)
        except (OSError, subprocess.SubprocessError, ValueError, commbench.BenchError) as e:  # the grid still runs
            notes.append(f"commbench for calibration failed: {e}")

    report = None
    if calib_path and os.path.exists(calib_path):
        with open(calib_path) as fh:
            report = json.load(fh)
    cycle_ms, horovod_job = parse_cycle(cfg.horovod_cycle_ms), "default"
    if cycle_ms is not None:
        horovod_job = f"cycle={cycle_ms:g}ms"  # commbench's label of that configuration
    elif cfg.horovod_cycle_ms == "auto" and report:
        cycle_ms, horovod_job = choose_cycle(report)
    knob = "Horovod's default" if cycle_ms is None else f"{cycle_ms:g} ms"
    print(f"HOROVOD_CYCLE_TIME for the allreduce jobs: {knob}", flush=True)

    jobs = [Job(m, v, n, r) for r in range(1, cfg.repeats + 1) for m in models for v in vs for n in cfg.workers]
    records = []
    for i, job in enumerate(jobs, 1):
        try:
            rec = run_job(cfg, job, out, launcher, cycle_ms if job.variant.strategy == "allreduce" else None)
        except KeyboardInterrupt:  # Ctrl-C also ended the job's ranks: report what was measured
            notes.append(f"interrupted after {i - 1} of {len(jobs)} jobs")
            break
        records.append(rec)
        done = time.perf_counter() - t_start
        eta = done / i * (len(jobs) - i)
        figure = f"{rec['samples_per_sec']:9.1f} samples/s" if rec["ok"] else f"FAILED ({rec['error']})"
        print(f"[{i:3d}/{len(jobs)}] {job.model:15s} {job.variant.name:13s} N={job.workers} "
              f"(+{job.variant.servers}) r{job.repeat}: {figure}  {rec['seconds']:5.1f} s, eta {eta / 60:4.1f} min",
              flush=True)
        if not rec["ok"]:
            notes.append(f"{job.model} {job.name} failed: {rec['error']} (see {rec['log']})")

    rows = aggregate(records)
    plans = {m: cfg.plan(m) for m in models}
    sizes = {m: gradient_bytes(m) for m in models}
    calib = calibrate(report, vs, horovod_job) if report else {}
    given = costmodel.Network.from_gbit_us(cfg.net_gbps, cfg.net_latency_us)
    given_label = f"{cfg.net_gbps:g} Gbit/s, {cfg.net_latency_us:g} us"
    compute, curves = predictions(rows, vs, models, plans, calib, given, sizes)

    res = {"started": started, "seconds": time.perf_counter() - t_start,
           "command": ["python", "-m", "allreduce_train", *sys.argv[1:]], "out_dir": out, "code": code,
           "machine": {"cores": os.cpu_count(), "platform": platform.platform()},
           "config": asdict(cfg), "models": models, "strategies": [v.name for v in vs],
           "plans": {m: asdict(p) for m, p in plans.items()}, "gradient_bytes": sizes,
           "horovod_cycle": {"setting": cfg.horovod_cycle_ms, "used_ms": cycle_ms, "knob": knob},
           "loadavg": _load_summary(records), "rows": rows, "jobs": records, "notes": notes, "compute_s": compute,
           "calibration": calib, "calibration_source": os.path.relpath(calib_path, out) if calib_path else "",
           "given_network": {"gbps": cfg.net_gbps, "latency_us": cfg.net_latency_us, "label": given_label},
           "curves": curves}
    write_csv(os.path.join(out, "results.csv"), rows)
    with open(os.path.join(out, "results.json"), "w") as fh:
        json.dump(res, fh, indent=2, default=str)
        fh.write("\n")
    write_tensorboard(os.path.join(out, "summary"), rows, curves, models, given_label)
    plot_measured(os.path.join(out, "scaling.png"), rows, models)
    if curves:
        plot_predicted(os.path.join(out, "predicted.png"), curves, given_label)
    with open(os.path.join(out, "report.md"), "w") as fh:
        fh.write(report_markdown(res))
    print(f"done in {res['seconds'] / 60:.1f} min: {out}/report.md, scaling.png, results.csv; "
          f"tensorboard --logdir {out}", flush=True)
    return res


# ------------------------------------------------------------------------- command line

def _list(text: str, flag: str, conv=str) -> list:
    try:
        vals = [conv(v.strip()) for v in text.split(",") if v.strip()]
    except ValueError:
        raise GridError(f"{flag}: cannot read {text!r}; give a comma-separated list") from None
    if not vals:
        raise GridError(f"{flag}: empty list")
    return vals


def add_arguments(p: argparse.ArgumentParser) -> None:
    d = GridConfig()
    p.add_argument("--strategies", default=",".join(d.strategies),
                   help=f"comma-separated subset of {', '.join(variants())} (default: all)")
    p.add_argument("--models", default=",".join(d.models), help=f"comma-separated models (default: {','.join(d.models)})")
    p.add_argument("--workers", default=",".join(map(str, d.workers)),
                   help="comma-separated worker counts; include 1, the speedup baseline (default: 1,2)")
    p.add_argument("--repeats", type=int, default=d.repeats, help=f"jobs per grid point (default: {d.repeats})")
    p.add_argument("--data", choices=("synthetic", "real"), default=d.data,
                   help="synthetic (default) or each model's own dataset (Fashion-MNIST, the PTB-format corpus)")
    p.add_argument("--steps", type=int, default=d.steps, help="measured steps per job (default: per model, 8-40)")
    p.add_argument("--warmup-steps", type=int, default=d.warmup_steps,
                   help="warm-up steps per job, excluded from throughput (default: per model, 2-10)")
    p.add_argument("--batch-size", type=int, default=d.batch_size, help="per-worker batch (default: per model)")
    p.add_argument("--ps-servers", type=int, default=d.ps_servers, help="K for ps-dedicated (default: 1)")
    p.add_argument("--out-dir", default="", help="output directory (default: runs/scaling/<time>)")
    p.add_argument("--no-commbench", dest="commbench", action="store_false",
                   help="skip the calibration commbench (no model column in the report)")
    p.add_argument("--commbench-sizes", default=d.commbench_sizes, help="sizes for the calibration sweep")
    p.add_argument("--calibration", default="", help="calibrate from this commbench.json instead of running one")
    p.add_argument("--net-gbps", type=float, default=d.net_gbps,
                   help="link speed of the network for the prediction to 1024 workers, Gbit/s (default: 10)")
    p.add_argument("--net-latency-us", type=float, default=d.net_latency_us,
                   help="per-message latency of that network, microseconds (default: 50)")
    p.add_argument("--horovod-cycle-ms", default=d.horovod_cycle_ms,
                   help="HOROVOD_CYCLE_TIME of the allreduce jobs: auto = the fastest of Horovod's default (1 ms) "
                        f"and {CYCLE_CANDIDATES} in the calibration commbench; default = Horovod's; or a number "
                        "(default: auto)")
    p.add_argument("--horovod-fusion-mb", type=float, default=d.horovod_fusion_mb,
                   help="HOROVOD_FUSION_THRESHOLD in MB for every job (default: Horovod's, 128)")
    p.add_argument("--extra", action="append", default=[], metavar="ARG",
                   help="an extra trainer argument for every job, e.g. --extra=--compression --extra=fp16")
    p.add_argument("--job-timeout", type=float, default=d.job_timeout, help="seconds before a job is killed")


def parse_cycle(text: str) -> float | None:
    """--horovod-cycle-ms as a number, None for 'auto' / 'default' (decided later / Horovod's)."""
    if text in ("auto", "default"):
        return None
    try:
        v = float(text)
    except ValueError:
        raise GridError(f"--horovod-cycle-ms: expected auto, default or milliseconds (got {text!r})") from None
    if not v > 0:
        raise GridError(f"--horovod-cycle-ms must be > 0 (got {text!r})")
    return v


def config_from_args(args: argparse.Namespace) -> GridConfig:
    names = _list(args.strategies, "--strategies")
    unknown = [s for s in names if s not in variants()]
    if unknown:
        raise GridError(f"--strategies: unknown strategy {unknown[0]!r}; choose from: {', '.join(variants())}")
    workers = _list(args.workers, "--workers", int)
    if any(n < 1 for n in workers):
        raise GridError(f"--workers: counts must be >= 1 (got {args.workers!r})")
    for flag, v, lo in (("--repeats", args.repeats, 1), ("--steps", args.steps, 0), ("--batch-size", args.batch_size, 0),
                        ("--ps-servers", args.ps_servers, 1)):
        if v < lo:
            raise GridError(f"{flag} must be >= {lo} (got {v})")
    if args.warmup_steps < -1:
        raise GridError(f"--warmup-steps must be >= 0 (got {args.warmup_steps})")
    parse_cycle(args.horovod_cycle_ms)
    if args.net_gbps <= 0 or args.net_latency_us < 0:
        raise GridError("--net-gbps must be > 0 and --net-latency-us >= 0")
    if args.calibration and not os.path.isfile(args.calibration):
        raise GridError(f"--calibration {args.calibration}: file not found; run `python -m allreduce_train "
                        "commbench --np 2` and pass its commbench.json")
    return GridConfig(strategies=names, models=_list(args.models, "--models"), workers=sorted(set(workers)),
                      repeats=args.repeats, data=args.data, steps=args.steps, warmup_steps=args.warmup_steps,
                      batch_size=args.batch_size, ps_servers=args.ps_servers, out_dir=args.out_dir,
                      commbench=args.commbench, commbench_sizes=args.commbench_sizes, calibration=args.calibration,
                      net_gbps=args.net_gbps, net_latency_us=args.net_latency_us,
                      horovod_cycle_ms=args.horovod_cycle_ms, horovod_fusion_mb=args.horovod_fusion_mb,
                      extra=args.extra, job_timeout=args.job_timeout)


def main(args: argparse.Namespace) -> int:
    try:
        cfg = config_from_args(args)
        res = run(cfg)
    except GridError as e:
        print(f"allreduce_train: error: {e}", file=sys.stderr)
        return 2
    if any(n.startswith("interrupted") for n in res["notes"]):
        return 130
    return 0 if all(j["ok"] for j in res["jobs"]) else 1
