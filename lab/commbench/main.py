"""commbench: the gradient exchange alone, without a model's compute.

Two programs:

* ``python -m lab commbench --np 2`` (the front end) measures the machine's
  memory copy bandwidth, then launches the per-rank benchmark under mpirun once per configuration --
  Horovod with its default knobs and with each requested HOROVOD_CYCLE_TIME / fusion threshold,
  the dedicated parameter server in a job with N + K ranks -- and merges their results into
  ``runs/commbench/<time>/commbench.json`` and a Markdown table.
* The rank program (:mod:`.rank`, :mod:`.exchanges`; started by the front end through the launcher's ``--module``):
  every rank runs the exchanges itself: each implementation reduces the same deterministic,
  integer-valued input (exact in fp32 and fp16, so every implementation must return the identical
  sum), then is timed.

Implementations (all sum S bytes of float32 over N workers):

    ring-horovod        hvd.allreduce_async_ per tensor + synchronize, as DistributedOptimizer does
    ring-horovod-fp16   the same with Horovod's fp16 compression (half the bytes on the wire)
    mpi                 one MPI_Allreduce of the flat buffer (mpi4py): the floor for an allreduce
    ring-mpi            the trainer's second allreduce engine (``--allreduce-engine mpi``) on the
                        workload's tensors: its buckets, each a ring of Isend/Irecv (mpi4py)
    ps-sync-colocated   every rank serves 1/N of the buffer: push shards to their owners, owners sum,
                        pull the sums back (point-to-point, mpi4py)
    ps-sync-dedicated   K extra server ranks (the first K, as in the ps strategy) each own 1/K of the
                        buffer: workers push shards, servers sum, workers pull (a job of N + K ranks)

The rows that time a method of the trainer carry its name (lab/common/methods.py); ``mpi`` is MPI's own
allreduce, no method of the trainer. A commbench.json of the older names (``horovod``, ``mpi-ring``,
``ps-colocated``) reads under these (``methods.renamed``).

The two PS rows are the parameter server's message pattern in raw MPI, without the server-side
SGD and bucketing of the ``ps`` strategy: the floor that strategy's exchange can reach. The
strategy itself is measured end to end by the ``scaling`` grid.

Reported per workload: median time per exchange (the slowest worker of each iteration), algorithm
bandwidth S/t and bus bandwidth algbw * f, with f = 2(N-1)/N for allreduce as nccl-tests defines
it and the matching bottleneck-link factor of :func:`costmodel.bus_factor` for the PS patterns.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..common.jobs import Launcher, local_launcher
from ..common.methods import canonical
from .exchanges import (
    IMPLS,
    BenchError,
    _shared_arguments,
    _write_json,
    check_numbers,
    human_bytes,
    parse_size,
    workloads,
)


def memcpy_bandwidth(nbytes: int = 64 << 20, repeats: int = 10) -> float:
    """Bytes per second one core copies between two buffers larger than the caches: the ceiling
    for a shared-memory transport, which must copy every byte at least once."""
    src = np.ones(nbytes // 4, dtype=np.float32)
    dst = np.empty_like(src)
    np.copyto(dst, src)
    best = min(_timed(lambda: np.copyto(dst, src)) for _ in range(repeats))
    return nbytes / best


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


@dataclass
class Job:
    """One mpirun job of the per-rank benchmark."""

    label: str
    np: int
    impls: str
    env: dict[str, str]
    extra: list[str]
    sizes: str = ""  # this job's --sizes and --models when not the run's
    models: str | None = None


def plan_jobs(args: argparse.Namespace) -> list[Job]:
    # an older name (mpi-ring) still names its row
    impls = [canonical(i.strip()) for i in (args.impls or ",".join(IMPLS)).split(",") if i.strip()]
    args.impls = ",".join(impls)
    for i in impls:
        if i not in IMPLS:
            raise BenchError(f"--impls: unknown implementation {i!r}; choose from: {', '.join(IMPLS)}")
    shared = [i for i in impls if i != "ps-sync-dedicated"]
    jobs = []
    if shared:
        jobs.append(Job("default", args.np, ",".join(shared), {}, []))
    if any(i.startswith("ring-horovod") for i in impls):
        for ct in _floats(args.horovod_cycle_ms, "--horovod-cycle-ms"):
            jobs.append(Job(f"cycle={ct:g}ms", args.np, "ring-horovod", {"HOROVOD_CYCLE_TIME": f"{ct:g}"}, []))
        for mb in _floats(args.horovod_fusion_mb, "--horovod-fusion-mb"):
            jobs.append(
                Job(
                    f"fusion={mb:g}MB",
                    args.np,
                    "ring-horovod",
                    {"HOROVOD_FUSION_THRESHOLD": str(int(mb * (1 << 20)))},
                    [],
                )
            )
    if "ring-horovod" in impls and args.timeline_size:
        parse_size(args.timeline_size)
        jobs.append(
            Job(
                "timeline",
                args.np,
                "ring-horovod",
                {"HOROVOD_TIMELINE": TIMELINE_NAME},
                [],
                sizes=args.timeline_size,
                models="",
            )
        )
    if "ps-sync-dedicated" in impls:
        for k in _ints(args.ps_servers_list, "--ps-servers"):
            jobs.append(Job(f"K={k}", args.np + k, "ps-sync-dedicated", {}, ["--ps-servers", str(k)]))
    return jobs


def _numbers(text: str, flag: str, kind: type, minimum: float) -> list:
    """A comma-separated list of ``kind`` values, each >= ``minimum``, for ``flag``."""
    noun = "integers" if kind is int else "numbers"
    try:
        vals = [kind(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise BenchError(f"{flag}: expected comma-separated {noun} (got {text!r})") from None
    if any(v < minimum for v in vals):
        raise BenchError(f"{flag}: values must be >= {minimum:g} (got {text!r})")
    return vals


def _floats(text: str, flag: str) -> list[float]:
    return _numbers(text, flag, float, 0)


def _ints(text: str, flag: str) -> list[int]:
    return _numbers(text, flag, int, 1)


TIMELINE_NAME = "horovod-timeline.json"
# Horovod's timeline activities, in the order an allreduce goes through them.
PHASES = ("NEGOTIATE_ALLREDUCE", "ALLREDUCE", "MEMCPY_IN_FUSION_BUFFER", "MPI_ALLREDUCE", "MEMCPY_OUT_FUSION_BUFFER")


def timeline_phases(path: str) -> dict[str, dict[str, float]]:
    """Median duration of each activity in a Horovod timeline (Chrome trace written by rank 0).

    NEGOTIATE_ALLREDUCE runs from the first rank's request to the coordinator's go (all ranks
    ready, found in a background cycle); ALLREDUCE is the operation itself, with the MPI call and
    any fusion-buffer copies nested inside it.
    """
    with open(path) as fh:
        text = fh.read().strip().rstrip(",")
    events = json.loads(text if text.endswith("]") else text + "]")  # written until shutdown
    stacks: dict[int, list[tuple[str, float]]] = {}
    spans: dict[str, list[float]] = {}
    for e in events:
        if e.get("ph") == "B":
            stacks.setdefault(e["pid"], []).append((e["name"], e["ts"]))
        elif e.get("ph") == "E" and stacks.get(e["pid"]):
            name, start = stacks[e["pid"]].pop()
            spans.setdefault(name, []).append((e["ts"] - start) / 1e3)
    return {name: {"count": len(v), "median_ms": statistics.median(v)} for name, v in spans.items()}


RANK_MODULE = "lab.commbench.rank"


def run_front(args: argparse.Namespace, launcher: Launcher = local_launcher) -> dict[str, Any]:
    """Launch every job, merge the results; returns the merged report (also written to disk)."""
    if args.np < 1:
        raise BenchError(f"--np must be >= 1 (got {args.np})")
    if check_numbers(args):
        raise BenchError(check_numbers(args))
    jobs = plan_jobs(args)
    workloads(args.sizes, args.models)  # validate before launching anything
    out_dir = args.out_dir or os.path.join("runs", "commbench", time.strftime("%Y%m%d-%H%M%S"))
    os.makedirs(out_dir, exist_ok=True)
    if args.dump_dir:
        os.makedirs(args.dump_dir, exist_ok=True)
    print(f"commbench -> {out_dir}", flush=True)
    copy_bw = memcpy_bandwidth()
    print(f"memory copy bandwidth (one core, 64 MB): {copy_bw / 1e9:.2f} GB/s", flush=True)
    results, failures = [], []
    for job in jobs:
        part = os.path.join(out_dir, f"part-{job.label}.json")
        models = args.models if job.models is None else job.models
        rank_args = [
            "--impls",
            job.impls,
            "--sizes",
            job.sizes or args.sizes,
            "--models",
            models,
            "--out",
            part,
            "--iters",
            str(args.iters),
            "--budget",
            str(args.budget),
            "--warmup",
            str(args.warmup),
            "--mpi-bucket-bytes",
            str(args.mpi_bucket_bytes),
            *job.extra,
        ]
        if args.dump_dir:
            rank_args += ["--dump-dir", args.dump_dir]
        print(
            f"[{job.label}] {job.np} ranks: {job.impls} {' '.join(f'{k}={v}' for k, v in job.env.items())}", flush=True
        )
        env = {
            **os.environ,
            "OMP_NUM_THREADS": "1",
            **{k: os.path.join(out_dir, v) if k == "HOROVOD_TIMELINE" else v for k, v in job.env.items()},
        }
        proc = subprocess.run(launcher(job.np, rank_args, RANK_MODULE), env=env, timeout=args.job_timeout)
        if proc.returncode != 0 or not os.path.exists(part):
            failures.append(f"{job.label}: exit {proc.returncode}")
            continue
        with open(part) as fh:
            for r in json.load(fh)["results"]:
                r["job"] = job.label
                results.append(r)
        os.remove(part)
    timeline = {}
    if any(j.label == "timeline" for j in jobs) and os.path.exists(os.path.join(out_dir, TIMELINE_NAME)):
        timeline = {
            "size": args.timeline_size,
            "phases": timeline_phases(os.path.join(out_dir, TIMELINE_NAME)),
            "time_s": next((r["time_s"] for r in results if r["job"] == "timeline"), math.nan),
        }
    report = {
        "np": args.np,
        "memcpy_bandwidth_gbs": copy_bw / 1e9,
        "results": results,
        "failures": failures,
        "timeline": timeline,
        "command": ["python", "-m", "lab", *sys.argv[1:]],
    }
    _write_json(os.path.join(out_dir, "commbench.json"), report)
    with open(os.path.join(out_dir, "commbench.md"), "w") as fh:
        fh.write(markdown(report))
    print(markdown(report), flush=True)
    return report


def label(r: dict) -> str:
    """Implementation and configuration, e.g. 'ring-horovod [cycle=0.1ms]' or 'ps-sync-dedicated [K=1]'."""
    return r["impl"] if r.get("job", "default") == "default" else f"{r['impl']} [{r['job']}]"


def markdown(report: dict) -> str:
    rows = report["results"]
    lines = [
        f"Exchange of S bytes of float32 gradient among N = {report['np']} workers; time = median over "
        "iterations of the slowest worker; algbw = S / time; busbw = algbw x 2(N-1)/N for allreduce "
        "(nccl-tests), and the bottleneck-link factor of the cost model for the PS patterns.",
        "",
        f"Ceiling: memory copy bandwidth of one core = {report['memcpy_bandwidth_gbs']:.2f} GB/s.",
        "",
    ]
    for kind in ("size", "model"):
        sel = [r for r in rows if r["workload_kind"] == kind]
        if not sel:
            continue
        lines += [
            "| workload | bytes | implementation | workers (+servers) | time ms | algbw GB/s | busbw GB/s |",
            "|---|---:|---|---|---:|---:|---:|",
        ]
        for r in sorted(sel, key=lambda r: (r["bytes"], r["workload"], label(r))):
            n = f"{r['workers']}" + (f" (+{r['servers']})" if r["servers"] else "")
            lines.append(
                f"| {r['workload']} | {human_bytes(r['bytes'])} | {label(r)} | {n} | "
                f"{1e3 * r['time_s']:.3f} | {r['algbw_gbs']:.3f} | {r['busbw_gbs']:.3f} |"
            )
        lines.append("")
    tl = report.get("timeline")
    if tl and tl["phases"]:
        ph = tl["phases"]
        lines += [
            f"Where Horovod's time goes: one {tl['size']} allreduce, {1e3 * tl['time_s']:.3f} ms per call "
            f"from Python (median), and the median of each activity in its timeline "
            f"(`{TIMELINE_NAME}`, open in chrome://tracing):",
            "",
            "| activity | median ms | count |",
            "|---|---:|---:|",
        ]
        for name in [p for p in PHASES if p in ph] + sorted(set(ph) - set(PHASES)):
            lines.append(f"| {name} | {ph[name]['median_ms']:.3f} | {ph[name]['count']} |")
        inside = sum(ph[p]["median_ms"] for p in ("NEGOTIATE_ALLREDUCE", "ALLREDUCE") if p in ph)
        raw = [
            r
            for r in rows
            if r["impl"] == "mpi" and r["workload_kind"] == "size" and r["bytes"] == parse_size(tl["size"])
        ]
        lines += [
            "",
            f"Outside these activities (enqueueing, waiting for the background thread's next cycle, "
            f"the handle poll in synchronize): {max(0.0, 1e3 * tl['time_s'] - inside):.3f} ms."
            + (f" A raw MPI_Allreduce of the same buffer: {1e3 * raw[0]['time_s']:.3f} ms." if raw else ""),
            "",
        ]
    bad = [r for r in rows if r["max_abs_err"] != 0]
    lines.append(
        "Every implementation returned the exact expected sum."
        if rows and not bad
        else f"{len(bad)} result(s) differ from the expected sum: "
        + ", ".join(f"{label(r)}/{r['workload']} ({r['max_abs_err']:g})" for r in bad)
    )
    if report["failures"]:
        lines.append("Failed jobs: " + "; ".join(report["failures"]))
    return "\n".join(lines) + "\n"


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The front end: launches one job per configuration and merges their results."""
    p.add_argument("--np", type=int, default=2, help="workers per job (default: 2)")
    _shared_arguments(p)
    p.add_argument("--ps-servers-list", default="1", help="K values for the dedicated PS (default: 1)")
    p.add_argument(
        "--horovod-cycle-ms",
        default="0.1,5",
        help="extra Horovod runs with these HOROVOD_CYCLE_TIME values in ms (default: 0.1,5; "
        "Horovod's own default is 1)",
    )
    p.add_argument(
        "--horovod-fusion-mb",
        default="",
        help="extra Horovod runs with these HOROVOD_FUSION_THRESHOLD values in MB "
        "(default: none; Horovod's own default is 128)",
    )
    p.add_argument(
        "--timeline-size",
        default="4M",
        help="one extra Horovod run of this size with HOROVOD_TIMELINE, broken down by "
        "activity ('' = none; default: 4M)",
    )
    p.add_argument("--out-dir", default="", help="output directory (default: runs/commbench/<time>)")
    p.add_argument("--job-timeout", type=float, default=1800, help="seconds before a job is killed")


def front_args(argv: list[str]) -> argparse.Namespace:
    """The front end's settings from a command line (how the scaling grid calibrates)."""
    p = argparse.ArgumentParser(prog="commbench")
    add_arguments(p)
    return p.parse_args(argv)


def main(args: argparse.Namespace) -> int:
    try:
        report = run_front(args)
    except BenchError as e:
        print(f"commbench: error: {e}", file=sys.stderr)
        return 2
    return 1 if report["failures"] else 0
