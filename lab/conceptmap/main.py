"""``concept-map``: which communication-reduction concept the cost model predicts fastest per step.

    python -m lab concept-map                                     # what `make concept-map` runs
    python -m lab concept-map --measured runs/scaling-netns/<time>/results.json --out runs/concept-map

One panel per model (rows) and worker count N (columns): link bandwidth on the x axis, per-message
latency on the y axis, each point coloured by the method whose predicted step is shortest
(lab/common/costmodel.py ``predict_method`` on a ring allreduce: fp32, fp16, PowerSGD rank r, local
SGD every H; docs/concepts.md). The model adds compute, the method's extra compute and the exchange
without overlap, so the winner does not depend on the compute per step; the compute (``--compute-ms``)
only decides where the map is pale: where the winner's step is within ``--pale-pct`` % of the fp32
ring's, the choice hardly matters. The model predicts per step only: a method that needs more
steps to reach the same quality (local SGD, PowerSGD) can win here and lose in time to accuracy.

Time to accuracy is the default view (``--view tta``): each method's predicted step is multiplied by its
steps to a quality target over synchronous float32's, measured by the time-to-accuracy grid
(:data:`STEPS_RATIO`: docs/time_to_accuracy.md's figures; ``--steps-from DIR`` takes them from a grid's
results.json), so a method that sends less per step but needs more steps wins only where the bytes it saves
outweigh them; then the compute per step matters too. A model without measured steps keeps the per-step map
(its panel's title says so); a method without them is left out of that model's panels. ``--view step`` is
the per-step map. The steps ratios were measured at 4 workers: used as they are at every N, not extrapolated.

``--measured`` marks the emulated cluster's points (a ``scaling-netns`` results.json): per model,
link rate and worker count, the measured fastest of the methods run on one engine, as a triangle on
the latency axis' floor (the emulation adds no latency) in the panel of the nearest N, with the
model's pick for the same rows beside it.

Output in ``--out`` (default runs/concept-map/<time>): concept_map.png, concept_map.json (the
winners, the settings, the measured points), report.md, tensorboard/ (the map as an image summary
``concepts/map`` and the report as text: ``make tensorboard RUN=<out>/tensorboard``).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import shutil
import sys
import time
from itertools import pairwise
from typing import Any

from ..common import costmodel, gradients, methods
from ..common.links import link_network
from ..common.tblog import clear_events

DEFAULT_MODELS = ("lenet5", "ptb-lstm-small", "resnet18")
DEFAULT_WORKERS = (4, 16, 64, 256)
# PowerSGD rank 4 and local SGD H = 4: the time-to-accuracy grid's and the scaling grids' concept variants
DEFAULT_METHODS = ("fp32", "fp16", "powersgd-r4", "localsgd-h4")
# Compute per step on this project's 2-core build machine, one worker, one thread: the idle scaling
# run's one-worker throughput (docs/scaling.md: 6258, 179 and 22.6 samples/s at batch 64, 20 and 8).
DEFAULT_COMPUTE_MS = {"lenet5": 10.2, "ptb-lstm-small": 112.0, "resnet18": 354.0}
COLOURS = {
    "fp32": "#9e9e9e",
    "fp16": "#1f77b4",
    "bf16": "#17becf",
    "powersgd": "#ff7f0e",
    "localsgd": "#2ca02c",
    "localsgd+": "#98df8a",
    "zero": "#5e3c99",
}
TB_RUN = "concept-map"
# Steps to the target over float32's, 4 emulated hosts (docs/time_to_accuracy.md, "What they add": LeNet-5 to
# test accuracy 0.89, float32 986 steps as fp16, PowerSGD r4 1102, local SGD H = 16 1682; the small LSTM to
# perplexity 300 at 1 Gbit/s, float32 333 steps, fp16 296, local SGD H = 16 370 "with one evaluation more"
# than the others, so PowerSGD's is taken as fp16's 296; the page does not state it).
STEPS_RATIO = {
    "lenet5": {"fp16": 1.0, "powersgd-r4": 1102 / 986, "localsgd-h16": 1682 / 986},
    "ptb-lstm-small": {"fp16": 296 / 333, "powersgd-r4": 296 / 333, "localsgd-h16": 370 / 333},
}
STEPS_SOURCE = "docs/time_to_accuracy.md (4 emulated hosts)"
TTA_METHODS = ("fp32", "fp16", "powersgd-r4", "localsgd-h16")  # the methods with measured steps


class MapError(ValueError):
    """Bad input; the message names the flag."""


def colour(label: str) -> str:
    """A method's colour: one per concept (every PowerSGD rank alike, local SGD lighter with 16 bits, every
    sharded stage alike)."""
    if label.startswith("zero"):
        return COLOURS["zero"]
    if label.startswith("localsgd"):
        return COLOURS["localsgd+" if "+" in label else "localsgd"]
    return COLOURS.get("powersgd" if label.startswith("powersgd") else label, "black")


def logspace(lo: float, hi: float, num: int) -> list[float]:
    return [lo * (hi / lo) ** (i / (num - 1)) for i in range(num)]


def rate_gbit(rate: str) -> float:
    """An emulated link rate (``100mbit``, ``1gbit``, ``10mbit``) in Gbit/s."""
    return link_network(rate).bandwidth * 8 / 1e9


def winners(
    methods: list[costmodel.Method],
    shapes,
    n: int,
    compute_s: float,
    bw_gbit: list[float],
    lat_us: list[float],
    host: costmodel.Host,
    steps: dict[str, float] | None = None,
    modules: int = 0,
) -> tuple[list[list[int]], list[list[float]]]:
    """Per (latency, bandwidth): the index of the fastest method, and its step / the fp32 ring's step. With
    ``steps`` (label -> steps to the target over float32's): the fastest to the target, and its time over fp32's;
    a method missing from ``steps`` is never picked. ``modules``: what sharded stage 3 gathers one at a time
    (costmodel.method_cost); stages 1 and 2 cost the ring's exchange, so they tie with fp32 and never win a
    point of the map (listed first, fp32 takes the tie): the sharded concept saves memory, not time."""
    weight = [1.0 if steps is None or m.label == "fp32" else steps.get(m.label, math.inf) for m in methods]
    costs = [costmodel.method_cost(m, costmodel.ALLREDUCE, n, shapes, host=host, modules=modules) for m in methods]
    base = costmodel.method_cost(costmodel.BASELINE, costmodel.ALLREDUCE, n, shapes, host=host)
    best, gain = [], []
    for lat in lat_us:
        brow, grow = [], []
        for bw in bw_gbit:
            net = costmodel.Network.from_gbit_us(bw, lat)
            times = [
                w * (compute_s + c.extra_compute_s + c.exchange_s(net)) for w, c in zip(weight, costs, strict=True)
            ]
            i = min(range(len(times)), key=times.__getitem__)
            brow.append(i)
            grow.append(times[i] / (compute_s + base.exchange_s(net)))
        best.append(brow)
        gain.append(grow)
    return best, gain


def measured_points(path: str) -> list[dict[str, Any]]:
    """The emulated cluster's comparisons in a scaling-netns results.json: per (rate, model, workers,
    engine) with two or more methods, the measured fastest (shortest step) and the model's (shortest
    predicted extra compute + exchange, the part of the step a method changes)."""
    try:
        with open(path) as fh:
            report = methods.renamed(json.load(fh))  # a run directory of the older names too
        rows = report["rows"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise MapError(f"--measured {path}: not a scaling-netns results.json ({e})") from None
    groups: dict[tuple, dict[str, dict]] = {}
    for r in rows:
        if not r.get("ok") or "step_ms" not in r or not r["strategy"].startswith("ring-"):
            continue
        label = r.get("method", "fp32")
        engine = r["strategy"][: -len(label) - 1] if r["strategy"].endswith("-" + label) else r["strategy"]
        groups.setdefault((r["rate"], r["model"], r["workers"], engine), {})[label] = r
    out = []
    for (rate, model, n, engine), by in sorted(groups.items()):
        if len(by) < 2:
            continue
        out.append(
            {
                "rate": rate,
                "gbit": rate_gbit(rate),
                "model": model,
                "workers": n,
                "engine": engine,
                "measured_best": min(by, key=lambda k: by[k]["step_ms"]),
                # the model's pick by the methods' own costs (extra compute + exchange): the jobs'
                # measured compute differs by the shared cores' load, not by the method
                "predicted_best": min(by, key=lambda k: by[k]["pred_step_ms"] - by[k].get("compute_ms", 0.0)),
                "steps_ms": {k: by[k]["step_ms"] for k in by},
                "measured_over_model": {k: by[k]["step_ms"] / by[k]["pred_step_ms"] for k in by},
            }
        )
    return out


def draw(
    path: str,
    models: list[str],
    workers: list[int],
    methods: list[costmodel.Method],
    grids: dict[tuple[str, int], tuple[list, list]],
    bw: list[float],
    lat: list[float],
    pale: float,
    points: list[dict[str, Any]],
    per_step: set[str] | None = None,
    view: str = "step",
) -> list[str]:
    """The map: a panel per (model, N). Returns the panels' titles, row by row."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.artist import Artist
    from matplotlib.colors import ListedColormap
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    labels = [m.label for m in methods]
    cmap = ListedColormap([colour(lb) for lb in labels])
    fig, axes = plt.subplots(
        len(models),
        len(workers),
        figsize=(3.3 * len(workers) + 0.6, 2.9 * len(models) + 1.2),
        squeeze=False,
        sharex=True,
        sharey=True,
    )

    # cell edges for pcolormesh on log axes: geometric midpoints
    def edges(v):
        mids = [math.sqrt(a * b) for a, b in pairwise(v)]
        return [v[0] ** 2 / mids[0], *mids, v[-1] ** 2 / mids[-1]]

    xe, ye = edges(bw), edges(lat)
    titles = []
    for i, model in enumerate(models):
        for j, n in enumerate(workers):
            ax = axes[i][j]
            best, gain = grids[(model, n)]
            ax.pcolormesh(xe, ye, best, cmap=cmap, vmin=-0.5, vmax=len(labels) - 0.5, shading="flat")
            paleness = [[1.0 if g > 1 - pale / 100 else float("nan") for g in row] for row in gain]
            ax.pcolormesh(xe, ye, paleness, cmap=ListedColormap(["white"]), alpha=0.6, shading="flat")
            ax.set_xscale("log")
            ax.set_yscale("log")
            title = f"{model}, N = {n}" + (" (per step)" if view == "tta" and model in (per_step or ()) else "")
            ax.set_title(title, fontsize=9)
            titles.append(title)
            if i == len(models) - 1:
                ax.set_xlabel("link bandwidth, Gbit/s")
            if j == 0:
                ax.set_ylabel("latency per message, µs")
            # the measured points: in the panel of the nearest N (log distance), on the latency floor
            near = [
                p
                for p in points
                if p["model"] == model and min(workers, key=lambda w: abs(math.log(w / p["workers"]))) == n
            ]
            for p in near:
                ax.scatter(
                    [p["gbit"]],
                    [lat[0]],
                    marker="^",
                    s=120,
                    color=colour(p["measured_best"]),
                    edgecolors="black",
                    linewidths=1.0,
                    clip_on=False,
                    zorder=5,
                )
                agree = "=" if p["measured_best"] == p["predicted_best"] else f"≠ model {p['predicted_best']}"
                ax.annotate(
                    f"N={p['workers']} {p['rate']}: {p['measured_best']} {agree}",
                    (p["gbit"], lat[0]),
                    xytext=(4, 8 + 9 * near.index(p)),
                    textcoords="offset points",
                    fontsize=6,
                    zorder=6,
                    bbox={"boxstyle": "round,pad=0.15", "fc": "white", "alpha": 0.8, "lw": 0},
                )
            ax.set_xlim(xe[0], xe[-1])
            ax.set_ylim(ye[0], ye[-1])
    handles: list[Artist] = [Patch(color=colour(lb), label=lb) for lb in labels]
    handles.append(Patch(facecolor="white", edgecolor="0.6", label=f"pale: within {pale:g} % of fp32"))
    if points:
        handles.append(
            Line2D(
                [],
                [],
                marker="^",
                color="white",
                markeredgecolor="black",
                markerfacecolor="0.8",
                markersize=9,
                label="measured fastest (emulated, no latency)",
            )
        )
    fig.legend(handles=handles, loc="lower center", ncol=len(handles), fontsize=8, frameon=False)
    fig.suptitle(
        "Fastest method to the target, predicted: measured steps x predicted step (ring allreduce)"
        if view == "tta"
        else "Fastest method per step, predicted (ring allreduce; compute + extra compute + exchange)",
        fontsize=10,
    )
    fig.tight_layout(rect=(0, 0.05, 1, 0.97))
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return titles


def write_tensorboard(logdir: str, png: str, text: str) -> None:
    """The map as an image summary (``concepts/map``) and the report as text (``concepts/report``)."""
    import matplotlib.image as mpimg
    from torch.utils.tensorboard import SummaryWriter

    clear_events(logdir)
    img = mpimg.imread(png)[:, :, :3]  # (H, W, C) float in [0, 1]
    w = SummaryWriter(log_dir=os.path.join(logdir, TB_RUN))
    w.add_image("concepts/map", img, 0, dataformats="HWC")
    w.add_text("concepts/report", text, 0)
    w.close()


def report_md(res: dict[str, Any]) -> str:
    labels = res["methods"]
    refs = res["reference_links"]
    out = [
        "# Which concept wins where (cost model)",
        "",
        f"`{res['command']}`. Ring allreduce, step = compute + the method's extra compute + its exchange "
        f"(lab/common/costmodel.py `predict_method`); host: {res['host']['mem_bw'] / 1e9:g} GB/s of memory "
        f"traffic, {res['host']['flops'] / 1e9:g} GFLOP/s; methods: {', '.join(labels)}.",
        "",
        *(
            [
                "Time to accuracy: each method's predicted step x its steps to the target over float32's ("
                + res["steps_source"]
                + "; measured at 4 workers, used as they are at every N): "
                + "; ".join(
                    f"{m} " + ", ".join(f"{k} {v:.2f}" for k, v in r.items()) for m, r in res["steps_ratio"].items()
                )
                + (f". Per step only (no steps measured): {', '.join(res['per_step'])}" if res["per_step"] else "")
                + ".",
                "",
            ]
            if res["view"] == "tta"
            else []
        ),
        "Predicted fastest method at some links (bandwidth / latency), and its "
        + ("time to the target over fp32's:" if res["view"] == "tta" else "step over the fp32 ring's:"),
        "",
        "| model | N | " + " | ".join(f"{g:g} Gbit/s, {u:g} µs" for g, u in refs) + " |",
        "|---|---:|" + "---|" * len(refs),
    ]
    for model in res["models"]:
        for n in res["workers"]:
            cells = []
            for g, u in refs:
                c = res["reference"][model][str(n)][f"{g:g}/{u:g}"]
                cells.append(f"{c['best']} ({c['over_fp32']:.2f})")
            out.append(f"| {model} | {n} | " + " | ".join(cells) + " |")
    out.append("")
    if res["measured"]:
        out += [
            "Measured on the emulated cluster (" + res["measured_source"] + "): fastest per model, rate, "
            "workers and engine; step ms per method (measured / model):",
            "",
            "| model | rate | N | engine | measured fastest | model's fastest | steps ms (measured / model) |",
            "|---|---|---:|---|---|---|---|",
        ]
        for p in res["measured"]:
            steps = ", ".join(f"{k} {v:.0f} ({p['measured_over_model'][k]:.2f})" for k, v in p["steps_ms"].items())
            out.append(
                f"| {p['model']} | {p['rate']} | {p['workers']} | {p['engine']} | {p['measured_best']} | "
                f"{p['predicted_best']} | {steps} |"
            )
        out.append("")
    return "\n".join(out)


def parse_compute(text: str, models: list[str]) -> dict[str, float]:
    out = {m: DEFAULT_COMPUTE_MS.get(m, 100.0) for m in models}
    for item in filter(None, (t.strip() for t in text.split(","))):
        name, sep, val = item.partition("=")
        try:
            ms = float(val)
        except ValueError:
            ms = -1.0
        if not sep or ms < 0:
            raise MapError(f"--compute-ms: expected model=milliseconds[,...] (got {item!r})")
        out[name.strip()] = ms
    return out


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--models",
        default=",".join(DEFAULT_MODELS),
        help=f"comma-separated models, one row of panels each (default: {','.join(DEFAULT_MODELS)})",
    )
    p.add_argument(
        "--workers",
        default=",".join(map(str, DEFAULT_WORKERS)),
        help="comma-separated worker counts N, one column each (default: 4,16,64,256)",
    )
    p.add_argument(
        "--view",
        choices=("tta", "step"),
        default="tta",
        help="tta (default): fastest to the quality target (measured steps x predicted step); step: fastest per step",
    )
    p.add_argument(
        "--steps-from",
        default="",
        metavar="DIR[,DIR...]",
        help="time-to-accuracy grids (their results.json) to take the steps ratios from, per model at its "
        f"largest worker count (default: {STEPS_SOURCE})",
    )
    p.add_argument(
        "--methods",
        default="",
        help="the concepts that compete: fp32, fp16, bf16, powersgd-rR, localsgd-hH, localsgd-hH+fp16 "
        f"(default: {','.join(TTA_METHODS)} with --view tta, {','.join(DEFAULT_METHODS)} with "
        "--view step)",
    )
    p.add_argument(
        "--bandwidth-gbit", default="0.01,100", help="bandwidth axis: lowest,highest Gbit/s (default: 0.01,100)"
    )
    p.add_argument("--latency-us", default="1,10000", help="latency axis: lowest,highest µs (default: 1,10000)")
    p.add_argument("--resolution", type=int, default=48, help="points per axis (default: 48)")
    p.add_argument(
        "--compute-ms",
        default="",
        help="compute per step, model=ms[,...] (default: this machine's, "
        + ", ".join(f"{m}={v:g}" for m, v in DEFAULT_COMPUTE_MS.items())
        + "); only the paleness uses it",
    )
    p.add_argument(
        "--pale-pct",
        type=float,
        default=5.0,
        help="pale where the winner's step is within this many %% of the fp32 ring's (default: 5)",
    )
    p.add_argument(
        "--mem-gbs",
        type=float,
        default=costmodel.HOST.mem_bw / 1e9,
        help="memory traffic per second of one core, GB/s, for the casts and copies (default: %(default)g)",
    )
    p.add_argument(
        "--gflops",
        type=float,
        default=costmodel.HOST.flops / 1e9,
        help="float32 GFLOP/s of one core, for PowerSGD's products (default: %(default)g)",
    )
    p.add_argument("--measured", default="", help="a scaling-netns results.json whose points to mark on the map")
    p.add_argument(
        "--copy-to", default="", help="also copy concept_map.png to this path (e.g. docs/img/concept_map.png)"
    )
    p.add_argument("--out", default="", help="output directory (default: runs/concept-map/<time>)")


def config(args: argparse.Namespace) -> dict[str, Any]:
    """The validated settings; MapError naming the flag otherwise."""
    from models import MODELS

    models = [m.strip() for m in args.models.split(",") if m.strip()]
    unknown = [m for m in models if m not in MODELS]
    if not models or unknown:
        raise MapError(
            f"--models: unknown model {unknown[0]!r}; choose from: {', '.join(MODELS)}"
            if unknown
            else "--models: give at least one model"
        )
    try:
        workers = [int(w) for w in args.workers.split(",") if w.strip()]
    except ValueError:
        raise MapError(f"--workers: expected comma-separated integers (got {args.workers!r})") from None
    if not workers or min(workers) < 2:
        raise MapError(f"--workers: give counts >= 2 (got {args.workers!r})")
    try:
        default = TTA_METHODS if args.view == "tta" else DEFAULT_METHODS
        methods = [costmodel.Method.parse(m) for m in (args.methods or ",".join(default)).split(",") if m.strip()]
    except ValueError as e:
        raise MapError(f"--methods: {e}") from None
    if not methods:
        raise MapError("--methods: give at least one method")
    axes = {}
    for flag, text in (("--bandwidth-gbit", args.bandwidth_gbit), ("--latency-us", args.latency_us)):
        try:
            lo, hi = (float(v) for v in text.split(","))
        except ValueError:
            raise MapError(f"{flag}: expected lowest,highest (got {text!r})") from None
        if not 0 < lo < hi:
            raise MapError(f"{flag}: expected 0 < lowest < highest (got {text!r})")
        axes[flag] = (lo, hi)
    if args.resolution < 2:
        raise MapError(f"--resolution must be >= 2 (got {args.resolution})")
    if args.mem_gbs <= 0 or args.gflops <= 0:
        raise MapError("--mem-gbs and --gflops must be > 0")
    if args.measured and not os.path.isfile(args.measured):
        raise MapError(f"--measured {args.measured}: file not found; give a scaling-netns results.json")
    return {
        "models": models,
        "workers": workers,
        "methods": methods,
        "bw": logspace(*axes["--bandwidth-gbit"], args.resolution),
        "lat": logspace(*axes["--latency-us"], args.resolution),
        "compute_ms": parse_compute(args.compute_ms, models),
        "host": costmodel.Host(mem_bw=args.mem_gbs * 1e9, flops=args.gflops * 1e9),
    }


def steps_ratios(dirs: str, models: list[str]) -> dict[str, dict[str, float]]:
    """Per model, each method's steps to the target over float32's: :data:`STEPS_RATIO`, or from time-to-accuracy
    grids (``DIR/results.json``) at the largest worker count where float32 (a ``ring-<engine>`` job) reached it."""
    if not dirs:
        return {m: dict(STEPS_RATIO[m]) for m in models if m in STEPS_RATIO}
    jobs = []
    for d in (d.strip() for d in dirs.split(",") if d.strip()):
        try:
            with open(os.path.join(d, "results.json")) as fh:
                jobs += [j for j in json.load(fh)["jobs"] if j.get("ok") and j.get("reached")]
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise MapError(f"--steps-from {d}: not a time-to-accuracy grid ({e})") from None
    out: dict[str, dict[str, float]] = {}
    for model in models:
        base = [j for j in jobs if j["model"] == model and j["method"] in ("ring-mpi", "ring-horovod")]
        if not base:
            continue
        n = max(j["workers"] for j in base)
        fp32 = min(j["steps_to_target"] for j in base if j["workers"] == n)
        for j in jobs:
            if j["model"] == model and j["workers"] == n and j.get("concept", "none") != "none":
                label = j["method"].split("-", 2)[2]  # ring-mpi-powersgd-r4 -> powersgd-r4
                out.setdefault(model, {})[label] = min(
                    out.get(model, {}).get(label, math.inf), j["steps_to_target"] / fp32
                )
    return out


REFERENCE_LINKS = ((0.01, 50.0), (0.1, 50.0), (1.0, 50.0), (10.0, 50.0), (100.0, 5.0))


def main(args: argparse.Namespace) -> int:
    try:
        cfg = config(args)
        points = measured_points(args.measured) if args.measured else []
    except MapError as e:
        print(f"concept-map: error: {e}", file=sys.stderr)
        return 2
    out = args.out or os.path.join("runs", "concept-map", time.strftime("%Y%m%d-%H%M%S"))
    os.makedirs(out, exist_ok=True)
    methods, host = cfg["methods"], cfg["host"]
    try:
        ratios = steps_ratios(args.steps_from, cfg["models"]) if args.view == "tta" else {}
    except MapError as e:
        print(f"concept-map: error: {e}", file=sys.stderr)
        return 2
    grids: dict[tuple[str, int], Any] = {}
    reference: dict[str, dict[str, dict]] = {}
    for model in cfg["models"]:
        shapes = gradients.shapes(model)
        compute_s = cfg["compute_ms"][model] / 1e3
        steps = ratios.get(model)
        for n in cfg["workers"]:
            grids[(model, n)] = winners(
                methods, shapes, n, compute_s, cfg["bw"], cfg["lat"], host, steps, gradients.modules(model)
            )
            ref = {}
            for g, u in REFERENCE_LINKS:
                best, gain = winners(methods, shapes, n, compute_s, [g], [u], host, steps, gradients.modules(model))
                ref[f"{g:g}/{u:g}"] = {"best": methods[best[0][0]].label, "over_fp32": gain[0][0]}
            reference.setdefault(model, {})[str(n)] = ref
    png = os.path.join(out, "concept_map.png")
    per_step = [m for m in cfg["models"] if m not in ratios] if args.view == "tta" else []
    titles = draw(
        png,
        cfg["models"],
        cfg["workers"],
        methods,
        grids,
        cfg["bw"],
        cfg["lat"],
        args.pale_pct,
        points,
        set(per_step),
        args.view,
    )
    labels = [m.label for m in methods]
    res = {
        "command": shlex.join(["python", "-m", "lab", *sys.argv[1:]]),
        "models": cfg["models"],
        "workers": cfg["workers"],
        "methods": labels,
        "bandwidth_gbit": cfg["bw"],
        "latency_us": cfg["lat"],
        "compute_ms": cfg["compute_ms"],
        "host": {"mem_bw": host.mem_bw, "flops": host.flops},
        "pale_pct": args.pale_pct,
        "panels": titles,
        "winners": {f"{m}/{n}": [[labels[i] for i in row] for row in grids[(m, n)][0]] for m, n in grids},
        "reference_links": [list(r) for r in REFERENCE_LINKS],
        "reference": reference,
        "measured": points,
        "measured_source": args.measured,
        "view": args.view,
        "steps_ratio": ratios,
        "steps_source": (args.steps_from or STEPS_SOURCE) if args.view == "tta" else "",
        "per_step": per_step,
    }
    text = report_md(res)
    with open(os.path.join(out, "concept_map.json"), "w") as fh:
        json.dump(res, fh, indent=1)
        fh.write("\n")
    with open(os.path.join(out, "report.md"), "w") as fh:
        fh.write(text + "\n")
    write_tensorboard(os.path.join(out, "tensorboard"), png, text)
    if args.copy_to:
        os.makedirs(os.path.dirname(args.copy_to) or ".", exist_ok=True)
        shutil.copyfile(png, args.copy_to)
    print(text, flush=True)
    print(f"-> {png}, {out}/report.md; make tensorboard RUN={out}/tensorboard", flush=True)
    return 0
