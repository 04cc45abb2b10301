"""``make bench-memory``: what each concept holds per rank, measured, against the ZeRO paper's formula.

    python -m lab bench-memory [--workers 1,2,4] [--width 1024 --depth 4] [--out runs/bench-memory/<time>]

One model (an MLP whose size is a flag, :mod:`lab.memory.model`) with AdamW trains a few steps under each
method at each worker count: the ring (the mpi engine), the parameter server (dedicated: one server rank
beside the workers; colocated: every rank serves 1/N) and the sharded stages 1-3 (mpi engine). Each job's
metrics.json ``memory`` (what every rank holds after its last step: parameters, gradients, optimizer state,
the engine's buffers, peak RSS) is set beside :func:`allreduce_train.distributed.memcost.per_rank`.

Then the run that fits only sharded: a larger model at ``--fit-ranks`` ranks under an ``RLIMIT_AS`` the
benchmark sets (:mod:`lab.memory.limited`), between what the ring needs by the formula and what the
sharded stages need: the ring is refused in one line (its line is shown), each sharded stage that the
trainer's check lets through trains, or shows how it failed.

Output in ``--out``: memory.md (the table, and the fit run), memory.csv (every rank of every job),
memory.png (per-rank bytes against N, measured and the formula), results.json, jobs/ (each job's run
directory and log). Methods are named as in every lab tool (``ring-mpi``, ``ps-sync-dedicated``,
``ring-mpi-zero2``; lab/common/methods.py); ``--methods`` takes the older names too (``ps-dedicated``).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import sys
import time
from typing import Any

from allreduce_train.distributed.memcost import per_rank

from ..common import jobs, methods
from .model import parameters

MIB = float(1 << 20)
GIB = float(1 << 30)
KINDS = ("params", "grads", "optimizer", "buffers")
ADAMW_STATE = 8.0  # bytes per parameter: AdamW's two float32 moments (the trainer measures the same, memory.py)


def _memcost(m: methods.Method) -> dict[str, Any]:
    """memcost's concept arguments for registry method ``m``."""
    if m.strategy == "ps":
        return {"concept": "ps", "dedicated": True, "servers": m.servers} if m.servers else {"concept": "ps"}
    return {"concept": "sharded", "stage": m.stage} if m.stage else {"concept": "ring"}


# The methods measured, named as in every lab tool (lab/common/methods.py): the ring and the sharded stages on
# the mpi engine, the parameter server with one dedicated server or colocated.
_MEASURED = (
    methods.Method("allreduce", "mpi"),
    methods.Method("ps", placement="dedicated", servers=1),
    methods.Method("ps", placement="colocated"),
    *(methods.Method("sharded", "mpi", stage=k) for k in (1, 2, 3)),
)
METHODS = {m.name: m for m in _MEASURED}
RING, STAGES = _MEASURED[0].name, [m.name for m in _MEASURED if m.stage]
STYLE = dict(
    zip(
        METHODS,
        [
            ("tab:blue", "o"),
            ("tab:red", "s"),
            ("tab:green", "^"),
            ("tab:purple", "D"),
            ("tab:orange", "v"),
            ("tab:brown", "P"),
        ],
        strict=True,
    )
)


class BenchError(Exception):
    """Bad arguments: one line, exit 2."""


def job_args(method: str, width: int, depth: int, steps: int, run_dir: str, name: str) -> list[str]:
    """The trainer's flags for one job of ``method``."""
    return [
        *METHODS[method].flags,
        *("--model", "lab.memory.model:build", "--model-arg", f"width={width}", "--model-arg", f"depth={depth}"),
        *("--dataset", "lab.memory.model:data", "--batch-size", "16", "--optimizer", "adamw"),
        *("--steps", str(steps), "--eval-every", str(steps), "--warmup-steps", "0", "--no-progress"),
        *("--run-dir", run_dir, "--name", name),
    ]


def formula(method: str, n_params: int, workers: int, role: str) -> dict[str, float]:
    """memcost's bytes for one rank of ``role`` (a dedicated PS's server rows: its ``server_*`` figures)."""
    got = per_rank(n_params, workers, state_bytes_per_param=ADAMW_STATE, **_memcost(METHODS[method]))
    if role == "server":
        return {"params": got["server_params"], "grads": 0.0, "optimizer": got["server_optimizer"]}
    return {k: got[k] for k in ("params", "grads", "optimizer")}


def rank_rows(method: str, workers: int, n_params: int, metrics: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per rank of a finished job: the bytes it held after its first step (while it trains: at the
    end stage 3 gathers the whole parameters for the last evaluation and the returned model) beside the
    formula's, and its peak RSS over the run."""
    out = []
    peaks = {r["rank"]: r["peak_rss_mib"] for r in metrics["memory"]["end"]}
    for r in metrics["memory"]["after_first_step"]:
        want = formula(method, n_params, workers, r["role"])
        row: dict[str, Any] = {"method": method, "workers": workers, "rank": r["rank"], "role": r["role"]}
        row.update({k: r[k] for k in KINDS})
        row.update({f"formula_{k}": want[k] for k in ("params", "grads", "optimizer")})
        held, expected = r["params"] + r["grads"] + r["optimizer"], sum(want.values())
        row["ratio"] = held / expected if expected else float("nan")
        row["peak_rss_mib"] = peaks[r["rank"]]
        out.append(row)
    return out


def summary(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (method, workers, role): the largest rank's figures (what a per-rank limit must hold)."""
    groups: dict[tuple, list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault((r["method"], r["workers"], r["role"]), []).append(r)
    out = []
    for rs in groups.values():
        top = max(rs, key=lambda r: r["params"] + r["grads"] + r["optimizer"] + r["buffers"])
        out.append({**top, "ranks": len(rs), "peak_rss_mib": max(r["peak_rss_mib"] for r in rs)})
    order = list(METHODS)
    return sorted(out, key=lambda r: (order.index(r["method"]), r["workers"], r["role"] != "worker"))


def markdown(summ: list[dict[str, Any]], skipped: list[str], n_params: int, fit: dict[str, Any] | None) -> str:
    mib = lambda v: f"{v / MIB:.1f}"  # noqa: E731 -- a column format, used a dozen times below
    lines = [
        f"Per-rank memory, MiB (the largest rank of each role), AdamW, {n_params:,} parameters; measured after "
        "each job's first step (metrics.json `memory`) beside the ZeRO formula "
        "(allreduce_train/distributed/memcost.py). ratio = measured (params + grads + optimizer) / formula.",
        "",
        "| method | N | role | params | grads | optimizer | buffers | formula p / g / o | ratio | peak RSS MiB |",
        "| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in summ:
        want = " / ".join(mib(r[f"formula_{k}"]) for k in ("params", "grads", "optimizer"))
        lines.append(
            f"| {r['method']} | {r['workers']} | {r['role']} | {mib(r['params'])} | {mib(r['grads'])} | "
            f"{mib(r['optimizer'])} | {mib(r['buffers'])} | {want} | {r['ratio']:.3f} | {r['peak_rss_mib']:.0f} |"
        )
    lines += [f"- {s}" for s in skipped]
    if fit is not None:
        lines += ["", fit_text(fit)]
    return "\n".join(lines) + "\n"


def fit_text(fit: dict[str, Any]) -> str:
    out = [
        f"Fits only sharded: {fit['n_params']:,} parameters (width {fit['width']}, depth {fit['depth']}), AdamW, "
        f"{fit['ranks']} ranks, each under RLIMIT_AS {fit['limit_bytes'] / GIB:.2f} GiB "
        f"(by the formula per rank: ring {fit['need'][RING] / GIB:.2f} GiB, "
        + ", ".join(f"stage {k} {fit['need'][m] / GIB:.2f} GiB" for k, m in enumerate(STAGES, 1))
        + ").",
        "",
    ]
    for method, res in fit["runs"].items():
        out.append(f"- {method}: {res}")
    return "\n".join(out)


def plot(path: str, summ: list[dict[str, Any]], n_params: int) -> None:
    """memory.png: per worker rank against N, measured points and the formula's line, per method; left the
    whole (params + grads + optimizer), right the optimizer state alone."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from ..common.plots import no_data

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    workers = [r for r in summ if r["role"] == "worker"]
    if not workers:
        for ax in axes:
            no_data(ax, "no job finished: nothing to plot")
    for ax, kinds, title in (
        (axes[0], ("params", "grads", "optimizer"), "parameters + gradients + optimizer state"),
        (axes[1], ("optimizer",), "optimizer state"),
    ):
        if not workers:
            break
        for method in METHODS:
            pts = sorted((r for r in workers if r["method"] == method), key=lambda r: r["workers"])
            if not pts:
                continue
            color, marker = STYLE[method]
            ns = [r["workers"] for r in pts]
            ax.plot(ns, [sum(r[k] for k in kinds) / MIB for r in pts], color=color, marker=marker, ls="", label=method)
            ax.plot(ns, [sum(r[f"formula_{k}"] for k in kinds) / MIB for r in pts], color=color, ls="--", alpha=0.7)
        ax.set_xscale("log", base=2)
        ax.set_xticks(
            sorted({r["workers"] for r in workers}), [str(n) for n in sorted({r["workers"] for r in workers})]
        )
        ax.set_xlabel("workers N")
        ax.set_ylabel("MiB per worker rank")
        ax.set_title(f"{title}: measured (points), ZeRO formula (dashed)", fontsize=9)
        ax.grid(alpha=0.3)
    if workers:
        axes[0].legend(fontsize=8)
    fig.suptitle(f"memory per rank, AdamW, {n_params:,} parameters", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def fit_run(args: argparse.Namespace, out: str) -> dict[str, Any]:
    """The ring and each sharded stage at ``--fit-ranks`` ranks under one RLIMIT_AS: the ring's one-line
    refusal and what each stage did."""
    n = parameters(args.fit_width, args.fit_depth)
    ranks = args.fit_ranks
    need = {m: per_rank(n, ranks, state_bytes_per_param=ADAMW_STATE, **_memcost(METHODS[m]))["total"] for m in METHODS}
    # RLIMIT_AS counts virtual memory: a rank's baseline (torch, MPI, malloc's arenas) before its model,
    # the model the trainer builds whole, and a margin under the ring's formula need beyond that model.
    limit = (
        int(args.fit_limit_gib * GIB) if args.fit_limit_gib else int(args.fit_baseline_gib * GIB + 4 * n + 0.6 * 12 * n)
    )
    fit: dict[str, Any] = {
        "n_params": n,
        "width": args.fit_width,
        "depth": args.fit_depth,
        "ranks": ranks,
        "limit_bytes": limit,
        "need": need,
        "runs": {},
    }
    for method in (RING, *STAGES):
        name = f"fit-{method}"
        argv = [sys.executable, "-m", "lab.memory.limited", str(limit), "--"]
        argv += jobs.local_launcher(ranks, job_args(method, args.fit_width, args.fit_depth, 2, out, name))
        res = jobs.run(argv, timeout=args.job_timeout, log_path=os.path.join(out, f"{name}.log"))
        if res.ok:
            m = jobs.read_json(os.path.join(out, name, "metrics.json")) or {}
            top = max(r["total"] for r in m.get("memory", {}).get("end", [{"total": 0}]))
            fit["runs"][method] = f"trained 2 steps; largest rank holds {top / GIB:.2f} GiB"
        else:
            fit["runs"][method] = f"exit {res.returncode}: {res.error_line()}"
        print(f"bench-memory: fit {method}: {fit['runs'][method]}", flush=True)
    return fit


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--workers", default="1,2,4", help="comma-separated worker counts (default: 1,2,4)")
    p.add_argument(
        "--methods",
        default=",".join(METHODS),
        help=f"comma-separated, of {', '.join(METHODS)} (default: all)",
    )
    p.add_argument("--width", type=int, default=1024, help="the MLP's hidden units (default: 1024)")
    p.add_argument("--depth", type=int, default=4, help="the MLP's hidden layers (default: 4: 3.96M parameters)")
    p.add_argument("--steps", type=int, default=2, help="training steps per job (default: 2)")
    p.add_argument("--fit-width", type=int, default=4096, help="the fit run's MLP width (default: 4096)")
    p.add_argument("--fit-depth", type=int, default=6, help="the fit run's MLP depth (default: 6: 87M parameters)")
    p.add_argument("--fit-ranks", type=int, default=4, help="the fit run's ranks (default: 4; 0: no fit run)")
    p.add_argument(
        "--fit-limit-gib",
        type=float,
        default=0.0,
        help="the fit run's RLIMIT_AS per rank, GiB (default 0: --fit-baseline-gib + the model + 0.6 of the "
        "ring's formula need beyond it)",
    )
    p.add_argument(
        "--fit-baseline-gib",
        type=float,
        default=1.0,
        help="a rank's virtual memory before its model (torch, MPI, malloc's arenas; about 0.9-1.0 GiB here)",
    )
    p.add_argument("--job-timeout", type=float, default=600.0, help="seconds per job (default: 600)")
    p.add_argument("--out", default="", help="output directory (default: runs/bench-memory/<time>)")


def parse(args: argparse.Namespace) -> tuple[list[int], list[str]]:
    try:
        workers = [int(w) for w in args.workers.split(",") if w]
    except ValueError:
        raise BenchError(f"--workers {args.workers!r}: comma-separated integers, e.g. 1,2,4") from None
    if not workers or min(workers) < 1:
        raise BenchError(f"--workers {args.workers!r}: at least one count, each >= 1")
    chosen = [methods.canonical(m) for m in args.methods.split(",") if m]  # an older name (ps-dedicated) too
    unknown = [m for m in chosen if m not in METHODS]
    if unknown or not chosen:
        raise BenchError(f"--methods {args.methods!r}: choose from {', '.join(METHODS)}")
    if min(args.width, args.depth, args.steps, args.fit_width, args.fit_depth) < 1 or args.fit_ranks < 0:
        raise BenchError("--width, --depth, --steps, --fit-width and --fit-depth must be >= 1, --fit-ranks >= 0")
    return workers, chosen


def main(args: argparse.Namespace) -> int:
    try:
        workers, methods = parse(args)
    except BenchError as e:
        print(f"bench-memory: error: {e}", file=sys.stderr)
        return 2
    out = args.out or os.path.join("runs", "bench-memory", time.strftime("%Y%m%d-%H%M%S"))
    runs = os.path.join(out, "jobs")
    os.makedirs(runs, exist_ok=True)
    n_params = parameters(args.width, args.depth)
    rows: list[dict[str, Any]] = []
    skipped: list[str] = []
    for method in methods:
        for n in workers:
            name = f"{method}-n{n}"
            np_ = n + METHODS[method].servers
            argv = jobs.local_launcher(np_, job_args(method, args.width, args.depth, args.steps, runs, name))
            res = jobs.run(argv, timeout=args.job_timeout, log_path=os.path.join(runs, f"{name}.log"))
            metrics = jobs.read_json(os.path.join(runs, name, "metrics.json")) if res.ok else None
            if metrics is None or "memory" not in metrics:
                skipped.append(f"{name}: failed ({res.error_line() if not res.ok else 'no memory in metrics.json'})")
                print(f"bench-memory: {skipped[-1]}", file=sys.stderr, flush=True)
                continue
            got = rank_rows(method, n, n_params, metrics)
            rows += got
            top = max(r["params"] + r["grads"] + r["optimizer"] for r in got)
            print(f"bench-memory: {name}: largest rank {top / MIB:.1f} MiB of params+grads+optimizer", flush=True)
    fit = fit_run(args, runs) if args.fit_ranks else None
    summ = summary(rows)
    text = markdown(summ, skipped, n_params, fit)
    with open(os.path.join(out, "memory.md"), "w") as fh:
        fh.write(text)
    with open(os.path.join(out, "memory.csv"), "w", newline="") as fh:
        fields = ["method", "workers", "rank", "role", *KINDS]
        fields += [f"formula_{k}" for k in ("params", "grads", "optimizer")] + ["ratio", "peak_rss_mib"]
        writer = csv.DictWriter(fh, fieldnames=fields)
        writer.writeheader()
        writer.writerows(rows)
    with open(os.path.join(out, "results.json"), "w") as fh:
        json.dump({"n_params": n_params, "rows": rows, "skipped": skipped, "fit": fit, "load": jobs.loadavg()}, fh)
    plot(os.path.join(out, "memory.png"), summ, n_params)
    print(text + f"\n-> {out}/memory.md, memory.csv, memory.png")
    return 0 if rows else 1
