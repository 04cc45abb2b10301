"""The time-to-accuracy grid's outputs: report.md, results.csv, time_to_accuracy.png and the TensorBoard summary."""

from __future__ import annotations

import csv
import math
import statistics
from typing import Any

from ..common import recipe
from .spec import methods

CSV_FIELDS = (
    "model",
    "method",
    "concept",
    "recipe",
    "workers",
    "servers",
    "hosts",
    "link_rate",
    "repeat",
    "ok",
    "target",
    "reached",
    "seconds_to_target",
    "steps_to_target",
    "epochs_to_target",
    "samples_to_target",
    "steps",
    "steps_per_epoch",
    "eval_every",
    "samples_per_sec",
    "step_ms",
    "comm_wait_ms",
    "staleness_mean",
    "staleness_max",
    "job_seconds",
    "loadavg_before",
    "error",
    "pred_step_ms",
    "model_ratio",
)


def write_csv(path: str, records: list[dict[str, Any]]) -> None:
    with open(path, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=CSV_FIELDS, extrasaction="ignore")
        w.writeheader()
        for r in records:
            w.writerow({k: (f"{v:.6g}" if isinstance(v, float) else v) for k, v in r.items() if k in CSV_FIELDS})


def metric_key(target: str) -> str:
    """``eval/accuracy>=0.89`` -> ``eval_accuracy``, the key of that figure in metrics.json's evals."""
    from allreduce_train.config import parse_target

    return parse_target(target)[0].replace("/", "_")


def write_tensorboard(path: str, records: list[dict[str, Any]]) -> None:
    """One run per job under ``path``: each evaluation's figure against the training step (tag
    ``tta/<metric>``; TensorBoard's "Relative" axis shows it against wall-clock seconds, because each
    point carries the job's start + its seconds as wall time) and against the milliseconds since
    training started as the step (tag ``tta/<metric>_vs_ms``), so the default axis is wall-clock too."""
    from torch.utils.tensorboard import SummaryWriter

    for r in records:
        if not r["ok"] or not r["evals"]:
            continue
        key = metric_key(r["target"])
        name = r.get("name") or f"{r['method']}-n{r['workers']}-r{r['repeat']}"
        w = SummaryWriter(log_dir=f"{path}/{r['model']}/{name}")
        origin = 1_000_000_000.0  # a fixed origin: every run's "Relative" axis starts at its first step
        for e in r["evals"]:
            if key not in e:
                continue
            w.add_scalar(f"tta/{key}", e[key], e["step"], walltime=origin + e["seconds"])
            w.add_scalar(f"tta/{key}_vs_ms", e[key], round(1e3 * e["seconds"]), walltime=origin + e["seconds"])
        if r.get("reached"):
            w.add_scalar("tta/seconds_to_target", r["seconds_to_target"], r["workers"])
            w.add_scalar("tta/steps_to_target", r["steps_to_target"], r["workers"])
        w.close()


# One colour per exchange family (ring: blues, dedicated PS: reds, colocated PS: greens); asynchronous
# methods dashed, so that a method keeps its look in every panel. A concept on the allreduce engines has
# a colour of its own and the engine's line style (Horovod dash-dot, mpi engine solid); the PS's 16 bits
# keep their exchange's colour, dotted (fp16) or dash-dot (bf16).
PLOT_STYLE = {
    "ring-horovod": ("#1f4e9c", "-"),
    "ring-mpi": ("#4fa3e0", "-"),
    "ps-sync-dedicated": ("#b2182b", "-"),
    "ps-async-dedicated": ("#ef8a62", "--"),
    "ps-sync-colocated": ("#1b7837", "-"),
    "ps-async-colocated": ("#7fbf7b", "--"),
}
CONCEPT_COLOR = {
    "fp16": "#e08214",
    "bf16": "#8c510a",
    "powersgd": "#762a83",
    "localsgd": "#35978f",
    "diloco": "#c51b7d",
}
SHARDED_COLOR = {
    1: "#b2abd2",
    2: "#5e3c99",
    3: "#2d004b",
}  # the sharded stages: one purple each, darker as more is sharded
LONG_PERIOD_COLOR = "#003c30"  # local SGD with H > 4


def plot_style(method: str) -> tuple[str, str]:
    """(colour, line style) of a method's line in time_to_accuracy.png."""
    if method in PLOT_STYLE:
        return PLOT_STYLE[method]
    m = methods().get(method)
    if m is None:
        return "black", "-"
    if method.startswith("ps-"):
        return PLOT_STYLE.get(m.base, ("black", "-"))[0], ":" if m.concept == "fp16" else "-."
    color = LONG_PERIOD_COLOR if m.concept == "localsgd" and m.param > 4 else CONCEPT_COLOR.get(m.concept, "black")
    if m.concept == "sharded":
        color = SHARDED_COLOR[m.param]
    return color, "-." if "-horovod-" in method else "-"


def panel_key(job: dict[str, Any]) -> tuple[int, str]:
    """(N, link rate) of a job's panel and table group; "" for this machine."""
    return job["workers"], job.get("link_rate") or ""


def panel_order(key: tuple[int, str]) -> tuple[int, int, float]:
    """Panels by N, then this machine, then the links from the fastest (unlimited) to the slowest."""
    from ..emulation.netns import parse_rate

    n, rate = key
    return (n, 0, 0.0) if not rate else (n, 1, -(parse_rate(rate) or math.inf))


def plot_time_to_accuracy(path: str, res: dict[str, Any]) -> list[list[tuple[str, int]]]:
    """time_to_accuracy.png: per model (rows) and worker count and link rate (columns), every job's
    evaluated figure against wall-clock seconds since its first training step, the target as a dotted
    line and a star where a job reached it. Returns, per panel, the (method, N) of the lines drawn."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    from allreduce_train.config import parse_target

    from ..common.plots import no_data

    jobs = [j for j in res["jobs"] if j["ok"] and j.get("evals")]
    models = list(res["targets"])
    panels = sorted({panel_key(j) for j in res["jobs"]}, key=panel_order) or [(1, "")]
    fig, axes = plt.subplots(
        max(1, len(models)), len(panels), figsize=(4.2 * len(panels), 3.4 * max(1, len(models))), squeeze=False
    )
    drawn: list[list[tuple[str, int]]] = []
    for row, model in zip(axes, models, strict=False):
        _, op, value = parse_target(res["targets"][model])
        key = metric_key(res["targets"][model])
        for ax, (n, rate) in zip(row, panels, strict=True):
            sel = [j for j in jobs if j["model"] == model and panel_key(j) == (n, rate)]
            hosts = next((j["hosts"] for j in res["jobs"] if j["model"] == model and panel_key(j) == (n, rate)), "")
            if not sel:
                no_data(ax, f"{model}, N = {n}{f', {rate}' if rate else ''}: no job with evaluations")
                drawn.append([])
                continue
            lines, ys = [], []
            for j in sel:
                pts = [(e["seconds"], e[key]) for e in j["evals"] if key in e]
                if not pts:
                    continue
                color, ls = plot_style(j["method"])
                ax.plot(
                    *zip(*pts, strict=True),
                    color=color,
                    ls=ls,
                    lw=1.4,
                    marker=".",
                    ms=3,
                    label=f"{j['method']}" + (f" r{j['repeat']}" if j["repeat"] > 1 else ""),
                )
                if j.get("reached"):  # the evaluation that reached the target
                    hit = next(e for e in j["evals"] if e["step"] == j["steps_to_target"])
                    ax.plot(
                        [hit["seconds"]], [hit[key]], marker="*", ms=11, color=color, mec="black", mew=0.5, ls="none"
                    )
                ys += [y for _, y in pts]
                lines.append((j["method"], n))
            drawn.append(lines)
            ax.axhline(value, color="0.3", ls=":", lw=1)
            if op == "<=":  # perplexity: a log scale, from the best figure to a few times the target
                ax.set_yscale("log")
                plain = matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}")
                ax.yaxis.set_major_formatter(plain)
                ax.yaxis.set_minor_formatter(plain)
                ax.set_ylim(min(ys + [value]) * 0.9, value * 3)
            else:
                ax.set_ylim(max(min(ys), value - 0.15), max(ys + [value]) + 0.01)
            ax.set_title(f"{model}, N = {n} ({hosts})", fontsize=9)
            ax.set_xlabel("seconds since the first training step")
            ax.set_ylabel(f"{key} ({op} {value:g})")
            ax.grid(alpha=0.3)
            ax.legend(fontsize=6, loc="lower right" if op == ">=" else "upper right", framealpha=0.6)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return drawn


def _f(v, spec: str) -> str:
    return "–" if v is None else format(v, spec)


def _median(vals: list[float]) -> float | None:
    return statistics.median(vals) if vals else None


def mean_step_ms(job: dict[str, Any]) -> float | None:
    """A worker's mean step over the job (global batch / samples per second): local SGD's median step
    is a local one, its mean counts the averaging steps too, as the cost model's per-step figure does."""
    sps, batch = job.get("samples_per_sec"), job.get("global_batch")
    return 1e3 * batch / sps if sps and batch else job.get("step_ms")


def baselines(jobs: list[dict[str, Any]]) -> dict[tuple[tuple[int, str], int], dict[str, Any]]:
    """Per (N, link rate) and repeat, the job every other is measured against: the fastest 16-bit allreduce
    that reached the target. A communication-reduction method has to beat it, not float32 (Agarwal et al.,
    MLSys 2022: compression rarely beats a well-tuned 16-bit synchronous baseline)."""
    out: dict[tuple[tuple[int, str], int], dict[str, Any]] = {}
    for j in jobs:
        m = methods().get(j["method"])
        if not (j["ok"] and j.get("reached") and m is not None and m.sixteen_bit_allreduce):
            continue
        key = (panel_key(j), j["repeat"])
        if key not in out or j["seconds_to_target"] < out[key]["seconds_to_target"]:
            out[key] = j
    return out


def verdicts(jobs: list[dict[str, Any]], base: dict[tuple[tuple[int, str], int], dict[str, Any]]) -> list[str]:
    """One line per (N, link rate) and repeat that ran a concept: the baseline, the fastest other method
    against it, and the methods that did not reach the target."""
    table = methods()
    groups: dict[tuple[tuple[int, str], int], list[dict[str, Any]]] = {}
    for j in jobs:
        groups.setdefault((panel_key(j), j["repeat"]), []).append(j)
    out = []
    for key, sel in groups.items():
        if all(j["method"] not in table or table[j["method"]].concept == "none" for j in sel):
            continue  # no concept in this group: nothing to set against a 16-bit baseline
        (n, rate), r = key
        where = f"N = {n}, {rate or 'this machine'}" + (f", repeat {r}" if r > 1 else "")
        b = base.get(key)
        missed = [j["method"] for j in sel if j["ok"] and not j.get("reached")]
        failed = [j["method"] for j in sel if not j["ok"]]
        line = f"- {where}: "
        if b is None:
            line += "no 16-bit allreduce reached the target, so nothing is measured against it"
        else:
            line += f"baseline {b['method']} {b['seconds_to_target']:.1f} s"
            best = min(
                (j for j in sel if j["ok"] and j.get("reached") and j is not b),
                key=lambda j: j["seconds_to_target"],
                default=None,
            )
            if best is not None:
                rel = best["seconds_to_target"] / b["seconds_to_target"]
                line += (
                    f"; fastest other: {best['method']} {best['seconds_to_target']:.1f} s ({rel:.2f}x, "
                    + ("beats" if rel < 1 else "does not beat")
                    + " the baseline)"
                )
        if missed:
            line += f"; did not reach the target: {', '.join(missed)}"
        if failed:
            line += f"; failed: {', '.join(failed)}"
        out.append(line + ".")
    if not out:
        return []
    return [
        "Against the 16-bit baseline (time to target over the fastest 16-bit allreduce's at the same N and "
        "link; below 1 beats it):",
        "",
        *out,
        "",
    ]


def cost_model_method(method: str) -> tuple[Any, str, int]:
    """(costmodel.Method, exchange kind, servers) of a grid method, for lab/common/costmodel.predict_method."""
    m = methods()[method]
    return m.cost, m.kind, max(1, m.servers)


def gathered_modules(model: str) -> int:
    """The modules sharded stage 3 gathers for a registered ``model``; 0 (one per tensor, the cost model's
    most) for a user's model."""
    from ..common import gradients

    try:
        return gradients.modules(model)
    except KeyError:
        return 0


def add_model_ratios(jobs: list[dict[str, Any]]) -> None:
    """Each emulated job's predicted step (costmodel.predict_method: the job's own compute, i.e. its median
    step less its median exchange wait, plus the method's extra compute and exchange over the emulated link,
    no latency) and ``model_ratio`` = measured mean step / predicted step. Jobs on this machine have no
    link to model and get none."""
    from ..common import costmodel, gradients
    from ..common.links import link_network

    for j in jobs:
        if not (j["ok"] and j.get("link_rate") and j["method"] in methods() and j.get("comm_wait_ms") is not None):
            continue
        method, kind, servers = cost_model_method(j["method"])
        compute_s = max(0.0, (j["step_ms"] - j["comm_wait_ms"]) / 1e3)
        p = costmodel.predict_method(
            method,
            kind,
            j["workers"],
            j.get("grad_shapes") or gradients.shapes(j["model"]),
            compute_s,
            j["global_batch"] // j["workers"],
            link_network(j["link_rate"]),
            servers,
            modules=gathered_modules(j["model"]),
        )
        j.update(
            compute_ms=1e3 * compute_s,
            pred_step_ms=1e3 * p.step_s,
            pred_exchange_ms=1e3 * p.exchange_s,
            pred_extra_compute_ms=1e3 * p.extra_compute_s,
            model_bytes_per_step=p.volume,
            model_ratio=(mean_step_ms(j) or math.nan) / (1e3 * p.step_s),
        )


def markdown(res: dict[str, Any]) -> str:
    from launch.mpirun import describe_mpi_allreduce

    cfg, jobs = res["config"], res["jobs"]
    mpi = describe_mpi_allreduce(cfg["mpi_allreduce"]) if "mpi_allreduce" in cfg else "not recorded"
    loads = [j["loadavg_before"] for j in jobs if j.get("loadavg_before") is not None]
    load = f"median {statistics.median(loads):.1f}, max {max(loads):.1f}" if loads else "–"
    L = [
        f"# Time to accuracy ({res['started']})",
        "",
        f"Command: `{' '.join(res['command'])}`  ",
        *(f"Grid: `{c}`  " for c in res.get("merged_from", [])),
        f"Machine: {res['machine']['cores']} cores, {res['machine']['platform']}; one thread per rank; the grid "
        f"took {res['minutes']:.1f} min. Load average (1 min) before the jobs: {load} -- other work on the "
        "machine slows the jobs it overlaps, so wall times are this machine's under this load.",
        "",
        f"Recipe: {recipe.describe(cfg.get('recipe', []))}. Ran (optimizer, LR schedule, precision, from each "
        "job's metrics.json):",
        "",
        *(
            f"- {line}"
            for line in recipe.ran_lines(jobs, "method") or ["not recorded (a grid before the recipe flags)"]
        ),
        "",
        "## Definitions",
        "",
        f"- every job trains from the same seed ({cfg['seed']}) with the recipe above and the model's own data until "
        f"the first evaluation that reaches the target; evaluations run {cfg['evals_per_epoch']} times per epoch, so "
        f"steps to target are resolved to 1/{cfg['evals_per_epoch']} epoch and are an upper bound;",
        "- time = wall-clock seconds from the first training step to that evaluation's end (evaluations "
        "included; start-up, data loading and process launch excluded); steps = optimizer steps of one worker; "
        "epochs = steps / steps per epoch, i.e. passes over the training data by all workers together;",
        "- async/sync steps: steps to target of an asynchronous PS over its synchronous twin (same placement, "
        "same N): the cost of stale gradients; staleness = mean updates a gradient missed on the server;",
        "- vs 16-bit: time to target over the baseline's, the fastest 16-bit allreduce (fp16/bf16, either engine; "
        "marked **(baseline)**) at the same N and link rate: a communication-reduction method has to beat it "
        "(docs/concepts.md); step ms = a worker's mean step (global batch / samples per second, evaluations "
        "excluded);",
        *(
            [
                "- model ratio: the measured mean step over the cost model's "
                "(lab/common/costmodel.py `predict_method`: the job's own compute, its median step less its median "
                "exchange wait, plus the method's extra compute and its exchange over the emulated link, no added "
                "latency); above 1 the job was slower than the model says; emulated jobs only (this machine has no "
                "link to model);"
            ]
            if any("model_ratio" in j for j in jobs)
            else []
        ),
        "- N = workers; dedicated servers run beside them; N from "
        + (
            f"{cfg['emulate_from']} up runs on emulated hosts (one rank per network namespace, "
            f"{', '.join(cfg['rates']) if 'rates' in cfg else cfg['link_rate']} links, one row per rate, all on this "
            "machine's cores; Open MPI's MPI_Allreduce there: "
            f"{mpi})"
            if cfg["emulate_from"]
            else "– (no emulated hosts)"
        )
        + ".",
        "",
    ]
    model_column = any("model_ratio" in j for j in jobs)
    for model, target in res["targets"].items():
        sel = [j for j in jobs if j["model"] == model]
        base = baselines(sel)
        L += [
            f"## {model}: {target}",
            "",
            f"Measured on: {res['what'][model]}.",
            "",
            "| method | N | hosts | reached | time to target s | vs 16-bit | steps | epochs | async/sync steps | "
            "staleness | samples/s | step ms | final | load |" + (" model ratio |" if model_column else ""),
            "|---|---:|---|---|" + "---:|" * (10 + model_column),
        ]
        sync_steps = {(j["method"], panel_key(j), j["repeat"]): j.get("steps_to_target") for j in sel if j["ok"]}
        for j in sel:
            b = base.get((panel_key(j), j["repeat"]))
            is_base = b is j  # (compared apart: `b is j` in the expression would narrow j to b's type for mypy)
            name = f"**{j['method']}** (baseline)" if is_base else j["method"]
            head = f"| {name} | {j['workers']} | {j['hosts']} |"
            if not j["ok"]:
                L.append(f"{head} failed: {j['error']} (see {j['log']}) |" + " |" * (10 + model_column))
                continue
            m = methods().get(j["method"])
            ratio = "–"
            if m is not None and not m.synchronous and j.get("steps_to_target"):
                peer = sync_steps.get((m.sync_peer, panel_key(j), j["repeat"]))
                ratio = f"{j['steps_to_target'] / peer:.2f}" if peer else "–"
            rel = f"{j['seconds_to_target'] / b['seconds_to_target']:.2f}" if b and j.get("reached") else "–"
            final = {k: v for k, v in j["final"].items() if k == metric_key(target)}
            L.append(
                f"{head} {'yes' if j['reached'] else 'no'} | {_f(j.get('seconds_to_target'), '.1f')} | {rel} | "
                f"{j.get('steps_to_target', j['steps'])}{'' if j['reached'] else ' (all)'} | "
                f"{_f(j.get('epochs_to_target'), '.2f')} | {ratio} | {_f(j.get('staleness_mean'), '.2f')} | "
                f"{j['samples_per_sec']:.0f} | {_f(mean_step_ms(j), '.1f')} | "
                f"{', '.join(f'{v:.4g}' for v in final.values()) or '–'} | {_f(j['loadavg_before'], '.1f')} |"
                + (f" {_f(j.get('model_ratio'), '.2f')} |" if model_column else "")
            )
        L.append("")
        fastest = sorted((j for j in sel if j["ok"] and j["reached"]), key=lambda j: j["seconds_to_target"])
        if fastest:
            f = fastest[0]
            link = f" at {f['link_rate']}" if f.get("link_rate") else ""
            L += [
                f"Fastest to the target: {f['method']} with {f['workers']} worker(s){link}, "
                f"{f['seconds_to_target']:.1f} s.",
                "",
            ]
        L += verdicts(sel, base)
    L += [
        "![every job's figure against wall-clock seconds; stars where a job reached the target](time_to_accuracy.png)",
        "",
    ]
    if res["notes"]:
        L += ["## Skipped or failed", ""] + [f"- {n}" for n in res["notes"]] + [""]
    L += [
        "## Files",
        "",
        "- `results.json`, `results.csv`: every figure above, with each job's evaluations (step, epoch, seconds, "
        "figures);",
        "- `time_to_accuracy.png`: the figure above (per model, N and link rate, every method against wall-clock "
        "seconds);",
        "- `runs/<model>/<method>-n<N>[-<rate>]-r<k>/`: each job's TensorBoard run and metrics.json (the link rate "
        "in the name on emulated hosts); `logs/`: its output;",
        "- `summary/`: each job's evaluations against the step (`tta/<metric>`; switch the horizontal axis to "
        "Relative for wall-clock time) and against milliseconds since training started (`tta/<metric>_vs_ms`):",
        "",
        f"      make tensorboard RUN={res['out_dir']}/summary     # http://127.0.0.1:6007 (6006 hangs mpirun)",
        "",
    ]
    return "\n".join(L)
