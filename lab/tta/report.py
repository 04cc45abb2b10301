"""The time-to-accuracy grid's outputs: report.md, results.csv, time_to_accuracy.png and the TensorBoard summary."""

from __future__ import annotations

import csv
import statistics
from typing import Any

from .spec import methods

CSV_FIELDS = ("model", "method", "workers", "servers", "hosts", "repeat", "ok", "target", "reached",
              "seconds_to_target", "steps_to_target", "epochs_to_target", "samples_to_target", "steps",
              "steps_per_epoch", "eval_every", "samples_per_sec", "step_ms", "staleness_mean", "staleness_max",
              "job_seconds", "loadavg_before", "error")


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
        w = SummaryWriter(log_dir=f"{path}/{r['model']}/{r['method']}-n{r['workers']}-r{r['repeat']}")
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


# One colour per concept family (ring: blues, dedicated PS: reds, colocated PS: greens); asynchronous
# methods dashed, so that a method keeps its look in every panel.
PLOT_STYLE = {"ring-horovod": ("#1f4e9c", "-"), "ring-mpi": ("#4fa3e0", "-"),
              "ps-sync-dedicated": ("#b2182b", "-"), "ps-async-dedicated": ("#ef8a62", "--"),
              "ps-sync-colocated": ("#1b7837", "-"), "ps-async-colocated": ("#7fbf7b", "--")}


def plot_time_to_accuracy(path: str, res: dict[str, Any]) -> list[list[tuple[str, int]]]:
    """time_to_accuracy.png: per model (rows) and worker count (columns), every job's evaluated figure
    against wall-clock seconds since its first training step, the target as a dotted line and a star
    where a job reached it. Returns, per panel, the (method, N) of the lines drawn."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    from allreduce_train.config import parse_target

    from ..common.plots import no_data

    jobs = [j for j in res["jobs"] if j["ok"] and j.get("evals")]
    models = list(res["targets"])
    ns = sorted({j["workers"] for j in res["jobs"]}) or [1]
    fig, axes = plt.subplots(max(1, len(models)), len(ns), figsize=(4.2 * len(ns), 3.4 * max(1, len(models))),
                             squeeze=False)
    drawn: list[list[tuple[str, int]]] = []
    for row, model in zip(axes, models):
        _, op, value = parse_target(res["targets"][model])
        key = metric_key(res["targets"][model])
        for ax, n in zip(row, ns):
            sel = [j for j in jobs if j["model"] == model and j["workers"] == n]
            hosts = next((j["hosts"] for j in res["jobs"] if j["model"] == model and j["workers"] == n), "")
            if not sel:
                no_data(ax, f"{model}, N = {n}: no job with evaluations")
                drawn.append([])
                continue
            lines, ys = [], []
            for j in sel:
                pts = [(e["seconds"], e[key]) for e in j["evals"] if key in e]
                if not pts:
                    continue
                color, ls = PLOT_STYLE.get(j["method"], ("black", "-"))
                ax.plot(*zip(*pts), color=color, ls=ls, lw=1.4, marker=".", ms=3,
                        label=f"{j['method']}" + (f" r{j['repeat']}" if j["repeat"] > 1 else ""))
                if j.get("reached"):  # the evaluation that reached the target
                    hit = next(e for e in j["evals"] if e["step"] == j["steps_to_target"])
                    ax.plot([hit["seconds"]], [hit[key]], marker="*", ms=11, color=color, mec="black", mew=0.5, ls="none")
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


def markdown(res: dict[str, Any]) -> str:
    from launch.mpirun import describe_mpi_allreduce

    cfg, jobs = res["config"], res["jobs"]
    mpi = describe_mpi_allreduce(cfg["mpi_allreduce"]) if "mpi_allreduce" in cfg else "not recorded"
    loads = [j["loadavg_before"] for j in jobs if j.get("loadavg_before") is not None]
    load = f"median {statistics.median(loads):.1f}, max {max(loads):.1f}" if loads else "–"
    L = [f"# Time to accuracy ({res['started']})", "",
         f"Command: `{' '.join(res['command'])}`  ",
         f"Machine: {res['machine']['cores']} cores, {res['machine']['platform']}; one thread per rank; the grid "
         f"took {res['minutes']:.1f} min. Load average (1 min) before the jobs: {load} -- other work on the "
         "machine slows the jobs it overlaps, so wall times are this machine's under this load.", "",
         "## Definitions", "",
         f"- every job trains from the same seed ({cfg['seed']}) with the model's own recipe and data until the first "
         f"evaluation that reaches the target; evaluations run {cfg['evals_per_epoch']} times per epoch, so steps "
         f"to target are resolved to 1/{cfg['evals_per_epoch']} epoch and are an upper bound;",
         "- time = wall-clock seconds from the first training step to that evaluation's end (evaluations "
         "included; start-up, data loading and process launch excluded); steps = optimizer steps of one worker; "
         "epochs = steps / steps per epoch, i.e. passes over the training data by all workers together;",
         "- async/sync steps: steps to target of an asynchronous PS over its synchronous twin (same placement, "
         "same N): the cost of stale gradients; staleness = mean updates a gradient missed on the server;",
         "- N = workers; dedicated servers run beside them; N from "
         + (f"{cfg['emulate_from']} up runs on emulated hosts (one rank per network namespace, {cfg['link_rate']} "
            "links, all on this machine's cores; Open MPI's MPI_Allreduce there: "
            f"{mpi})" if cfg["emulate_from"] else "– (no emulated hosts)") + ".", ""]
    for model, target in res["targets"].items():
        sel = [j for j in jobs if j["model"] == model]
        L += [f"## {model}: {target}", "", f"Measured on: {res['what'][model]}.", "",
              "| method | N | hosts | reached | time to target s | steps | epochs | async/sync steps | staleness | "
              "samples/s | final | load |",
              "|---|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
        sync_steps = {(j["method"], j["workers"], j["repeat"]): j.get("steps_to_target") for j in sel if j["ok"]}
        for j in sel:
            head = f"| {j['method']} | {j['workers']} | {j['hosts']} |"
            if not j["ok"]:
                L.append(f"{head} failed: {j['error']} (see {j['log']}) | | | | | | | | |")
                continue
            m = methods().get(j["method"])
            ratio = "–"
            if m is not None and not m.synchronous and j.get("steps_to_target"):
                base = sync_steps.get((m.sync_peer, j["workers"], j["repeat"]))
                ratio = f"{j['steps_to_target'] / base:.2f}" if base else "–"
            final = {k: v for k, v in j["final"].items() if k == metric_key(target)}
            L.append(f"{head} {'yes' if j['reached'] else 'no'} | {_f(j.get('seconds_to_target'), '.1f')} | "
                     f"{j.get('steps_to_target', j['steps'])}{'' if j['reached'] else ' (all)'} | "
                     f"{_f(j.get('epochs_to_target'), '.2f')} | {ratio} | {_f(j.get('staleness_mean'), '.2f')} | "
                     f"{j['samples_per_sec']:.0f} | {', '.join(f'{v:.4g}' for v in final.values()) or '–'} | "
                     f"{_f(j['loadavg_before'], '.1f')} |")
        L.append("")
        fastest = sorted((j for j in sel if j["ok"] and j["reached"]), key=lambda j: j["seconds_to_target"])
        if fastest:
            f = fastest[0]
            L += [f"Fastest to the target: {f['method']} with {f['workers']} worker(s), {f['seconds_to_target']:.1f} s.",
                  ""]
    L += ["![every job's figure against wall-clock seconds; stars where a job reached the target]"
          "(time_to_accuracy.png)", ""]
    if res["notes"]:
        L += ["## Skipped or failed", ""] + [f"- {n}" for n in res["notes"]] + [""]
    L += ["## Files", "",
          "- `results.json`, `results.csv`: every figure above, with each job's evaluations (step, epoch, seconds, "
          "figures);",
          "- `time_to_accuracy.png`: the figure above (per model and N, every method against wall-clock seconds);",
          "- `runs/<model>/<method>-n<N>-r<k>/`: each job's TensorBoard run and metrics.json; `logs/`: its output;",
          "- `summary/`: each job's evaluations against the step (`tta/<metric>`; switch the horizontal axis to "
          "Relative for wall-clock time) and against milliseconds since training started (`tta/<metric>_vs_ms`):", "",
          f"      make tensorboard RUN={res['out_dir']}/summary     # http://127.0.0.1:6007 (6006 hangs mpirun)", ""]
    return "\n".join(L)
