"""``make paper``'s report: the verdict per finding, the cost model's K table, the concept x engine split and
time to quality (report.md), the paper's figure (paper.png) and the TensorBoard comparison, all from the two
grids' results.json under the run's directory (lab/paper/main.py runs the grids)."""

from __future__ import annotations

import json
import math
import os
import shlex
from typing import Any

from ..common import costmodel, engines, gradients, methods, tblog
from ..common.links import link_network
from ..common.plots import STYLE, no_data

PAPER_MODELS = ("lenet5", "ptb-lstm-small")  # the paper's two workloads
SMALL, BIG = "lenet5", "ptb-lstm-small"  # "the small network" and "the bigger one" of its findings
# the paper's four exchanges (lab/common/methods.py's names; dedicated PS: TF 1.8's, colocated: MXNet 1.3's)
SHORT = {
    "ps-sync-dedicated": "centralized PS (dedicated)",
    "ps-sync-colocated": "decentralized PS (colocated)",
    "ring-horovod": "ring, Horovod",
    "ring-mpi": "ring, mpi4py engine",
}
STRATEGIES = tuple(SHORT)
# the time-to-accuracy grid's methods of the comparison (one colour per placement in every chart)
TTA_RUNS = (*STRATEGIES, "ps-async-dedicated", "ps-async-colocated")
# Single jobs on a shared 2-core machine: repeated grids put throughput ratios 5-10 % apart
# (docs/emulated_cluster.md), so a difference under this is "no significant difference".
TOLERANCE = 0.10
RATE_STYLE = ("-", "--", ":", "-.")


# ------------------------------------------------------------------------- reading the grids


def read_json(path: str) -> Any:
    try:
        with open(path) as fh:
            return methods.renamed(json.load(fh))  # a run directory of the older names too
    except (OSError, ValueError):
        return None


def collect(out: str) -> dict[str, Any]:
    """The figures the report needs, from the grids' results.json under ``out``.

    points: one per (model, rate, strategy, N) -- measured samples/s (mean over repeats), speedup over the
    same strategy's N = 1, and the cost model's step beside the measured one (scaling-netns): predicted
    samples/s = measured samples/s x measured step / predicted step. tta: every time-to-accuracy job."""
    top = read_json(os.path.join(out, "throughput", "results.json")) or {}
    pred = {(r["rate"], r["model"], r["strategy"], r["workers"]): r for r in top.get("rows", []) if r.get("ok")}
    points, loads = [], {}
    for rate in top.get("rates", []):
        grid = read_json(os.path.join(out, "throughput", rate, "results.json")) or {}
        loads[rate] = grid.get("loadavg", "")
        # the 1-minute load average before each job: on a shared machine the jobs' figures move with it
        before = {(j["model"], j["strategy"], j["workers"]): j.get("loadavg_before") for j in grid.get("jobs", [])}
        for r in grid.get("rows", []):
            if r["strategy"] not in STRATEGIES or not r["repeats"]:
                continue
            p = pred.get((rate, r["model"], r["strategy"], r["workers"]), {})
            pt = {
                "model": r["model"],
                "rate": rate,
                "strategy": r["strategy"],
                "workers": r["workers"],
                "samples_per_sec": r["samples_per_sec_mean"],
                "samples_per_sec_std": r["samples_per_sec_std"],
                "speedup": r["speedup"],
                "step_ms": p.get("step_ms"),
                "wait_ms": p.get("wait_ms"),
                "pred_step_ms": p.get("pred_step_ms"),
                "model_mb_per_step": (p.get("model_bytes_per_step") or 0) / 1e6,
                "load": _first(before.get((r["model"], r["strategy"], r["workers"]))),
            }
            pt["pred_samples_per_sec"] = (
                pt["samples_per_sec"] * pt["step_ms"] / pt["pred_step_ms"]
                if pt["step_ms"] and pt["pred_step_ms"]
                else math.nan
            )
            points.append(pt)
    one = {(p["model"], p["rate"], p["strategy"]): p for p in points if p["workers"] == 1}
    for p in points:
        b = one.get((p["model"], p["rate"], p["strategy"]))
        p["pred_speedup"] = p["pred_samples_per_sec"] / b["pred_samples_per_sec"] if b else math.nan
    tta = read_json(os.path.join(out, "tta", "results.json")) or {}
    tta_cmd = tta.get("command", "")
    return {
        "points": points,
        "loads": loads,
        "tta": tta.get("jobs", []),
        "targets": tta.get("targets", {}),
        "tta_command": shlex.join(tta_cmd) if isinstance(tta_cmd, list) else tta_cmd,
        "throughput_command": top.get("command", ""),
        "throughput_minutes": top.get("minutes"),
        "tta_minutes": tta.get("minutes"),
        "mpi_allreduce": top.get("mpi_allreduce", ""),
    }


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
        ded = at.get((model, rate, "ps-sync-dedicated", n))
        if strategy != "ps-sync-colocated" or n == 1 or ded is None:
            continue
        sp = col["speedup"] / ded["speedup"] if ded["speedup"] else math.nan
        thr = col["samples_per_sec"] / ded["samples_per_sec"]
        pthr = col["pred_samples_per_sec"] / ded["pred_samples_per_sec"] if ded["pred_samples_per_sec"] else math.nan
        psp = col["pred_speedup"] / ded["pred_speedup"] if ded["pred_speedup"] else math.nan
        # "scales better" judged on samples/s at the same N: a speedup is over the strategy's own N = 1, and
        # the dedicated PS's N = 1 already pays its server's exchange, so its speedup starts from a slow base
        if model == SMALL:
            claim = "decentralized PS scales better"
            holds, holds_sp = thr > 1 + TOLERANCE, sp > 1 + TOLERANCE
        else:
            claim = "no significant difference"
            holds, holds_sp = abs(thr - 1) <= TOLERANCE, abs(sp - 1) <= TOLERANCE
        out.append(
            {
                "model": model,
                "rate": rate,
                "workers": n,
                "claim": claim,
                "speedup_dedicated": ded["speedup"],
                "speedup_colocated": col["speedup"],
                "speedup_ratio": sp,
                "pred_speedup_ratio": psp,
                "throughput_ratio": thr,
                "pred_throughput_ratio": pthr,
                "holds": bool(holds),
                "holds_by_speedup": bool(holds_sp),
                "speedup_says": _ratio_word(sp, "decentralized scales better", "centralized scales better"),
                "throughput_says": _ratio_word(thr, "decentralized faster", "centralized faster"),
            }
        )
    return out


# ------------------------------------------------------------------------- outputs


def markdown(data: dict[str, Any], meta: dict[str, Any]) -> str:
    f = findings(data)
    out = [
        "# The paper's findings on this project",
        "",
        f"`{meta['command']}`, started {meta['started']}, {meta['minutes']:.1f} min on {meta['cpus']} cores "
        f"(load average {meta['load']}). One job per point: a ratio within {TOLERANCE:.0%} of 1 counts as "
        "no significant difference. Load average (1 min) before the throughput jobs: "
        + (", ".join(f"{r}: {v}" for r, v in data.get("loads", {}).items() if v) or "not recorded")
        + f" on {meta['cpus']} cores: where it is far above the core count the jobs shared the cores with "
        "other work, and single ratios carry that noise.",
        "",
        "The grids' own commands (their reports: throughput/report.md, tta/report.md): "
        + "; ".join(
            f"`{c}` ({m:.1f} min)" if isinstance(m, (int, float)) else f"`{c}`"
            for c, m in (
                (data["throughput_command"], data["throughput_minutes"]),
                (data["tta_command"], data["tta_minutes"]),
            )
            if c
        )
        + ".",
        "",
        "Centralized PS = dedicated servers (the paper's TensorFlow 1.8 setup), decentralized PS = a server "
        "beside each worker (its MXNet 1.3 setup); both on this trainer's mpi4py engine, synchronous. "
        "Speedup = samples/s at N / the same strategy's at N = 1; the cost model (lab/common/costmodel.py) "
        "predicts each step as the job's measured compute plus the modelled exchange at the link rate.",
        "",
        "## Verdicts per finding",
        "",
        "Holds here: judged on samples/s at the same N (col./ded.), with the cost model's ratio beside it. The "
        "paper's own measure, speedup over each strategy's N = 1, is in its own columns: the dedicated PS's "
        "N = 1 already pays its server's exchange, so its speedup starts from a slower base and can rise "
        "above the colocated PS's while its samples/s stay below them.",
        "",
        "| model | rate | N | paper's finding | col./ded. samples/s (model) | samples/s says | holds here | "
        "speedup ded. | speedup col. | col./ded. speedup (model) | holds by speedup |",
        "|---|---|---:|---|---:|---|---|---:|---:|---:|---|",
    ]
    for r in f:
        out.append(
            f"| {r['model']} | {r['rate']} | {r['workers']} | {r['claim']} | "
            f"{r['throughput_ratio']:.2f} ({_f(r['pred_throughput_ratio'], '.2f')}) | {r['throughput_says']} | "
            f"{'yes' if r['holds'] else 'no'} | {r['speedup_dedicated']:.2f} | {r['speedup_colocated']:.2f} | "
            f"{r['speedup_ratio']:.2f} ({_f(r['pred_speedup_ratio'], '.2f')}) | "
            f"{'yes' if r['holds_by_speedup'] else 'no'} |"
        )
    if not f:
        out.append("| no pair of dedicated and colocated PS jobs measured | | | | | | | | | | |")
    out += [
        "",
        "## Throughput and speedup",
        "",
        "| model | rate | strategy | N | samples/s | speedup | model's samples/s | step ms | wait ms | "
        "model's step ms | load |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for p in sorted(
        data["points"], key=lambda p: (p["model"], p["rate"], STRATEGIES.index(p["strategy"]), p["workers"])
    ):
        out.append(
            f"| {p['model']} | {p['rate']} | {p['strategy']} | {p['workers']} | {p['samples_per_sec']:.1f} | "
            f"{p['speedup']:.2f} | {_f(p['pred_samples_per_sec'], '.1f')} | {_f(p['step_ms'], '.1f')} | "
            f"{_f(p['wait_ms'], '.1f')} | {_f(p['pred_step_ms'], '.1f')} | {_f(p.get('load'), '.1f')} |"
        )
    out += k_markdown(data)
    out += ["", "## Concept and implementation apart", ""]
    keys = sorted({(p["model"], p["rate"], p["workers"]) for p in data["points"] if p["workers"] > 1})
    for model, rate, n in keys:
        speed = {
            p["strategy"]: p["samples_per_sec"]
            for p in data["points"]
            if (p["model"], p["rate"], p["workers"]) == (model, rate, n)
        }
        out += engines.markdown(f"{model}, {n} hosts at {rate}", speed, "samples/s", ".1f")
    out += tta_markdown(data)
    return "\n".join(out) + "\n"


def k_rows(data: dict[str, Any]) -> list[dict[str, Any]]:
    """The cost model's answer to "under which conditions": per model and rate at the largest N, the
    colocated PS's step against the dedicated PS's with K = 1, 2 and N servers, each at the compute
    measured in the colocated job (step - wait) and the emulated link (alpha = 0)."""
    out = []
    for p in data["points"]:
        top = max(q["workers"] for q in data["points"] if q["model"] == p["model"])
        if p["strategy"] != "ps-sync-colocated" or p["workers"] != top or top < 2 or not p["step_ms"]:
            continue
        n, net, size = top, link_network(p["rate"]), gradients.nbytes(p["model"])
        compute = max(0.0, (p["step_ms"] - (p["wait_ms"] or 0.0)) / 1e3)
        col = compute + costmodel.exchange_time(costmodel.PS_COLOCATED, n, size, net)
        ded = {
            k: compute + costmodel.exchange_time(costmodel.PS_DEDICATED, n, size, net, servers=k)
            for k in sorted({1, 2, n})
        }
        out.append(
            {
                "model": p["model"],
                "rate": p["rate"],
                "workers": n,
                "mb": size / 1e6,
                "compute_ms": 1e3 * compute,
                "colocated_ms": 1e3 * col,
                "dedicated_ms": {k: 1e3 * v for k, v in ded.items()},
                "ratio": {k: v / col for k, v in ded.items()},
            }
        )
    return out


def k_markdown(data: dict[str, Any]) -> list[str]:
    rows = k_rows(data)
    if not rows:
        return []
    ks = sorted({k for r in rows for k in r["ratio"]})
    out = [
        "",
        "## The cost model: which K makes the placements equal",
        "",
        "Colocated PS's samples/s over the dedicated PS's (= dedicated step / colocated step) as the cost "
        "model predicts it with K dedicated servers, each on a host of its own, at the compute measured in "
        "the colocated job: the dedicated servers' links carry N x S / K in and then out per step (push, then "
        "pull), a colocated host's link 2(N-1)/N x S each way at once (lab/common/costmodel.py).",
        "",
        "| model | rate | N | S (MB) | compute ms | colocated step ms | "
        + " | ".join(f"K={k}: ded./col." for k in ks)
        + " |",
        "|---|---|---:|---:|---:|---:|" + "---:|" * len(ks),
    ]
    for r in rows:
        out.append(
            f"| {r['model']} | {r['rate']} | {r['workers']} | {r['mb']:.2f} | {r['compute_ms']:.1f} | "
            f"{r['colocated_ms']:.1f} | " + " | ".join(_f(r["ratio"].get(k), ".2f") for k in ks) + " |"
        )
    return out


def tta_markdown(data: dict[str, Any]) -> list[str]:
    jobs = data["tta"]
    if not jobs:
        return ["## Time to quality", "", "Not run (--tta-models none) or no results.", ""]
    out = [
        "## Time to quality",
        "",
        "Targets: "
        + ", ".join(f"{m}: `{t}`" for m, t in data["targets"].items())
        + " (the time-to-accuracy grid's; real data).",
        "",
        "| model | rate | N | method | samples/s | reached | seconds | steps | vs its sync peer (s) |",
        "|---|---|---:|---|---:|---|---:|---:|---:|",
    ]
    by = {(j["model"], j.get("link_rate"), j["workers"], j["method"]): j for j in jobs}
    for j in jobs:
        if not j.get("ok"):
            out.append(
                f"| {j['model']} | {j.get('link_rate')} | {j['workers']} | {j['method']} | failed: "
                f"{j.get('error', '')} | | | | |"
            )
            continue
        peer = by.get((j["model"], j.get("link_rate"), j["workers"], j["method"].replace("-async-", "-sync-")))
        vs = (
            "–"
            if peer is j or not peer or not j.get("reached") or not peer.get("reached")
            else f"{j['seconds_to_target'] / peer['seconds_to_target']:.2f}x"
        )
        out.append(
            f"| {j['model']} | {j.get('link_rate')} | {j['workers']} | {j['method']} | "
            f"{j['samples_per_sec']:.0f} | {'yes' if j.get('reached') else 'no'} | "
            f"{_f(j.get('seconds_to_target'), '.1f')} | {j.get('steps_to_target', j.get('steps'))} | {vs} |"
        )
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
    for row, model in zip(axes, models, strict=False):
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
                kw = {
                    "color": color,
                    "marker": marker,
                    "ls": RATE_STYLE[i % len(RATE_STYLE)],
                    "label": f"{SHORT[s]}, {rate}",
                }
                row[0].errorbar(
                    [p["workers"] for p in line],
                    [p["samples_per_sec"] for p in line],
                    yerr=[p["samples_per_sec_std"] for p in line],
                    capsize=3,
                    **kw,
                )
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
        run = j["method"]
        labels.append(f"{j['method']} N={j['workers']} {j.get('link_rate') or ''}")
        values.append(j["seconds_to_target"] if j.get("reached") else 0.0)
        colors.append(STYLE.get(run.replace("-async-", "-sync-"), ("0.5", ""))[0])
    bars = ax.barh(range(len(values)), values, color=colors)
    for b, j in zip(bars, jobs, strict=True):
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
            tblog.add_point(
                series,
                j["method"],
                f"paper/time_to_target_s/{j['model']}/{j.get('link_rate')}",
                j["workers"],
                j["seconds_to_target"],
            )
    titles = {
        "samples_per_sec": "samples/s, all workers",
        "speedup": "speedup = samples/s(N) / samples/s(1)",
        "time_to_target_s": "seconds to the quality target",
    }
    rates = list(dict.fromkeys([*(p["rate"] for p in data["points"]), *(j.get("link_rate") for j in data["tta"])]))
    # per model, rate by rate (as the grids ran them), each rate's figures in the order of ``titles``
    tags = sorted(
        {t for tags in series.values() for t in tags},
        key=lambda t: (
            rates.index(t.split("/")[3]) if t.split("/")[3] in rates else len(rates),
            list(titles).index(t.split("/")[1]),
        ),
    )
    for t in tags:
        _, fig, model, rate = t.split("/")
        charts.setdefault(model, []).append((f"{model} at {rate}: {titles[fig]}", t))
    tblog.write_comparison(
        os.path.join(out, tblog.COMPARISON_DIR),
        series,
        list(charts.items()),
        "Step = number of workers N (one emulated host each); one run per concept; the link rate "
        "in the tag. docs/paper.md reads these figures against the paper's findings.",
    )


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
