"""commbench's rank side: the exchanges it times and how (started through :mod:`.rank`).

Every rank reduces the same deterministic, integer-valued input (exact in fp32 and fp16, so every
implementation must return the identical sum), then each implementation is timed; rank 0 writes
the results. The implementations are listed in :mod:`.main`'s docstring.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..common import costmodel, recipe

IMPLS = ("mpi", "ring-mpi", "ps-sync-colocated", "ring-horovod", "ring-horovod-fp16", "ps-sync-dedicated")
# the cost model's exchange of each row: the PS rows' own, every other an allreduce
PS_KIND = {"ps-sync-colocated": costmodel.PS_COLOCATED, "ps-sync-dedicated": costmodel.PS_DEDICATED}
KIND = {i: PS_KIND.get(i, costmodel.ALLREDUCE) for i in IMPLS}
RANK_IMPLS = tuple(i for i in IMPLS if i != "ps-sync-dedicated")
DEFAULT_SIZES = "4K,16K,64K,256K,1M,4M,16M,64M,256M"
UNITS = {"": 1, "B": 1, "K": 1 << 10, "KB": 1 << 10, "M": 1 << 20, "MB": 1 << 20, "G": 1 << 30, "GB": 1 << 30}


class BenchError(Exception):
    """Bad commbench input; the message names the flag."""


def parse_size(text: str) -> int:
    """'4K' -> 4096, '256M' -> 268435456 (binary units), rounded down to whole float32 elements."""
    t = text.strip().upper()
    num = t.rstrip("KMGB")
    unit = t[len(num) :]
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
    total = np.zeros(n_elems, dtype=np.float32)
    for r in range(workers):
        total += rank_input(r, n_elems)
    return total


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
    out = [
        Workload(human_bytes(b).replace(" ", ""), "size", [(b // 4,)])
        for b in (parse_size(s) for s in sizes.split(",") if s.strip())
    ]
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

    from allreduce_train.config import ExchangeConfig, MPIConfig
    from allreduce_train.distributed.ring import MPIRingAllreduce

    # communication: its own communicator
    ex = MPIRingAllreduce(
        ExchangeConfig(allreduce_engine="mpi"), MPIConfig(bucket_bytes=bucket_bytes), average=not total
    )
    flat = torch.from_numpy(src.copy())
    params: list[torch.Tensor] = []
    off = 0
    for s in shapes:
        n = int(np.prod(s))
        p = torch.nn.Parameter(torch.zeros(s))
        p.grad = flat[off : off + n].view(s)  # the exchange writes the result back into .grad: into flat
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
        reqs += [comm.Isend(src[b[j] : b[j + 1]], dest=j, tag=1) for j in peers]
        MPI.Request.Waitall(reqs)
        acc = dst[lo:hi]
        np.copyto(acc, src[lo:hi])
        for j in peers:
            acc += inbox[j]
        # pull: every owner sends its summed shard to every peer
        reqs = [comm.Irecv(dst[b[j] : b[j + 1]], source=j, tag=2) for j in peers]
        reqs += [comm.Isend(acc, dest=j, tag=2) for j in peers]
        MPI.Request.Waitall(reqs)

    return exchange


def ps_dedicated(comm, src: np.ndarray | None, n_elems: int, servers: int) -> Callable[[np.ndarray | None], None]:
    """Servers are ranks 0..K-1, workers K..K+N-1; server k owns shard k of the gradient."""
    from mpi4py import MPI

    workers = range(servers, comm.size)
    b = shard_bounds(n_elems, servers)
    if comm.rank >= servers:
        assert src is not None  # a worker pushes its input

        def exchange(dst):
            reqs = [comm.Irecv(dst[b[k] : b[k + 1]], source=k, tag=2) for k in range(servers)]  # pull
            reqs += [comm.Isend(src[b[k] : b[k + 1]], dest=k, tag=1) for k in range(servers)]  # push
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


def exchange_for(
    impl: str, op: Any, *, comm, hvd, src: Any, load: Workload, servers: int, bucket_bytes: int
) -> Callable[[Any], None]:
    """``impl``'s exchange of ``src`` reducing by ``op``, called with its destination (src and the
    destination are None on a dedicated server: ps-sync-dedicated only)."""
    if impl == "mpi":
        return mpi_allreduce(comm, src)
    if impl == "ring-mpi":
        return mpi_ring(src, load.shapes, op == "sum", bucket_bytes)
    if impl == "ps-sync-colocated":
        return ps_colocated(comm, src)
    if impl == "ps-sync-dedicated":
        return ps_dedicated(comm, src, load.n_elems, servers)
    return horovod_allreduce(hvd, src, load.shapes, impl == "ring-horovod-fp16", op)


def horovod_allreduce(hvd, src: np.ndarray, shapes, fp16: bool, op) -> Callable[[np.ndarray], None]:
    """One async in-place allreduce per tensor, then wait for all: what DistributedOptimizer does
    from its backward hooks, so Horovod fuses them (HOROVOD_FUSION_THRESHOLD) as in training."""
    import torch

    compression = hvd.Compression.fp16 if fp16 else hvd.Compression.none
    flat = torch.from_numpy(src.copy())
    views, off = [], 0
    for s in shapes:
        n = int(np.prod(s))
        views.append(flat[off : off + n].view(s))
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
    for flag, v, ok in (
        ("--iters", args.iters, args.iters >= 0),
        ("--warmup", args.warmup, args.warmup >= 0),
        ("--budget", args.budget, args.budget > 0),
    ):
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
    elif "ps-sync-dedicated" in impls and len(impls) > 1:
        err = "--impls: run ps-sync-dedicated on its own (its job has N workers + K server ranks)"
    elif "ps-sync-dedicated" in impls and not 1 <= args.ps_servers < comm.size:
        err = f"--ps-servers {args.ps_servers}: needs 1 <= K < ranks ({comm.size}); launch N + K ranks"
    try:
        loads = workloads(args.sizes, args.models) if err is None else []
    except BenchError as e:
        err = str(e)
    if err:
        if comm.rank == 0:
            print(f"allreduce_train: error: {err}", file=sys.stderr, flush=True)
        return 2

    dedicated = impls == ["ps-sync-dedicated"]
    servers = args.ps_servers if dedicated else 0
    workers = comm.size - servers
    is_worker = comm.rank >= servers
    worker_index = comm.rank - servers
    results: list[dict[str, Any]] = []
    hvd: Any = None
    knobs = {k: os.environ[k] for k in ("HOROVOD_CYCLE_TIME", "HOROVOD_FUSION_THRESHOLD") if k in os.environ}
    # MPI and PS first: once Horovod is up its background thread polls every cycle and would
    # share the cores with the raw-MPI measurements.
    for impl in sorted(impls, key=lambda i: i.startswith("ring-horovod")):
        if impl.startswith("ring-horovod") and hvd is None:
            import horovod.torch

            hvd = horovod.torch
            hvd.init()  # communication: forms Horovod's process group over the same ranks
        for w in loads:
            src = rank_input(worker_index, w.n_elems) if is_worker else None
            make = functools.partial(
                exchange_for,
                impl,
                comm=comm,
                hvd=hvd,
                src=src,
                load=w,
                servers=servers,
                bucket_bytes=args.mpi_bucket_bytes,
            )
            dst = np.empty(w.n_elems, dtype=np.float32) if is_worker else None
            # 1) correctness: one summing exchange of the fresh input
            make(hvd.Sum if hvd else "sum")(dst)
            max_err = float(np.abs(dst - expected_sum(workers, w.n_elems)).max()) if is_worker else 0.0
            if args.dump_dir and dst is not None:  # a worker's
                np.save(os.path.join(args.dump_dir, f"{impl}-{w.name}-worker{worker_index}.npy"), dst)
            # 2) timing; Horovod averages as in training (in-place sums would grow without bound)
            times = _time(make(hvd.Average if hvd else "average"), dst, args.warmup, args.iters, args.budget, comm)
            everyone = comm.gather((times, max_err) if is_worker else None, root=0)  # communication
            if comm.rank == 0:
                assert everyone is not None  # gathered at rank 0
                per_iter = [max(col) for col in zip(*(t for t, _ in filter(None, everyone)), strict=True)]
                results.append(
                    summarise(
                        impl, w, workers, servers, comm.size, per_iter, max(e for _, e in filter(None, everyone)), knobs
                    )
                )
                r = results[-1]
                print(
                    f"  {impl:13s} {w.name:>16s} {human_bytes(w.nbytes):>9s}  {1e3 * r['time_s']:9.3f} ms  "
                    f"algbw {r['algbw_gbs']:7.3f} GB/s  busbw {r['busbw_gbs']:7.3f} GB/s  err {r['max_abs_err']:g}",
                    flush=True,
                )
    if hvd is not None:
        hvd.shutdown()
    if comm.rank == 0 and args.out:
        _write_json(args.out, {"results": results})
    return 0


def summarise(
    impl: str,
    w: Workload,
    workers: int,
    servers: int,
    world: int,
    per_iter: list[float],
    max_err: float,
    knobs: dict[str, str],
) -> dict[str, Any]:
    t = statistics.median(per_iter)
    q = statistics.quantiles(per_iter, n=4) if len(per_iter) >= 2 else [t, t, t]
    algbw = w.nbytes / t
    return {
        "impl": impl,
        "workload": w.name,
        "workload_kind": w.kind,
        "bytes": w.nbytes,
        "tensors": len(w.shapes),
        "workers": workers,
        "servers": servers,
        "world_size": world,
        "iters": len(per_iter),
        "time_s": t,
        "time_p25_s": q[0],
        "time_p75_s": q[2],
        "algbw_gbs": algbw / 1e9,
        "busbw_gbs": algbw * costmodel.bus_factor(KIND[impl], workers, max(servers, 1)) / 1e9,
        "max_abs_err": max_err,
        "horovod_env": knobs if impl.startswith("ring-horovod") else {},
    }


def _write_json(path: str, data: dict) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as fh:
        json.dump(data, fh, indent=2, sort_keys=True)
        fh.write("\n")
    os.replace(tmp, path)


# ------------------------------------------------------------------------- front end


def _shared_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--impls",
        default="",
        help=f"comma-separated subset of: {', '.join(IMPLS)} (default: all; "
        "one rank of a job: all but ps-sync-dedicated, which needs its own job)",
    )
    p.add_argument("--sizes", default=DEFAULT_SIZES, help=f"message sizes to sweep (default: {DEFAULT_SIZES})")
    p.add_argument(
        "--models",
        default="lenet5",
        help="comma-separated models whose gradient tensor lists to exchange (default: lenet5)",
    )
    p.add_argument(
        "--iters",
        type=int,
        default=0,
        help=f"timed iterations (default: 0 = as many as fit --budget, {MIN_ITERS} to {MAX_ITERS})",
    )
    p.add_argument(
        "--budget",
        type=float,
        default=0.5,
        help="seconds of timed exchanges per implementation and workload when --iters is 0 (default: 0.5)",
    )
    p.add_argument("--warmup", type=int, default=3, help="untimed iterations first (default: 3)")
    p.add_argument("--dump-dir", default="", help="every worker saves each result array here (tests)")
    recipe.add_trainer_flag(p, "mpi_bucket_bytes", "ring-mpi: the trainer's --mpi-bucket-bytes, with its default")


def add_rank_arguments(p: argparse.ArgumentParser) -> None:
    """One rank of a commbench job (lab.commbench.rank)."""
    _shared_arguments(p)
    p.add_argument(
        "--ps-servers",
        type=int,
        default=1,
        help="the first K ranks are dedicated servers (with --impls ps-sync-dedicated)",
    )
    p.add_argument("--out", default="", help="rank 0 writes the results to this JSON file")
