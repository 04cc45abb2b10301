"""The scaling grid's outputs: aggregation over repeats, results.csv, TensorBoard, plots, report.md."""

from __future__ import annotations

import csv
import json
import math
import os
import statistics
import subprocess
import sys
from typing import Any

from ..common import engines, methods, tblog
from ..common.plots import STYLE, plot_measured

# The no-exchange bound's rows (the grid's ``bound`` jobs: the same workers, ``--strategy none``).
BOUND = "bound"


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
        row = {
            "model": model,
            "strategy": strategy,
            "workers": n,
            "servers": rs[0]["servers"],
            "world_size": rs[0]["world_size"],
            "repeats": len(ok),
            "failed": len(rs) - len(ok),
        }
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
            row.update(
                speedup=sp,
                speedup_std=sp * rel,
                efficiency=sp / row["workers"],
                efficiency_std=sp * rel / row["workers"],
            )
        else:
            row.update(speedup=math.nan, speedup_std=math.nan, efficiency=math.nan, efficiency_std=math.nan)
    add_bound(rows, records)
    return rows


def add_bound(rows: list[dict[str, Any]], records: list[dict[str, Any]]) -> None:
    """Beside every row: the no-exchange bound of the same model and N (its mean throughput) and the
    row's fraction of it, the median over repeats of throughput / the bound job's of the same repeat
    (paired, like the bench's ratios, so that load which slows a whole repeat cancels)."""
    bound = {
        (r["model"], r["workers"], r["repeat"]): r["samples_per_sec"]
        for r in records
        if r["strategy"] == BOUND and r["ok"]
    }
    means = {(r["model"], r["workers"]): r["samples_per_sec_mean"] for r in rows if r["strategy"] == BOUND}
    for row in rows:
        key = (row["model"], row["workers"])
        pairs = [
            r["samples_per_sec"] / bound[key + (r["repeat"],)]
            for r in records
            if r["ok"]
            and r["model"] == row["model"]
            and r["strategy"] == row["strategy"]
            and r["workers"] == row["workers"]
            and (*key, r["repeat"]) in bound
        ]
        row.update(
            bound_samples_per_sec=means.get(key, math.nan), of_bound=statistics.median(pairs) if pairs else math.nan
        )


CSV_FIELDS = (
    "model",
    "strategy",
    "workers",
    "servers",
    "world_size",
    "repeats",
    "failed",
    "samples_per_sec_mean",
    "samples_per_sec_std",
    "samples_per_sec_min",
    "samples_per_sec_max",
    "speedup",
    "speedup_std",
    "efficiency",
    "efficiency_std",
    "bound_samples_per_sec",
    "of_bound",
    "step_ms_mean",
    "step_ms_std",
    "comm_wait_ms_mean",
    "comm_wait_ms_std",
    "predicted_samples_per_sec",
    "predicted_efficiency",
    "prediction_error_pct",
)


def write_csv(path: str, rows: list[dict]) -> None:
    with open(path, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=CSV_FIELDS, extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow({k: (f"{v:.6g}" if isinstance(v, float) else v) for k, v in r.items()})


def comparison_series(rows: list[dict], curves: dict) -> tblog.Series:
    """The comparison's runs: one per strategy, step = N, with the same tags per model: measured
    speedup, efficiency and samples/s, and the cost model's curve (``scaling/predicted_*``) in the
    same run, so that a concept has one colour in every chart. (TensorBoard has 7 run colours:
    a run per curve would repeat them.)"""
    series: tblog.Series = {}
    for r in rows:
        if not r["repeats"]:
            continue
        m, s, n = r["model"], r["strategy"], r["workers"]
        tblog.add_point(series, s, f"perf/samples_per_sec/{m}", n, r["samples_per_sec_mean"])
        tblog.add_point(series, s, f"scaling/speedup/{m}", n, r["speedup"])
        tblog.add_point(series, s, f"scaling/efficiency/{m}", n, r["efficiency"])
        if not math.isnan(r.get("of_bound", math.nan)):  # the fraction of the no-exchange bound
            tblog.add_point(series, s, f"scaling/of_bound/{m}", n, r["of_bound"])
    for m, per in curves.items():
        for s, pts in per.items():
            for p in pts:
                tblog.add_point(series, s, f"scaling/predicted_efficiency/{m}", p["workers"], p["efficiency"])
                tblog.add_point(series, s, f"scaling/predicted_speedup/{m}", p["workers"], p["speedup"])
    return series


COMPARISON_FIGURES = (
    "scaling/speedup",
    "scaling/efficiency",
    "scaling/of_bound",
    "perf/samples_per_sec",
    "scaling/predicted_efficiency",
)


def hparams_sessions(res: dict[str, Any]) -> list[tuple[str, dict[str, Any], dict[str, float]]]:
    """One HParams session per job of the grid: what it ran and what it measured. A job's efficiency
    is its throughput over N x the mean one-worker throughput of its strategy."""
    base = {
        (r["model"], r["strategy"]): r["samples_per_sec_mean"]
        for r in res["rows"]
        if r["workers"] == 1 and r["repeats"]
    }
    bound = {
        (j["model"], j["workers"], j["repeat"]): j["samples_per_sec"]
        for j in res["jobs"]
        if j["strategy"] == BOUND and j["ok"]
    }
    out = []
    for j in res["jobs"]:
        hp = dict(j.get("hparams") or {"model": j["model"], "strategy": j["strategy"], "workers": j["workers"]})
        metrics: dict[str, float] = {}
        if j["ok"]:
            one = base.get((j["model"], j["strategy"]))
            metrics = {
                "samples_per_sec": j["samples_per_sec"],
                "step_ms": j["step_ms"],
                "comm_wait_ms": j["comm_wait_ms"],
                "efficiency": j["samples_per_sec"] / (j["workers"] * one) if one else math.nan,
            }
            b = bound.get((j["model"], j["workers"], j["repeat"]))
            if b:  # the bound job of the same repeat
                metrics["of_bound"] = j["samples_per_sec"] / b
            if j.get("time_to_target_s") is not None:
                metrics["time_to_target_s"] = j["time_to_target_s"]
        out.append((f"{j['model']}/{j['strategy']}-n{j['workers']}-r{j['repeat']}", hp, metrics))
    return out


def write_tensorboard(out: str, res: dict[str, Any]) -> dict[str, dict[str, list]]:
    """``out/tensorboard``: the comparison (one run per strategy, Custom Scalars layout) and
    ``out/hparams``: one HParams session per job. Returns the layout."""
    series = comparison_series(res["rows"], res["curves"])
    categories = tblog.model_categories(res["models"], COMPARISON_FIGURES)
    notes = (
        f"Step = number of workers N; one run per strategy. `scaling/predicted_*` is the calibrated cost "
        f"model on {res['given_network']['label']}. The jobs' own runs: "
        f"`{tblog.JOBS_DIR}/`, their HParams: `{tblog.HPARAMS_DIR}/`."
    )
    lay = tblog.write_comparison(os.path.join(out, tblog.COMPARISON_DIR), series, categories, notes)
    tblog.write_hparams(os.path.join(out, tblog.HPARAMS_DIR), hparams_sessions(res))
    return lay


def plot_predicted(path: str, curves: dict, given_label: str) -> None:
    """predicted.png: the cost model's efficiency to 1024 workers on the given network."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = list(curves)
    fig, axes = plt.subplots(1, max(1, len(models)), figsize=(4.6 * max(1, len(models)), 4.0), squeeze=False)
    for ax, m in zip(axes[0], models, strict=False):
        for s, pts in curves[m].items():
            color, marker = STYLE.get(s, ("black", "x"))
            # dashed: the colocated PS's curve lies on the ring's (same bytes, same messages)
            ax.plot(
                [p["workers"] for p in pts],
                [p["efficiency"] for p in pts],
                color=color,
                marker=marker,
                ms=4,
                ls="--" if s == "ps-sync-colocated" else "-",
                label=s,
            )
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
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=10
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True, timeout=10
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return (head + (" with uncommitted changes" if dirty else "")) if head else "unknown"


def load_summary(records: list[dict]) -> str:
    loads = [r["loadavg_before"] for r in records]
    return f"median {statistics.median(loads):.1f}, max {max(loads):.1f}" if loads else "–"


def _fmt(v: float, spec: str = ".3g") -> str:
    return "–" if v is None or (isinstance(v, float) and math.isnan(v)) else format(v, spec)


def compute_sentence(res: dict[str, Any]) -> str:
    """What compute per step the model used, per model, and where each figure came from."""
    from .calibrate import COMPUTE_SOURCES

    if not res["compute_s"]:
        return "Compute per step: not known (no job of the grid succeeded), so nothing is predicted."
    by_source: dict[str, list[str]] = {}
    for m, c in res["compute_s"].items():
        by_source.setdefault(res.get("compute_source", {}).get(m, "one-worker"), []).append(f"{m} {1e3 * c:.1f} ms")
    return " ".join(f"Compute per step = {COMPUTE_SOURCES[src]}: {', '.join(figs)}." for src, figs in by_source.items())


def concept_engine(rows: list[dict], models: list[str]) -> list[str]:
    """Per model and worker count > 1: the concept x engine table (:mod:`..engines`)."""
    out = []
    for m in models:
        for n in sorted({r["workers"] for r in rows if r["model"] == m and r["workers"] > 1}):
            speed = {
                r["strategy"]: r["samples_per_sec_mean"]
                for r in rows
                if r["model"] == m and r["workers"] == n and r["repeats"]
            }
            out += engines.markdown(f"{m}, N={n}, concept x engine", speed, fmt=".1f")
    return (["## Concept or implementation?", ""] + out) if out else []


def report_markdown(res: dict[str, Any]) -> str:
    cfg, rows = res["config"], res["rows"]
    L = [
        f"# Scaling: ring allreduce vs parameter server ({res['started']})",
        "",
        f"Command: `{' '.join(res['command'])}`  ",
        f"Machine: {res['machine']['cores']} cores, {res['machine']['platform']}; every rank runs one thread; "
        f"grid took {res['seconds'] / 60:.1f} min. Code: {res['code']}.  ",
        f"Data: {cfg['data']}; {cfg['repeats']} repeat(s) per point (repeats are the outer loop); worker counts "
        f"{', '.join(map(str, cfg['workers']))}. HOROVOD_CYCLE_TIME of the allreduce jobs: "
        f"{res['horovod_cycle']['knob']} (`--horovod-cycle-ms {cfg['horovod_cycle_ms']}`). "
        f"Load average before the jobs: {res['loadavg']} (other work on the machine slows the jobs it overlaps).",
        "",
        "## Definitions",
        "",
        "- throughput = samples per second over the measured steps (warm-up excluded), all workers together;",
        "- speedup(N) = throughput(N) / throughput(1), each strategy against its own one-worker run;",
        "- efficiency(N) = speedup(N) / N;",
        "- bound = the no-exchange bound: the same N workers at the same time, each training alone on its shard "
        "(`--strategy none`), what N workers reach on these cores with a free network (on emulated hosts: the "
        "same jobs, nothing on the links); of bound = throughput / the bound's, the median over repeats of "
        "same-repeat pairs;",
        "- N counts workers; a dedicated parameter server's extra processes are listed beside it (servers) "
        "and run on the same cores;",
        "- ± is the sample standard deviation over repeats (propagated for speedup and efficiency);",
        "- model = the calibrated cost model's prediction for the same point; error = (model - measured) / measured.",
        "",
    ]
    for m in res["models"]:
        plan = res["plans"][m]
        L += [
            f"## {m}",
            "",
            f"{plan['batch_size']} samples per worker and step, {plan['warmup']} warm-up + {plan['steps']} "
            f"measured steps, gradient {res['gradient_bytes'][m] / 1e6:.2f} MB.",
            "",
            "| strategy | N | servers | samples/s | speedup | efficiency | bound samples/s | of bound | step ms | "
            "comm wait ms | model samples/s | error |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for r in (r for r in rows if r["model"] == m):
            if not r["repeats"]:
                L.append(f"| {r['strategy']} | {r['workers']} | {r['servers']} | failed | | | | | | | | |")
                continue
            L.append(
                f"| {r['strategy']} | {r['workers']} | {r['servers']} | "
                f"{_fmt(r['samples_per_sec_mean'], '.1f')} ± {_fmt(r['samples_per_sec_std'], '.1f')} | "
                f"{_fmt(r['speedup'], '.2f')} ± {_fmt(r['speedup_std'], '.2f')} | "
                f"{_fmt(r['efficiency'], '.2f')} | {_fmt(r.get('bound_samples_per_sec', math.nan), '.1f')} | "
                f"{_fmt(r.get('of_bound', math.nan), '.2f')} | {_fmt(r['step_ms_mean'], '.1f')} | "
                f"{_fmt(r['comm_wait_ms_mean'], '.2f')} | {_fmt(r['predicted_samples_per_sec'], '.1f')} | "
                f"{_fmt(r['prediction_error_pct'], '+.0f')}{'' if math.isnan(r['prediction_error_pct']) else ' %'} |"
            )
        L.append("")
    L += concept_engine(rows, res["models"])
    L += ["![measured speedup](scaling.png)", ""]
    if res["notes"]:
        L += ["## Skipped or failed", ""] + [f"- {n}" for n in res["notes"]] + [""]
    L += [
        "## Cost model",
        "",
        "step = compute + exchange (no overlap assumed); exchange per strategy, with N workers, gradient S bytes, "
        "latency alpha per message and link bandwidth B:",
        "",
        "- ring allreduce: 2(N-1) alpha + 2(N-1)/N S/B",
        "- PS, K dedicated servers: 2 max(K, N) alpha + 2 max(S/B, N S/(K B)) (push + pull)",
        "- PS colocated: 2(N-1) alpha + 2(N-1)/N S/B",
        "",
        compute_sentence(res),
        "",
    ]
    if res["calibration"] and res["calibration_source"]:
        L += [
            f"Calibrated from `{res['calibration_source']}` (least squares on relative error over the size sweep):",
            "",
            "| strategy | from commbench | N | alpha us | B GB/s |",
            "|---|---|---:|---:|---:|",
        ]
        for s, c in res["calibration"].items():
            L.append(
                f"| {s} | {c['impl']} | {c['workers']} | {1e6 * c['alpha_s']:.1f} | {c['bandwidth_Bps'] / 1e9:.3f} |"
            )
        L.append("")
    elif res["calibration"]:  # a known network, not a fit
        c = next(iter(res["calibration"].values()))
        L += [
            f"Network: {c['impl']} (alpha {1e6 * c['alpha_s']:.1f} us, B {c['bandwidth_Bps'] / 1e6:.2f} MB/s per "
            "link and direction), for every strategy: no calibration run needed.",
            "",
        ]
    else:
        L += ["No calibration (commbench skipped or failed): the measured table has no model column.", ""]
    if res["curves"]:
        given = res["given_network"]
        L += [
            f"### Predicted efficiency to 1024 workers, {given['label']}",
            "",
            "Same compute per step as measured here, a network of the given link speed and latency "
            f"(`--net-gbps {given['gbps']:g} --net-latency-us {given['latency_us']:g}`):",
            "",
            "| model | strategy | " + " | ".join(f"N={n}" for n in (2, 8, 64, 256, 1024)) + " |",
            "|---|---|" + "---:|" * 5,
        ]
        for m, per in res["curves"].items():
            for s, pts in per.items():
                by_n = {p["workers"]: p for p in pts}
                L.append(
                    f"| {m} | {s} | " + " | ".join(f"{by_n[n]['efficiency']:.2f}" for n in (2, 8, 64, 256, 1024)) + " |"
                )
        L += [
            "",
            "The ring and the colocated PS move the same bytes in the same number of messages, so the model "
            "gives them one curve; what separates them in the measured tables is the implementations.",
            "",
            "![predicted efficiency](predicted.png)",
            "",
        ]
    L += [
        "## Files",
        "",
        "- `results.csv`, `results.json`: every figure above, with min/max and each repeat's throughput;",
        "- `commbench/commbench.md`: the calibration run, the exchange alone (when it ran);",
        "- `tensorboard/`: the comparison, one TensorBoard run per strategy: speedup, efficiency and "
        "samples/s against the worker count (step = N) and the predicted efficiency, one Custom Scalars "
        "chart per figure with one line per strategy:",
        "",
        f"      make tensorboard RUN={res['out_dir']}/tensorboard",
        "",
        "- `hparams/`: one HParams session per job (strategy, placement, mode, engine, workers, model, link "
        "rate; samples/s, step ms, efficiency):",
        "",
        f"      make tensorboard RUN={res['out_dir']}/hparams",
        "",
        "- `jobs/<model>/<strategy>-n<N>-r<k>/`: each job's own TensorBoard run and metrics.json; `logs/`: its output;",
        f"- redraw this report, the plots and TensorBoard from `results.json`: "
        f"`python -m lab.scaling.report {res['out_dir']}`.",
        "",
    ]
    return "\n".join(L)


def write_outputs(res: dict[str, Any]) -> None:
    """Everything a grid writes from its results (results.json aside): csv, TensorBoard, plots, report."""
    out = res["out_dir"]
    write_csv(os.path.join(out, "results.csv"), res["rows"])
    write_tensorboard(out, res)
    plot_measured(os.path.join(out, "scaling.png"), res["rows"], res["models"])
    if res["curves"]:
        plot_predicted(os.path.join(out, "predicted.png"), res["curves"], res["given_network"]["label"])
    with open(os.path.join(out, "report.md"), "w") as fh:
        fh.write(report_markdown(res))


def main(argv: list[str] | None = None) -> int:
    """``python -m lab.scaling.report OUT``: redraw a grid's outputs from its results.json."""
    import argparse

    p = argparse.ArgumentParser(
        prog="python -m lab.scaling.report",
        description="Redraw report.md, the plots, results.csv and TensorBoard "
        "(tensorboard/, hparams/) of a scaling grid from its results.json.",
    )
    p.add_argument("out", help="the grid's output directory (holds results.json)")
    args = p.parse_args(argv)
    path = os.path.join(args.out, "results.json")
    try:
        with open(path) as fh:
            res = methods.renamed(json.load(fh))  # a run directory of the older names too
    except (OSError, ValueError) as e:
        print(f"report: error: cannot read {path} ({e}); give the output directory of a scaling grid", file=sys.stderr)
        return 2
    res["out_dir"] = args.out
    write_outputs(res)
    print(f"-> {args.out}/report.md, scaling.png, {tblog.COMPARISON_DIR}/, {tblog.HPARAMS_DIR}/", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
