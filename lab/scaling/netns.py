"""The scaling grid on an emulated cluster: measured step times beside the cost model's predictions.

    python -m lab scaling-netns                # what `make scaling-netns` runs
    python -m lab scaling-netns --rates 100mbit --models lenet5 --strategies ring-horovod

For every link rate, the ``scaling`` grid (same jobs, same per-model plans) runs with its launcher
hook swapped for the emulated cluster's (lab/emulation/netns.py): one rank per host, so every rank has a
link of its own -- W workers for allreduce and the colocated PS, W workers + K servers for the
dedicated PS, the servers on hosts of their own as in the cost model. Each job's metrics.json
gives the median step time and the median time a worker waited on the exchange; the kernel's link
counters (printed by the launcher) give the bytes on the busiest link. The cost model
(allreduce_train/costmodel.py) predicts the exchange for the configured bandwidth with alpha = 0
(the emulation adds no latency), and the step as the job's own compute (step - wait) plus that
exchange.

Output: runs/scaling-netns/<time>/report.md (this comparison), results.json, tensorboard/ (every
rate's comparison in one logdir: a run per strategy, the rate in the tag, step = N) and hparams/ (every job); <rate>/
holds the scaling grid's own outputs for that rate (its report, plots, logs, TensorBoard runs).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import statistics
import sys
import time
from typing import Any

from ..common import costmodel, engines, gradients, tblog
from ..common.jobs import EMULATED_ALLREDUCE, EMULATED_ALLREDUCE_HELP
from ..common.links import RateError, link_network, parse_rates
from . import grid as scaling
from . import report as grid_report
from .spec import DEFAULT_STRATEGIES, parse_list

TRAFFIC_RE = re.compile(r"(h\d+) (\d+)/(\d+)")


def add_arguments(p: argparse.ArgumentParser) -> None:
    from launch.mpirun import add_mpi_allreduce_arg

    p.add_argument(
        "--hosts",
        default="1,2,4",
        help="comma-separated worker counts, one emulated host per worker; 1 is the speedup baseline (default: 1,2,4)",
    )
    p.add_argument("--rates", default="1gbit,100mbit", help="link rates per direction (default: 1gbit,100mbit)")
    p.add_argument(
        "--strategies",
        default=",".join(DEFAULT_STRATEGIES),
        help=f"comma-separated subset of {', '.join(scaling.variants())} (default: "
        f"{','.join(DEFAULT_STRATEGIES)}; the others are the communication-reduction concepts on "
        "them, docs/concepts.md)",
    )
    p.add_argument(
        "--ps-servers", type=int, default=1, help="K for ps-sync-dedicated, each on its own host (default: 1)"
    )
    p.add_argument("--models", default="lenet5,ptb-lstm-small", help="(default: lenet5,ptb-lstm-small)")
    p.add_argument("--repeats", type=int, default=1, help="jobs per grid point (default: 1)")
    p.add_argument("--steps", type=int, default=0, help="measured steps per job (default: the scaling grid's plan)")
    p.add_argument("--job-timeout", type=float, default=1200, help="seconds per job before it is stopped")
    add_mpi_allreduce_arg(p, EMULATED_ALLREDUCE, EMULATED_ALLREDUCE_HELP)
    p.add_argument("--out-dir", default="", help="default: runs/scaling-netns/<time>")


def grid_config(args: argparse.Namespace) -> scaling.GridConfig:
    """The scaling grid for one rate: the given workers only, no calibration run (the network is
    known: the configured rate), validated by the grid's own rules."""
    hosts = parse_list(args.hosts, "--hosts", int)
    if min(hosts) < 1:
        raise scaling.GridError(f"--hosts: counts must be >= 1 (got {args.hosts!r})")
    if args.job_timeout < 120:
        raise scaling.GridError(f"--job-timeout must be >= 120 s (got {args.job_timeout:g})")
    cfg = scaling.GridConfig(
        strategies=parse_list(args.strategies, "--strategies"),
        models=parse_list(args.models, "--models"),
        workers=sorted(set(hosts)),
        repeats=args.repeats,
        steps=args.steps,
        ps_servers=args.ps_servers,
        commbench=False,
        job_timeout=args.job_timeout,
    )
    cfg.validate()
    return cfg


def traffic(log_path: str) -> dict[str, list[int]]:
    """{host: [sent, received]} from the launcher's line about the links, or {}."""
    with open(log_path) as fh:
        line = next((ln for ln in fh if ln.startswith("link traffic")), "")
    return {h: [int(tx), int(rx)] for h, tx, rx in TRAFFIC_RE.findall(line)}


def compare(rate: str, res: dict[str, Any], cfg: scaling.GridConfig) -> list[dict[str, Any]]:
    """One row per job of the grid: what was measured and what the cost model says for ``rate``.

    A variant with a communication-reduction method (docs/concepts.md) is predicted with its
    method's bytes, messages and extra compute (``costmodel.predict_method``): predicted step =
    compute + extra compute + exchange. Local SGD's exchange comes every H steps, so its measured
    step is the mean over the measured steps (from samples/s) and its compute a local step's (the
    medians of step and wait are those of the local steps when H > 2)."""
    net = link_network(rate)
    table = scaling.variants(cfg.ps_servers)
    rows = []
    for job in res["jobs"]:
        row = {
            "rate": rate,
            **{k: job[k] for k in ("model", "strategy", "workers", "servers", "repeat", "ok")},
            "log": os.path.join(rate, job["log"]),
        }
        if job["strategy"] not in table:  # the no-exchange bound: in each rate's own report (<rate>/report.md)
            continue
        if not job["ok"]:
            rows.append({**row, "error": job["error"]})
            continue
        plan, v = cfg.plan(job["model"]), table[job["strategy"]]
        n, k, kind = job["workers"], max(1, job["servers"]), v.kind
        compute_s = max(0.0, (job["step_ms"] - job["comm_wait_ms"]) / 1e3)
        p = costmodel.predict_method(
            v.method,
            kind,
            n,
            gradients.shapes(job["model"]),
            compute_s,
            plan.batch_size,
            net,
            servers=k,
            modules=gradients.modules(job["model"]),
        )
        # bytes each way through the busiest link per step: the ring (and a colocated PS) move
        # 2(N-1)/N x S through every link; a dedicated server's link carries N x S/K, a worker's S
        # (the model's volume counts a dedicated PS's push and pull together)
        busiest = p.volume / 2 if kind == costmodel.PS_DEDICATED else p.volume
        step_ms = job["step_ms"]
        if v.method.period > 1 and job.get("samples_per_sec"):
            step_ms = 1e3 * job["global_batch"] / job["samples_per_sec"]
        row.update(
            method=v.method.label,
            step_ms=step_ms,
            wait_ms=job["comm_wait_ms"],
            compute_ms=1e3 * compute_s,
            pred_extra_ms=1e3 * p.extra_compute_s,
            pred_exchange_ms=1e3 * p.exchange_s,
            pred_step_ms=1e3 * p.step_s,
            model_bytes_per_step=busiest,
            traffic=traffic(os.path.join(cfg.out_dir, job["log"])),
        )
        if row["traffic"]:
            steps = plan.warmup + plan.steps
            row["link_bytes_per_step"] = max(max(tx, rx) for tx, rx in row["traffic"].values()) / steps
        rows.append(row)
    return rows


def write_tensorboard(out_dir: str, grids: list[dict[str, Any]]) -> None:
    """``out_dir/tensorboard``: every rate's comparison in one logdir -- one run per strategy (one
    colour per concept), the rate in the tag (``scaling/speedup/<model>/<rate>``), a chart per
    figure, model and rate; each rate's grid also has its own in ``<rate>/tensorboard``.
    ``out_dir/hparams``: every job, with its link rate."""
    series: tblog.Series = {}
    sessions: list = []
    charts: dict = {}
    figures = ("scaling/speedup", "scaling/efficiency", "perf/samples_per_sec", "perf/step_ms")
    for res in grids:
        rate = res["config"]["link_rate"]
        for run, tags in grid_report.comparison_series(res["rows"], {}).items():
            for tag, pts in tags.items():
                series.setdefault(run, {})[f"{tag}/{rate}"] = pts
        for r in res["rows"]:
            if r["repeats"]:
                tblog.add_point(
                    series, r["strategy"], f"perf/step_ms/{r['model']}/{rate}", r["workers"], r["step_ms_mean"]
                )
        sessions += [(f"{rate}/{name}", hp, ms) for name, hp, ms in grid_report.hparams_sessions(res)]
        for m in res["models"]:
            charts.setdefault(m, []).extend((f"{m} at {rate}: {tblog.FIGURES[f]}", f"{f}/{m}/{rate}") for f in figures)
    tblog.write_comparison(
        os.path.join(out_dir, tblog.COMPARISON_DIR),
        series,
        list(charts.items()),
        "Step = number of workers N (one emulated host each); one run per strategy, the link rate in the tag.",
    )
    tblog.write_hparams(os.path.join(out_dir, tblog.HPARAMS_DIR), sessions)


def markdown(report: dict[str, Any]) -> str:
    out = [
        "## Emulated cluster: measured vs cost model",
        "",
        f"`{report['command']}` on {report['cpus']} CPU cores, started {report['started']}, "
        f"{report['minutes']:.0f} min. {report['hosts']} workers, every rank on an emulated host of its own "
        "(a network namespace with one full-duplex link of the given rate to a switch; "
        "docs/emulated_cluster.md); the jobs are the `scaling` grid's (synthetic data, one thread per rank). "
        f"Open MPI's MPI_Allreduce (Horovod's on CPU): {report.get('mpi_allreduce', 'not recorded')}.",
        "",
        "- step, wait: medians over the measured steps (metrics.json `step_ms`, `comm_wait_ms`); "
        "compute = step - wait;",
        "- predicted exchange: costmodel.py for the configured link rate, alpha = 0 (no latency is emulated), "
        "with the bytes and messages of the strategy's method (fp16, PowerSGD, local SGD: docs/concepts.md); "
        "extra ms: the method's own compute as the model charges it (casts, PowerSGD's products and copies); "
        "predicted step = compute + extra + predicted exchange;",
        "- local SGD rows (`-localsgd-hH`): step = the mean over the measured steps (from samples/s: an exchange "
        "every H steps), compute = a local step's (median step - median wait); the predicted exchange is "
        "averaged over the H steps;",
        "- link MB/step: the busiest host's bytes in its busier direction (kernel counters over the whole job, "
        "start-up and evaluation included, divided by its steps); model MB/step: the bytes the cost model "
        "puts through the busiest link in one step.",
        "",
        "All hosts share this machine's cores, so compute grows with the number of hosts and the kernel's "
        "TCP/bridge/tbf work takes CPU from the ranks: compare exchange times and link bytes more than "
        "absolute step times.",
        "",
    ]
    for rate in report["rates"]:
        out += [
            f"### {rate} per link",
            "",
            "| model | strategy | ranks | step ms | wait ms | compute ms | extra ms | predicted exchange ms | "
            "predicted step ms | measured / predicted step | link MB/step | model MB/step |",
            "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for r in (r for r in report["rows"] if r["rate"] == rate):
            ranks = f"{r['workers']}" + (f" + {r['servers']} server" if r["servers"] else "")
            name = f"{r['model']} | {r['strategy']}" + (f" (r{r['repeat']})" if report["repeats"] > 1 else "")
            if not r["ok"]:
                out.append(f"| {name} | {ranks} | failed: {r['error']} (see {r['log']}) | | | | | | | | |")
                continue
            link = f"{r['link_bytes_per_step'] / 1e6:.2f}" if "link_bytes_per_step" in r else "-"
            out.append(
                f"| {name} | {ranks} | {r['step_ms']:.1f} | {r['wait_ms']:.1f} | {r['compute_ms']:.1f} | "
                f"{r.get('pred_extra_ms', 0.0):.1f} | {r['pred_exchange_ms']:.1f} | {r['pred_step_ms']:.1f} | "
                f"{r['step_ms'] / r['pred_step_ms']:.2f} | {link} | {r['model_bytes_per_step'] / 1e6:.2f} |"
            )
        out.append("")
        for m, n in dict.fromkeys(
            (r["model"], r["workers"]) for r in report["rows"] if r["rate"] == rate and r["workers"] > 1
        ):
            # 1 / step time: the same workers and batch in these jobs, so its ratios are throughput's
            steps: dict[str, list[float]] = {}
            for r in report["rows"]:
                if (r["rate"], r["model"], r["workers"]) == (rate, m, n) and r["ok"]:
                    steps.setdefault(r["strategy"], []).append(r["step_ms"])
            speed = {s: 1e3 / statistics.median(v) for s, v in steps.items()}
            out += engines.markdown(f"{m}, {n} hosts at {rate}, concept x engine", speed, "steps/s", ".2f")
        out += methods_markdown([r for r in report["rows"] if r["rate"] == rate])
        out += [f"The grid's own report for this rate: [{rate}/report.md]({rate}/report.md).", ""]
    return "\n".join(out)


def methods_markdown(rows: list[dict[str, Any]]) -> list[str]:
    """The communication-reduction methods against fp32 on the same exchange, model and workers: the
    measured step ratio beside the model's (a ratio under 1: the method's step is shorter)."""
    base: dict[tuple, dict[str, Any]] = {}
    pairs = []
    for r in rows:
        if not r["ok"]:
            continue
        label = r.get("method", "fp32")
        exchange = r["strategy"][: -len(label) - 1] if r["strategy"].endswith("-" + label) else r["strategy"]
        key = (r["model"], r["workers"], exchange, r["repeat"])
        if label == "fp32":
            base[key] = r
        else:
            pairs.append((key, r))
    against = [(base[k], r) for k, r in pairs if k in base]
    if not against:
        return []
    out = [
        "Methods against fp32 on the same exchange (step / fp32's step; docs/concepts.md):",
        "",
        "| model | N | strategy | measured | model | measured / model |",
        "|---|---:|---|---:|---:|---:|",
    ]
    for b, r in against:
        meas, pred = r["step_ms"] / b["step_ms"], r["pred_step_ms"] / b["pred_step_ms"]
        out.append(f"| {r['model']} | {r['workers']} | {r['strategy']} | {meas:.2f} | {pred:.2f} | {meas / pred:.2f} |")
    return out + [""]


def main(args: argparse.Namespace) -> int:
    try:
        rates = parse_rates(args.rates)
        cfg = grid_config(args)
    except (scaling.GridError, RateError) as e:
        print(f"scaling-netns: error: {e}", file=sys.stderr)
        return 2
    from lab.common.jobs import emulated_launcher
    from lab.emulation.netns import unavailable_reason
    from launch.mpirun import describe_mpi_allreduce

    reason = unavailable_reason()
    if reason:
        print(f"scaling-netns: error: {reason}", file=sys.stderr)
        return 2
    out_dir = args.out_dir or os.path.join("runs", "scaling-netns", time.strftime("%Y%m%d-%H%M%S"))
    started, t0 = time.strftime("%Y-%m-%d %H:%M"), time.monotonic()
    rows, grids, all_ok = [], [], True
    for rate in rates:
        cfg.out_dir, cfg.link_rate = os.path.join(out_dir, rate), rate
        print(f"== {rate} per link: {args.hosts} emulated workers", flush=True)
        # The launcher stops an overdue job itself (and removes its cluster) a minute before the
        # grid would kill the launcher, which would leave the namespaces behind.
        res = scaling.run(
            cfg,
            launcher=emulated_launcher(rate, timeout=cfg.job_timeout - 60, mpi_allreduce=args.mpi_allreduce),
            network=(link_network(rate), f"the emulated links, {rate} per direction, no added latency"),
        )
        all_ok &= all(j["ok"] for j in res["jobs"])
        rows += compare(rate, res, cfg)
        grids.append(res)
    report = {
        "command": shlex.join(["python", "-m", "lab", *sys.argv[1:]]),
        "started": started,
        "minutes": (time.monotonic() - t0) / 60,
        "cpus": os.cpu_count(),
        "hosts": args.hosts,
        "repeats": args.repeats,
        "rates": rates,
        "mpi_allreduce": describe_mpi_allreduce(args.mpi_allreduce),
        "rows": rows,
    }
    with open(os.path.join(out_dir, "results.json"), "w") as fh:
        json.dump(report, fh, indent=1)
        fh.write("\n")
    write_tensorboard(out_dir, grids)
    text = markdown(report)
    with open(os.path.join(out_dir, "report.md"), "w") as fh:
        fh.write(text + "\n")
    print(text, flush=True)
    print(f"-> {out_dir}/report.md; make tensorboard RUN={out_dir}/{tblog.COMPARISON_DIR}", flush=True)
    return 0 if all_ok else 1
