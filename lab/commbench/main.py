"""commbench: the gradient exchange alone, without a model's compute.

Two programs:

* ``python -m lab commbench --np 2`` (the front end) measures the machine's
  memory copy bandwidth, then launches the per-rank benchmark under mpirun once per configuration --
  Horovod with its default knobs and with each requested HOROVOD_CYCLE_TIME / fusion threshold,
  the dedicated parameter server in a job with N + K ranks -- and merges their results into
  ``runs/commbench/<time>/commbench.json`` and a Markdown table.
* The rank program (:mod:`.rank`, started by the front end through the launcher's ``--module``):
  every rank runs the exchanges itself: each implementation reduces the same deterministic,
  integer-valued input (exact in fp32 and fp16, so every implementation must return the identical
  sum), then is timed.

Implementations (all sum S bytes of float32 over N workers):

    horovod        hvd.allreduce_async_ per tensor + synchronize, as DistributedOptimizer does
    horovod-fp16   the same with Horovod's fp16 compression (half the bytes on the wire)
    mpi            one MPI_Allreduce of the flat buffer (mpi4py): the floor for an allreduce
    mpi-ring       the trainer's second allreduce engine (``--allreduce-engine mpi``) on the
                   workload's tensors: its buckets, each a ring of Isend/Irecv (mpi4py)
    ps-colocated   every rank serves 1/N of the buffer: push shards to their owners, owners sum,
                   pull the sums back (point-to-point, mpi4py)
    ps-dedicated   K extra server ranks (the first K, as in the ps strategy) each own 1/K of the
                   buffer: workers push shards, servers sum, workers pull (a job of N + K ranks)

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
from typing import Any, Callable

import numpy as np

from ..common import costmodel
from ..common.jobs import Launcher, local_launcher

IMPLS = ("mpi", "mpi-ring", "ps-colocated", "horovod", "horovod-fp16", "ps-dedicated")
KIND = {"mpi": costmodel.ALLREDUCE, "mpi-ring": costmodel.ALLREDUCE, "horovod": costmodel.ALLREDUCE,
        "horovod-fp16": costmodel.ALLREDUCE,
        "ps-colocated": costmodel.PS_COLOCATED, "ps-dedicated": costmodel.PS_DEDICATED}
RANK_IMPLS = tuple(i for i in IMPLS if i != "ps-dedicated")
DEFAULT_SIZES = "4K,16K,64K,256K,1M,4M,16M,64M,256M"
UNITS = {"": 1, "B": 1, "K": 1 << 10, "KB": 1 << 10, "M": 1 << 20, "MB": 1 << 20, "G": 1 << 30, "GB": 1 << 30}


class BenchError(Exception):
    """Bad commbench input; the message names the flag."""


def parse_size(text: str) -> int:
    """'4K' -> 4096, '256M' -> 268435456 (binary units), rounded down to whole float32 elements."""
    t = text.strip().upper()
    num = t.rstrip("KMGB")
    unit = t[len(num):]
    if not num or unit not in UNITS:
        raise BenchError(f"--sizes: cannot read {text!r}; write sizes like 4K, 1M, 256M")
    try:
        value = int(float(num) * UNITS[unit])
    except ValueError:
        raise BenchError(f"--sizes: cannot read {text!r}; write sizes like 4K, 1M, 256M") from None
    if value < 4:
        raise BenchError(f"--sizes: {text!r} is smaller than one float32")
    return value - value % 4


def human_bytes(n: float) -> str:
    for unit, div in (("GB", 1 << 30), ("MB", 1 << 20), ("KB", 1 << 10)):
        if n >= div:
            v = n / div
            return f"{v:.0f} {unit}" if v == int(v) else f"{v:.1f} {unit}"
    return f"{int(n)} B"


MIN_ITERS, MAX_ITERS = 5, 200


def _time(exchange, dst, warmup: int, iters: int, budget: float, comm) -> list[float]:
    """Per-iteration seconds of ``iters`` timed exchanges after ``warmup`` untimed ones. With
    ``iters`` = 0 the count fills about ``budget`` seconds at the warm-up's pace, as rank 0 judges
    it: every rank must run the same number of exchanges."""
    t0 = time.perf_counter()
    for _ in range(warmup):
        exchange(dst)
    if not iters:
        per = (time.perf_counter() - t0) / max(1, warmup)
        iters = comm.bcast(max(MIN_ITERS, min(MAX_ITERS, int(budget / max(per, 1e-9)))), root=0)  # communication
    comm.Barrier()  # communication: start together
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        exchange(dst)
        times.append(time.perf_counter() - t0)
    return times


def rank_input(rank: int, n_elems: int) -> np.ndarray:
    """The deterministic input of ``rank``: small integers, so sums are exact in fp32 and fp16
    whatever the reduction order, and different on every rank, so a missing peer shows."""
    i = np.arange(n_elems, dtype=np.int64)
    return (((i * 7 + rank * 5) % 13) - 6).astype(np.float32)


def expected_sum(workers: int, n_elems: int) -> np.ndarray:
    return sum(rank_input(r, n_elems) for r in range(workers))


def shard_bounds(n_elems: int, parts: int) -> list[int]:
    """Offsets splitting ``n_elems`` into ``parts`` contiguous shards (as np.array_split does)."""
    q, r = divmod(n_elems, parts)
    out = [0]
    for p in range(parts):
        out.append(out[-1] + q + (1 if p < r else 0))
    return out


@dataclass
class Workload:
    """One thing to exchange: a size from the sweep or a model's gradient tensors."""

    name: str
    kind: str  # "size" or "model"
    shapes: list[tuple[int, ...]]

    @property
    def n_elems(self) -> int:
        return sum(int(np.prod(s)) for s in self.shapes)

    @property
    def nbytes(self) -> int:
        return 4 * self.n_elems


def model_workload(name: str) -> Workload:
    from models import MODELS

    if name not in MODELS:
        raise BenchError(f"--models: unknown model {name!r}; choose from: {', '.join(sorted(MODELS))}")
    model = MODELS[name].build()
    return Workload(name, "model", [tuple(p.shape) for p in model.parameters() if p.requires_grad])


def workloads(sizes: str, models: str) -> list[Workload]:
    out = [Workload(human_bytes(b).replace(" ", ""), "size", [(b // 4,)])
           for b in (parse_size(s) for s in sizes.split(",") if s.strip())]
    out += [model_workload(m.strip()) for m in models.split(",") if m.strip()]
    if not out:
        raise BenchError("--sizes and --models are both empty: nothing to measure")
    return out


# ------------------------------------------------------------------------- the exchanges
# Each factory returns exchange(dst) that sums this rank's input over the workers into ``dst`` (a
# flat float32 array). Buffers are allocated once, outside the timed loop.

def mpi_allreduce(comm, src: np.ndarray) -> Callable[[np.ndarray], None]:
    from mpi4py import MPI

    def exchange(dst):
        comm.Allreduce(src, dst, op=MPI.SUM)  # communication
    return exchange


def mpi_ring(src: np.ndarray, shapes, total: bool, bucket_bytes: int) -> Callable[[np.ndarray], None]:
    """The mpi engine's exchange as the trainer runs it, all buckets started at once (as the
    Horovod row enqueues every tensor before it waits)."""
    import torch

    from allreduce_train.config import Config, ExchangeConfig
    from allreduce_train.distributed.ring import MPIRingAllreduce

    cfg = Config(exchange=ExchangeConfig(allreduce_engine="mpi", mpi_bucket_bytes=bucket_bytes))
    ex = MPIRingAllreduce(cfg, average=not total)  # communication: its own communicator
    flat = torch.from_numpy(src.copy())
    params, off = [], 0
    for s in shapes:
        n = int(np.prod(s))
        p = torch.nn.Parameter(torch.zeros(s))
        p.grad = flat[off:off + n].view(s)  # the exchange writes the result back into .grad: into flat
        params.append(p)
        off += n
    ex.attach(params)

    def exchange(dst):
        flat.copy_(torch.from_numpy(src))
        ex.synchronize()  # communication: every bucket's ring
        np.copyto(dst, flat.numpy())
    return exchange


def ps_colocated(comm, src: np.ndarray) -> Callable[[np.ndarray], None]:
    from mpi4py import MPI

    me, n = comm.rank, comm.size
    b = shard_bounds(len(src), n)
    lo, hi = b[me], b[me + 1]
    inbox = np.empty((n, hi - lo), dtype=np.float32)

    def exchange(dst):
        peers = [j for j in range(n) if j != me]
        # push: shard j of my gradient to its owner j; receive my shard from every peer
        reqs = [comm.Irecv(inbox[j], source=j, tag=1) for j in peers]
        reqs += [comm.Isend(src[b[j]:b[j + 1]], dest=j, tag=1) for j in peers]
        MPI.Request.Waitall(reqs)
        acc = dst[lo:hi]
        np.copyto(acc, src[lo:hi])
        for j in peers:
            acc += inbox[j]
        # pull: every owner sends its summed shard to every peer
        reqs = [comm.Irecv(dst[b[j]:b[j + 1]], source=j, tag=2) for j in peers]
        reqs += [comm.Isend(acc, dest=j, tag=2) for j in peers]
        MPI.Request.Waitall(reqs)
    return exchange


def ps_dedicated(comm, src: np.ndarray | None, n_elems: int, servers: int) -> Callable[[np.ndarray | None], None]:
    """Servers are ranks 0..K-1, workers K..K+N-1; server k owns shard k of the gradient."""
    from mpi4py import MPI

    workers = range(servers, comm.size)
    b = shard_bounds(n_elems, servers)
    if comm.rank >= servers:
        def exchange(dst):
            reqs = [comm.Irecv(dst[b[k]:b[k + 1]], source=k, tag=2) for k in range(servers)]  # pull
            reqs += [comm.Isend(src[b[k]:b[k + 1]], dest=k, tag=1) for k in range(servers)]  # push
            MPI.Request.Waitall(reqs)
        return exchange

    k = comm.rank
    inbox = np.empty((len(workers), b[k + 1] - b[k]), dtype=np.float32)
    acc = np.empty(b[k + 1] - b[k], dtype=np.float32)

    def serve(_dst):
        MPI.Request.Waitall([comm.Irecv(inbox[i], source=w, tag=1) for i, w in enumerate(workers)])
        np.sum(inbox, axis=0, out=acc)
        MPI.Request.Waitall([comm.Isend(acc, dest=w, tag=2) for w in workers])
    return serve


def horovod_allreduce(hvd, src: np.ndarray, shapes, fp16: bool, op) -> Callable[[np.ndarray], None]:
    """One async in-place allreduce per tensor, then wait for all: what DistributedOptimizer does
    from its backward hooks, so Horovod fuses them (HOROVOD_FUSION_THRESHOLD) as in training."""
    import torch

    compression = hvd.Compression.fp16 if fp16 else hvd.Compression.none
    flat = torch.from_numpy(src.copy())
    views, off = [], 0
    for s in shapes:
        n = int(np.prod(s))
        views.append(flat[off:off + n].view(s))
        off += n

    def exchange(dst):
        flat.copy_(torch.from_numpy(src))  # in-place ops consume their input
        pending = []
        for i, t in enumerate(views):
            wire, ctx = compression.compress(t)
            pending.append((hvd.allreduce_async_(wire, op=op, name=f"commbench.{i}"), wire, ctx, t))  # communication
        for handle, wire, ctx, t in pending:
            hvd.synchronize(handle)  # communication: wait for this tensor
            if wire is not t:
                t.copy_(compression.decompress(wire, ctx))
        np.copyto(dst, flat.numpy())
    return exchange


# ------------------------------------------------------------------------- per-rank benchmark

def check_numbers(args: argparse.Namespace) -> str | None:
    for flag, v, ok in (("--iters", args.iters, args.iters >= 0), ("--warmup", args.warmup, args.warmup >= 0),
                        ("--budget", args.budget, args.budget > 0)):
        if not ok:
            return f"{flag} must be {'> 0' if flag == '--budget' else '>= 0'} (got {v})"
    return None


def run_rank(args: argparse.Namespace) -> int:
    """The benchmark on this rank of an mpirun job; rank 0 writes the results."""
    from mpi4py import MPI  # initialises MPI before Horovod, which then reuses it

    comm = MPI.COMM_WORLD
    impls = [i.strip() for i in (args.impls or ",".join(RANK_IMPLS)).split(",") if i.strip()]
    bad = [i for i in impls if i not in IMPLS]
    err = check_numbers(args)
    if bad:
        err = f"--impls: unknown implementation {bad[0]!r}; choose from: {', '.join(IMPLS)}"
    elif "ps-dedicated" in impls and len(impls) > 1:
        err = "--impls: run ps-dedicated on its own (its job has N workers + K server ranks)"
    elif "ps-dedicated" in impls and not 1 <= args.ps_servers < comm.size:
        err = f"--ps-servers {args.ps_servers}: needs 1 <= K < ranks ({comm.size}); launch N + K ranks"
    try:
        loads = workloads(args.sizes, args.models) if err is None else []
    except BenchError as e:
        err = str(e)
    if err:
        if comm.rank == 0:
            print(f"allreduce_train: error: {err}", file=sys.stderr, flush=True)
        return 2

    dedicated = impls == ["ps-dedicated"]
    servers = args.ps_servers if dedicated else 0
    workers = comm.size - servers
    is_worker = comm.rank >= servers
    worker_index = comm.rank - servers
    results: list[dict[str, Any]] = []
    hvd = None
    knobs = {k: os.environ[k] for k in ("HOROVOD_CYCLE_TIME", "HOROVOD_FUSION_THRESHOLD") if k in os.environ}
    # MPI and PS first: once Horovod is up its background thread polls every cycle and would
    # share the cores with the raw-MPI measurements.
    for impl in sorted(impls, key=lambda i: i.startswith("horovod")):
        if impl.startswith("horovod") and hvd is None:
            import horovod.torch as hvd

            hvd.init()  # communication: forms Horovod's process group over the same ranks
        for w in loads:
            src = rank_input(worker_index, w.n_elems) if is_worker else None
            if impl == "mpi":
                make = lambda op: mpi_allreduce(comm, src)  # noqa: E731
            elif impl == "mpi-ring":
                make = lambda op: mpi_ring(src, w.shapes, op == "sum", args.mpi_bucket_bytes)  # noqa: E731
            elif impl == "ps-colocated":
                make = lambda op: ps_colocated(comm, src)  # noqa: E731
            elif impl == "ps-dedicated":
                make = lambda op: ps_dedicated(comm, src, w.n_elems, servers)  # noqa: E731
            else:
                make = lambda op: horovod_allreduce(hvd, src, w.shapes, impl == "horovod-fp16", op)  # noqa: E731
            dst = np.empty(w.n_elems, dtype=np.float32) if is_worker else None
            # 1) correctness: one summing exchange of the fresh input
            make(hvd.Sum if hvd else "sum")(dst)
            max_err = float(np.abs(dst - expected_sum(workers, w.n_elems)).max()) if is_worker else 0.0
            if args.dump_dir and is_worker:
                np.save(os.path.join(args.dump_dir, f"{impl}-{w.name}-worker{worker_index}.npy"), dst)
            # 2) timing; Horovod averages as in training (in-place sums would grow without bound)
            times = _time(make(hvd.Average if hvd else "average"), dst, args.warmup, args.iters, args.budget, comm)
            everyone = comm.gather((times, max_err) if is_worker else None, root=0)  # communication
            if comm.rank == 0:
                per_iter = [max(col) for col in zip(*(t for t, _ in filter(None, everyone)))]
                results.append(summarise(impl, w, workers, servers, comm.size, per_iter,
                                         max(e for _, e in filter(None, everyone)), knobs))
                r = results[-1]
                print(f"  {impl:13s} {w.name:>16s} {human_bytes(w.nbytes):>9s}  {1e3 * r['time_s']:9.3f} ms  "
                      f"algbw {r['algbw_gbs']:7.3f} GB/s  busbw {r['busbw_gbs']:7.3f} GB/s  err {r['max_abs_err']:g}",
                      flush=True)
    if hvd is not None:
        hvd.shutdown()
    if comm.rank == 0 and args.out:
        _write_json(args.out, {"results": results})
    return 0


def summarise(impl: str, w: Workload, workers: int, servers: int, world: int, per_iter: list[float],
              max_err: float, knobs: dict[str, str]) -> dict[str, Any]:
    t = statistics.median(per_iter)
    q = statistics.quantiles(per_iter, n=4) if len(per_iter) >= 2 else [t, t, t]
    algbw = w.nbytes / t
    return {
        "impl": impl, "workload": w.name, "workload_kind": w.kind, "bytes": w.nbytes, "tensors": len(w.shapes),
        "workers": workers, "servers": servers, "world_size": world, "iters": len(per_iter),
        "time_s": t, "time_p25_s": q[0], "time_p75_s": q[2],
        "algbw_gbs": algbw / 1e9,
        "busbw_gbs": algbw * costmodel.bus_factor(KIND[impl], workers, max(servers, 1)) / 1e9,
        "max_abs_err": max_err, "horovod_env": knobs if impl.startswith("horovod") else {},
    }


def _write_json(path: str, data: dict) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as fh:
        json.dump(data, fh, indent=2, sort_keys=True)
        fh.write("\n")
    os.replace(tmp, path)


# ------------------------------------------------------------------------- front end

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
    impls = [i.strip() for i in (args.impls or ",".join(IMPLS)).split(",") if i.strip()]
    for i in impls:
        if i not in IMPLS:
            raise BenchError(f"--impls: unknown implementation {i!r}; choose from: {', '.join(IMPLS)}")
    shared = [i for i in impls if i != "ps-dedicated"]
    jobs = []
    if shared:
        jobs.append(Job("default", args.np, ",".join(shared), {}, []))
    if any(i.startswith("horovod") for i in impls):
        for ct in _floats(args.horovod_cycle_ms, "--horovod-cycle-ms"):
            jobs.append(Job(f"cycle={ct:g}ms", args.np, "horovod", {"HOROVOD_CYCLE_TIME": f"{ct:g}"}, []))
        for mb in _floats(args.horovod_fusion_mb, "--horovod-fusion-mb"):
            jobs.append(Job(f"fusion={mb:g}MB", args.np, "horovod",
                            {"HOROVOD_FUSION_THRESHOLD": str(int(mb * (1 << 20)))}, []))
    if "horovod" in impls and args.timeline_size:
        parse_size(args.timeline_size)
        jobs.append(Job("timeline", args.np, "horovod", {"HOROVOD_TIMELINE": TIMELINE_NAME}, [],
                        sizes=args.timeline_size, models=""))
    if "ps-dedicated" in impls:
        for k in _ints(args.ps_servers_list, "--ps-servers"):
            jobs.append(Job(f"K={k}", args.np + k, "ps-dedicated", {}, ["--ps-servers", str(k)]))
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
        rank_args = ["--impls", job.impls, "--sizes", job.sizes or args.sizes, "--models", models, "--out", part,
                     "--iters", str(args.iters), "--budget", str(args.budget), "--warmup", str(args.warmup),
                     "--mpi-bucket-bytes", str(args.mpi_bucket_bytes), *job.extra]
        if args.dump_dir:
            rank_args += ["--dump-dir", args.dump_dir]
        print(f"[{job.label}] {job.np} ranks: {job.impls} {' '.join(f'{k}={v}' for k, v in job.env.items())}",
              flush=True)
        env = {**os.environ, "OMP_NUM_THREADS": "1",
               **{k: os.path.join(out_dir, v) if k == "HOROVOD_TIMELINE" else v for k, v in job.env.items()}}
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
        timeline = {"size": args.timeline_size,
                    "phases": timeline_phases(os.path.join(out_dir, TIMELINE_NAME)),
                    "time_s": next((r["time_s"] for r in results if r["job"] == "timeline"), math.nan)}
    report = {"np": args.np, "memcpy_bandwidth_gbs": copy_bw / 1e9, "results": results, "failures": failures,
              "timeline": timeline, "command": ["python", "-m", "lab", *sys.argv[1:]]}
    _write_json(os.path.join(out_dir, "commbench.json"), report)
    with open(os.path.join(out_dir, "commbench.md"), "w") as fh:
        fh.write(markdown(report))
    print(markdown(report), flush=True)
    return report


def label(r: dict) -> str:
    """Implementation and configuration, e.g. 'horovod [cycle=0.1ms]' or 'ps-dedicated [K=1]'."""
    return r["impl"] if r.get("job", "default") == "default" else f"{r['impl']} [{r['job']}]"


def markdown(report: dict) -> str:
    rows = report["results"]
    lines = [f"Exchange of S bytes of float32 gradient among N = {report['np']} workers; time = median over "
             "iterations of the slowest worker; algbw = S / time; busbw = algbw x 2(N-1)/N for allreduce "
             "(nccl-tests), and the bottleneck-link factor of the cost model for the PS patterns.",
             "",
             f"Ceiling: memory copy bandwidth of one core = {report['memcpy_bandwidth_gbs']:.2f} GB/s.", ""]
    for kind in ("size", "model"):
        sel = [r for r in rows if r["workload_kind"] == kind]
        if not sel:
            continue
        lines += ["| workload | bytes | implementation | workers (+servers) | time ms | algbw GB/s | busbw GB/s |",
                  "|---|---:|---|---|---:|---:|---:|"]
        for r in sorted(sel, key=lambda r: (r["bytes"], r["workload"], label(r))):
            n = f"{r['workers']}" + (f" (+{r['servers']})" if r["servers"] else "")
            lines.append(f"| {r['workload']} | {human_bytes(r['bytes'])} | {label(r)} | {n} | "
                         f"{1e3 * r['time_s']:.3f} | {r['algbw_gbs']:.3f} | {r['busbw_gbs']:.3f} |")
        lines.append("")
    tl = report.get("timeline")
    if tl and tl["phases"]:
        ph = tl["phases"]
        lines += [f"Where Horovod's time goes: one {tl['size']} allreduce, {1e3 * tl['time_s']:.3f} ms per call "
                  f"from Python (median), and the median of each activity in its timeline "
                  f"(`{TIMELINE_NAME}`, open in chrome://tracing):", "",
                  "| activity | median ms | count |", "|---|---:|---:|"]
        for name in [p for p in PHASES if p in ph] + sorted(set(ph) - set(PHASES)):
            lines.append(f"| {name} | {ph[name]['median_ms']:.3f} | {ph[name]['count']} |")
        inside = sum(ph[p]["median_ms"] for p in ("NEGOTIATE_ALLREDUCE", "ALLREDUCE") if p in ph)
        raw = [r for r in rows if r["impl"] == "mpi" and r["workload_kind"] == "size"
               and r["bytes"] == parse_size(tl["size"])]
        lines += ["", f"Outside these activities (enqueueing, waiting for the background thread's next cycle, "
                      f"the handle poll in synchronize): {max(0.0, 1e3 * tl['time_s'] - inside):.3f} ms."
                  + (f" A raw MPI_Allreduce of the same buffer: {1e3 * raw[0]['time_s']:.3f} ms." if raw else ""), ""]
    bad = [r for r in rows if r["max_abs_err"] != 0]
    lines.append("Every implementation returned the exact expected sum." if rows and not bad else
                 f"{len(bad)} result(s) differ from the expected sum: "
                 + ", ".join(f"{label(r)}/{r['workload']} ({r['max_abs_err']:g})" for r in bad))
    if report["failures"]:
        lines.append("Failed jobs: " + "; ".join(report["failures"]))
    return "\n".join(lines) + "\n"


def _shared_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--impls", default="", help=f"comma-separated subset of: {', '.join(IMPLS)} (default: all; "
                                               "one rank of a job: all but ps-dedicated, which needs its own job)")
    p.add_argument("--sizes", default=DEFAULT_SIZES, help=f"message sizes to sweep (default: {DEFAULT_SIZES})")
    p.add_argument("--models", default="lenet5",
                   help="comma-separated models whose gradient tensor lists to exchange (default: lenet5)")
    p.add_argument("--iters", type=int, default=0,
                   help=f"timed iterations (default: 0 = as many as fit --budget, {MIN_ITERS} to {MAX_ITERS})")
    p.add_argument("--budget", type=float, default=0.5,
                   help="seconds of timed exchanges per implementation and workload when --iters is 0 (default: 0.5)")
    p.add_argument("--warmup", type=int, default=3, help="untimed iterations first (default: 3)")
    p.add_argument("--dump-dir", default="", help="every worker saves each result array here (tests)")
    p.add_argument("--mpi-bucket-bytes", type=int, default=1 << 20,
                   help="mpi-ring: the trainer's --mpi-bucket-bytes (default: its default, 1 MB)")


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The front end: launches one job per configuration and merges their results."""
    p.add_argument("--np", type=int, default=2, help="workers per job (default: 2)")
    _shared_arguments(p)
    p.add_argument("--ps-servers-list", default="1", help="K values for the dedicated PS (default: 1)")
    p.add_argument("--horovod-cycle-ms", default="0.1,5",
                   help="extra Horovod runs with these HOROVOD_CYCLE_TIME values in ms (default: 0.1,5; "
                        "Horovod's own default is 1)")
    p.add_argument("--horovod-fusion-mb", default="",
                   help="extra Horovod runs with these HOROVOD_FUSION_THRESHOLD values in MB "
                        "(default: none; Horovod's own default is 128)")
    p.add_argument("--timeline-size", default="4M",
                   help="one extra Horovod run of this size with HOROVOD_TIMELINE, broken down by "
                        "activity ('' = none; default: 4M)")
    p.add_argument("--out-dir", default="", help="output directory (default: runs/commbench/<time>)")
    p.add_argument("--job-timeout", type=float, default=1800, help="seconds before a job is killed")


def add_rank_arguments(p: argparse.ArgumentParser) -> None:
    """One rank of a commbench job (lab.commbench.rank)."""
    _shared_arguments(p)
    p.add_argument("--ps-servers", type=int, default=1,
                   help="the first K ranks are dedicated servers (with --impls ps-dedicated)")
    p.add_argument("--out", default="", help="rank 0 writes the results to this JSON file")


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
