"""``gpucheck``: LeNet-5, ResNet-18 and the small LSTM for a fixed number of steps on one GPU, and one
table (samples/s, step ms, peak GPU memory).

One rank, four ways, at each model's own batch and at a larger one that keeps the GPU busy
(``--busy``; at the small batches an H200 waits on kernel launches):

* ``trainer``: the project's :class:`Trainer` with ``--strategy allreduce`` at one rank, as ``train``
  runs it: it exchanges nothing (the average over one worker is its own gradient), so this row is
  the trainer's own cost on the GPU, labelled "no exchange".
* ``trainer-exchange``: the same with ``ALLREDUCE_TRAIN_EXCHANGE_AT_ONE_RANK=1`` (for checks): every
  gradient goes through Horovod's allreduce from the backward hooks, as at more ranks (with CUDA
  tensors: Horovod's NCCL operations). The row counts the allreduces the trainer started, so it
  shows that they ran; comparable with the two rows below.
* ``horovod``: a bare loop that allreduces every gradient through Horovod each step
  (``hvd.grouped_allreduce_``).
* ``ddp``: the same loop on ``torch.nn.parallel.DistributedDataParallel``, process group ``nccl``.

Then two ranks on the same device (``--two-ranks``), through the trainer's multi-rank path, each
rank's parameters compared at the end (identical only if the exchange really averaged them):

* ``ring-gloo``: Horovod with Gloo for control and data, started here without MPI (a Gloo
  rendezvous served by this process, as ``horovodrun --gloo`` does). NCCL refuses two ranks on one
  GPU, and a Horovod built with NCCL operations sends every CUDA tensor to NCCL (there is no
  run-time switch), so these ranks load a Horovod built without GPU operations
  (``--gloo-pythonpath``): it copies each CUDA gradient to the host, allreduces it with Gloo and
  copies the result back (Horovod's ``*CudaOnCPU`` entry points). This checks the trainer's
  multi-rank CUDA path and Horovod's staging through the host, not NCCL between GPUs.
* ``ring-mpi`` and ``ps``: the mpi4py ring engine and the colocated parameter server, which move CUDA
  gradients through host buffers themselves; under ``python -m launch -np 2`` (mpirun), so only
  where mpirun and mpi4py are installed: elsewhere the row says it was skipped.

Below the table, the accounting of issue 28 per model and batch: the trainer's step against
DDP-NCCL's (and the bare Horovod loop's), as the microseconds per step the trainer adds, and with
``--parts`` where they go: the trainer's exchanging run once more with a timer around each part of
its step (:mod:`lab.common.stepparts`; a separate run, so the figures above carry no timer's cost).
On a GPU a part's wall time is where the CPU waited: the forward pass's kernels show up where the
step's vote reads the loss, backward's in the step end's ``torch.cuda.synchronize()`` (residue).

Each run is its own process (or job), so the peak memory is its own and one failure does not hide
the rest. ``--device cpu`` (tools/gpu_check.sh --dry-run) runs everything on the CPU instead:
Horovod's CPU operations and DDP over gloo; it checks the code, not the figures. The bare loops
train on one fixed batch, as Horovod's synthetic benchmark does; the trainer on the synthetic
dataset. Started by tools/gpu_check.sh (make gpu-check); docs/gpu.md.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, ClassVar

import torch

from models import MODELS

from ..common.workloads import first_batch, loss_of

WAYS = ("trainer", "trainer-exchange", "horovod", "ddp")
LABELS = {
    "trainer": "trainer, no exchange",
    "trainer-exchange": "trainer, Horovod allreduce",
    "horovod": "bare Horovod",
    "ddp": "DDP",
    "ring-gloo": "trainer, Horovod Gloo, 2 ranks",
    "ring-mpi": "trainer, mpi4py ring, 2 ranks",
    "ps": "trainer, colocated PS, 2 ranks",
}
TWO_RANK_WAYS = ("ring-gloo", "ring-mpi", "ps")
DEFAULT_MODELS = "lenet5,resnet18,ptb-lstm-small"
# A batch per model at which the GPU computes more than it waits on kernel launches (the models' own
# batches, 64/64/20, leave an H200 launch-bound: issue 24's figures).
DEFAULT_BUSY = "lenet5=1024,resnet18=256,ptb-lstm-small=256"


def log(msg: str) -> None:
    print(f"[gpucheck {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def batch_for(model: str, batch_size: int) -> int:
    return batch_size or int(MODELS[model].defaults.get("batch_size", 64))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def peak_mb(device: torch.device) -> float | None:
    return torch.cuda.max_memory_allocated(device) / 2**20 if device.type == "cuda" else None


# ---------------------------------------------------------------- one (model, way), in its own process
def run_trainer(args: argparse.Namespace, device: torch.device) -> dict:
    from allreduce_train.config import add_arguments, build_config
    from allreduce_train.distributed import create_exchange
    from allreduce_train.run_logger import NullLogger
    from allreduce_train.trainer import Trainer

    class Losses(NullLogger):
        def __init__(self) -> None:
            self.losses: list[float] = []

        def scalars(self, step, values) -> None:
            if "train/loss" in values:
                self.losses.append(values["train/loss"])

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    total = args.warmup_steps + args.steps
    cli = parser.parse_args(
        [
            "--model",
            args.model,
            "--dataset",
            "synthetic",
            "--strategy",
            "allreduce",
            "--device",
            device.type,
            "--batch-size",
            str(batch_for(args.model, args.batch_size)),
            "--steps",
            str(total),
            "--perf-warmup-steps",
            str(args.warmup_steps),
            "--log-every",
            str(max(1, total // 4)),
            "--synthetic-samples",
            str(args.synthetic_samples),
            "--seed",
            str(args.seed),
            "--threads",
            str(args.threads),
        ]
    )
    cfg = build_config(cli)
    sent: dict[str, Any] = {"calls": 0, "bytes": 0, "devices": set()}
    if args.way == "trainer-exchange":
        os.environ["ALLREDUCE_TRAIN_EXCHANGE_AT_ONE_RANK"] = "1"
        count_allreduces(sent)
    ex = create_exchange(cfg)  # communication: hvd.init(), a world of one
    try:
        with tempfile.TemporaryDirectory() as run_dir:
            trainer = Trainer(cfg, ex, run_dir)
            setup = trainer.build()
            logger = Losses()
            result = trainer.run(setup, logger)
        note = f"Horovod controller {result['horovod_controller']}, world size {result['world_size']}"
        if args.way == "trainer-exchange":
            note += (
                f"; {sent['calls']} Horovod allreduces of {'/'.join(sorted(sent['devices']))} gradients "
                f"({sent['bytes'] / 2**20 / total:.2f} MB a step)"
            )
        return {
            "samples_per_sec": result["samples_per_sec"],
            "step_ms": 1e3 * result["global_batch"] / result["samples_per_sec"],
            "peak_mb": peak_mb(setup.device),
            "loss_first": logger.losses[0],
            "loss_last": logger.losses[-1],
            "allreduces": sent["calls"],
            "steps_run": total,
            "note": note,
        }
    finally:
        ex.close()


def count_allreduces(sent: dict) -> None:
    """Count the allreduces Horovod's DistributedOptimizer starts (its backward hooks call
    ``allreduce_async_``/``grouped_allreduce_async_`` from horovod.torch.optimizer), and their bytes."""
    import horovod.torch.optimizer as hopt

    def counted(fn):
        def call(tensors, *a, **kw):
            for t in tensors if isinstance(tensors, (list, tuple)) else [tensors]:
                sent["bytes"] += t.numel() * t.element_size()
                sent["devices"].add(t.device.type)
            sent["calls"] += 1
            return fn(tensors, *a, **kw)

        return call

    hopt.allreduce_async_ = counted(hopt.allreduce_async_)
    hopt.grouped_allreduce_async_ = counted(hopt.grouped_allreduce_async_)


def run_loop(args: argparse.Namespace, device: torch.device) -> dict:
    torch.manual_seed(args.seed)
    model = MODELS[args.model].build().to(device)
    x, y = first_batch(args.model, batch_for(args.model, args.batch_size), args.synthetic_samples, args.seed, 0, 1)
    x, y = x.to(device), y.to(device)
    if args.way == "horovod":
        import horovod.torch as hvd

        hvd.init()  # communication: a world of one (Gloo controller, or MPI's singleton)
        opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
        note = f"NCCL built: {bool(hvd.nccl_built())}, controller {'mpi' if hvd.mpi_enabled() else 'gloo'}"

        def step() -> torch.Tensor:
            opt.zero_grad()
            loss = loss_of(model, x, y)
            loss.backward()
            # communication: every gradient, one fused Horovod allreduce (NCCL for CUDA tensors)
            hvd.grouped_allreduce_(
                [p.grad for p in model.parameters() if p.grad is not None], op=hvd.Average, name="grads"
            )
            opt.step()
            return loss.detach()

        close = hvd.shutdown
    else:
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel

        backend = "nccl" if device.type == "cuda" else "gloo"
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
        # communication: a process group of one on the loopback interface
        dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
        ddp = DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
        opt = torch.optim.SGD(ddp.parameters(), lr=args.lr, momentum=0.9)
        note = f"process group {backend}"

        def step() -> torch.Tensor:
            opt.zero_grad()
            loss = loss_of(ddp, x, y)
            loss.backward()  # the bucket allreduces run inside backward
            opt.step()
            return loss.detach()

        close = dist.destroy_process_group
    try:
        first = step().item()
        for _ in range(args.warmup_steps - 1):
            step()
        if device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(args.steps):
            last = step()
        if device.type == "cuda":
            torch.cuda.synchronize()
        elapsed = time.perf_counter() - t0
        batch = x.shape[0]
        return {
            "samples_per_sec": batch * args.steps / elapsed,
            "step_ms": 1e3 * elapsed / args.steps,
            "peak_mb": peak_mb(device),
            "loss_first": first,
            "loss_last": last.item(),
            "note": note,
        }
    finally:
        close()


def run_one(args: argparse.Namespace) -> int:
    device = torch.device("cuda", 0) if args.device == "cuda" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
        torch.cuda.reset_peak_memory_stats(device)
    else:
        torch.set_num_threads(args.threads)
    meter = None
    if args.parts and args.way.startswith("trainer"):  # a timer around each part of the trainer's step
        from ..common.stepparts import Meter, instrument_trainer

        meter = Meter()
        instrument_trainer(meter, args.warmup_steps, args.steps)
    row = run_trainer(args, device) if args.way.startswith("trainer") else run_loop(args, device)
    if meter is not None:
        from ..common.stepparts import result

        row["parts"] = result(meter, args.way, args.model, 0, 1)
    with open(args.result, "w") as fh:
        json.dump(
            {
                "model": args.model,
                "way": args.way,
                "batch": batch_for(args.model, args.batch_size),
                "ranks": 1,
                "device": str(device),
                **row,
            },
            fh,
        )
    return 0


# ---------------------------------------------------------------- two ranks on the one device
class _KVStore(BaseHTTPRequestHandler):
    """Gloo's rendezvous for Horovod: a key-value store over HTTP (GET/PUT/DELETE of /scope/key),
    what horovodrun serves (horovod.runner.http.http_server), in the standard library only:
    Horovod's runner module needs psutil, which a bare GPU node's Python may lack."""

    store: ClassVar[dict[str, bytes]] = {}  # one store for all requests (a handler per request)
    lock = threading.Lock()

    def do_GET(self) -> None:
        with self.lock:
            value = self.store.get(self.path)
        self.send_response(200 if value is not None else 404)
        self.send_header("Content-Length", str(len(value or b"")))
        self.end_headers()
        self.wfile.write(value or b"")

    def do_PUT(self) -> None:
        value = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        with self.lock:
            self.store[self.path] = value
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_DELETE(self) -> None:  # a rank's Finalize(): nothing to keep
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *_) -> None:
        pass


def train_args(args: argparse.Namespace, model: str, batch: int, run_dir: str, name: str) -> list[str]:
    return [
        "--model",
        model,
        "--dataset",
        "synthetic",
        "--device",
        args.device,
        "--batch-size",
        str(batch),
        "--steps",
        str(args.two_rank_steps),
        "--perf-warmup-steps",
        str(min(args.warmup_steps, args.two_rank_steps - 1)),
        "--synthetic-samples",
        str(args.synthetic_samples),
        "--seed",
        str(args.seed),
        "--threads",
        str(args.threads),
        "--run-dir",
        run_dir,
        "--name",
        name,
        "--no-tensorboard",
        "--no-progress",
        "--dump-params",
        os.path.join(run_dir, f"{name}-{{rank}}.pt"),
    ]


def start_gloo_pair(args: argparse.Namespace, cli: list[str]) -> tuple[list[subprocess.Popen], ThreadingHTTPServer]:
    """Two trainer ranks with Horovod on Gloo (controller and operations), without MPI: this process
    serves the rendezvous and gives each rank the variables horovodrun --gloo would."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), type("KV", (_KVStore,), {"store": {}}))
    threading.Thread(target=server.serve_forever, daemon=True, name="gloo-rendezvous").start()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMPI_", "PMIX_", "HOROVOD_"))}
    if args.gloo_pythonpath:  # the Horovod without GPU operations (docstring), ahead of the NCCL one
        env["PYTHONPATH"] = args.gloo_pythonpath + os.pathsep + env.get("PYTHONPATH", "")
    env.update(
        {
            "HOROVOD_CONTROLLER": "gloo",
            "HOROVOD_CPU_OPERATIONS": "gloo",
            "HOROVOD_GLOO_IFACE": "lo",
            "HOROVOD_GLOO_RENDEZVOUS_ADDR": "127.0.0.1",
            "HOROVOD_GLOO_RENDEZVOUS_PORT": str(server.server_address[1]),
            "HOROVOD_HOSTNAME": "localhost",
            "HOROVOD_SIZE": "2",
            "HOROVOD_LOCAL_SIZE": "2",
            "HOROVOD_CROSS_RANK": "0",
            "HOROVOD_CROSS_SIZE": "1",
        }
    )
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "allreduce_train", "train", *cli, "--strategy", "allreduce"],
            env={**env, "HOROVOD_RANK": str(r), "HOROVOD_LOCAL_RANK": str(r)},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for r in range(2)
    ]
    return procs, server


def run_two(args: argparse.Namespace, way: str, model: str, batch: int) -> dict:
    """One two-rank job of ``way``; the row, with whether both ranks ended with the same parameters."""
    row = {"model": model, "way": way, "batch": batch, "ranks": 2, "device": args.device}
    if way != "ring-gloo":
        missing = [
            what for what, ok in (("mpirun", shutil.which("mpirun")), ("mpi4py", _importable("mpi4py"))) if not ok
        ]
        if missing:
            return {**row, "skipped": f"no {' or '.join(missing)} on this machine (the {LABELS[way]} row needs MPI)"}
    with tempfile.TemporaryDirectory() as run_dir:
        cli = train_args(args, model, batch, run_dir, way)
        server = None
        try:
            if way == "ring-gloo":
                procs, server = start_gloo_pair(args, cli)
            else:
                engine = (
                    ["--strategy", "allreduce", "--allreduce-engine", "mpi"]
                    if way == "ring-mpi"
                    else ["--strategy", "ps", "--ps-placement", "colocated"]
                )
                procs = [
                    subprocess.Popen(
                        [sys.executable, "-m", "launch", "-np", "2", "--", *cli, *engine],
                        stdout=subprocess.PIPE,
                        stderr=subprocess.STDOUT,
                        text=True,
                    )
                ]
            outs, rcs = [], []
            deadline = time.monotonic() + args.timeout
            for proc in procs:
                try:
                    outs.append(proc.communicate(timeout=max(1.0, deadline - time.monotonic()))[0])
                    rcs.append(proc.returncode)
                except subprocess.TimeoutExpired:
                    for p in procs:
                        p.kill()
                    outs.append(f"no result after {args.timeout} s")
                    rcs.append("timeout")
        finally:
            if server is not None:
                server.shutdown()
        out = "\n".join(outs)
        metrics_file = os.path.join(run_dir, way, "metrics.json")
        if any(rc != 0 for rc in rcs) or not os.path.exists(metrics_file):
            tail = [ln for ln in out.strip().splitlines() if ln.strip()][-1:] or ["no output"]
            log(f"  FAILED (exit {rcs}); its output ends:\n" + "\n".join(out.strip().splitlines()[-15:]))
            return {**row, "error": f"exit {rcs}: {tail[0][:200]}"}
        with open(metrics_file) as fh:
            metrics = json.load(fh)
        dumps = [torch.load(os.path.join(run_dir, f"{way}-{r}.pt"), weights_only=True) for r in range(2)]
    differ = [k for k in dumps[0] if not torch.equal(dumps[0][k], dumps[1][k])]
    spb = metrics["samples_per_sec"]
    return {
        **row,
        "samples_per_sec": spb,
        "step_ms": 1e3 * metrics["global_batch"] / spb,
        "peak_mb": None,
        "loss_first": float("nan"),
        "loss_last": metrics["final"]["train_loss"],
        "world_size": metrics["world_size"],
        "params_identical": not differ,
        "note": (
            f"world size {metrics['world_size']}"
            + (f", Horovod controller {metrics['horovod_controller']}" if "horovod_controller" in metrics else "")
            + f", {metrics.get('allreduce_engine') or metrics['strategy']}; both ranks' parameters "
            + ("identical at the end" if not differ else f"DIFFER in {len(differ)} tensors (no exchange?)")
        ),
    }


def _importable(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


# ---------------------------------------------------------------- the whole check
def _num(value: float | None, fmt: str) -> str:
    return "-" if value is None or value != value else format(value, fmt)


def table(rows: list[dict], device: str) -> str:
    mem = "peak GPU MB" if device == "cuda" else "peak GPU MB (CPU run)"
    lines = [
        f"| model | way | ranks | batch | samples/s | step ms | {mem} | loss first -> last | |",
        "|---|---|--:|--:|--:|--:|--:|---|---|",
    ]
    for r in rows:
        head = f"| {r['model']} | {LABELS[r['way']]} | {r['ranks']} | {r['batch']} |"
        if "skipped" in r:
            lines.append(f"{head} - | - | - | - | skipped: {r['skipped']} |")
        elif "error" in r:
            lines.append(f"{head} - | - | - | - | FAILED: {r['error']} |")
        else:
            lines.append(
                f"{head} {r['samples_per_sec']:.0f} | {r['step_ms']:.2f} | {_num(r['peak_mb'], '.0f')} | "
                f"{_num(r['loss_first'], '.3f')} -> {_num(r['loss_last'], '.3f')} | {r['note']} |"
            )
    return "\n".join(lines + [""] + regimes(rows))


def regimes(rows: list[dict]) -> list[str]:
    """Per model, the bare Horovod loop at the model's own batch against the busy one: when a batch
    k times larger takes much less than k times as long, the small batch left the GPU waiting on
    kernel launches (launch-bound); close to k times, the GPU was busy already."""
    out = []
    done = {(r["model"], r["batch"]): r for r in rows if r["way"] == "horovod" and "samples_per_sec" in r}
    for model in dict.fromkeys(r["model"] for r in rows):
        small = [b for (m, b) in done if m == model]
        if len(small) < 2:
            continue
        lo, hi = min(small), max(small)
        k, t = hi / lo, done[(model, hi)]["step_ms"] / done[(model, lo)]["step_ms"]
        regime = "launch-bound" if t < k / 2 else "busy"
        out.append(
            f"{model}: batch {hi} is {k:.0f}x batch {lo} and its step takes {t:.1f}x as long (bare Horovod): "
            f"at batch {lo} the device is {regime}."
        )
    return out


def accounting(rows: list[dict]) -> list[str]:
    """Per model and batch at one rank: the trainer's step (exchanging through Horovod, and without
    an exchange) against DDP's and the bare Horovod loop's, and the microseconds per step the
    trainer adds over DDP (issue 28's accounting; negative: the trainer is faster)."""
    done = {(r["model"], r["batch"], r["way"]): r for r in rows if r.get("ranks") == 1 and "step_ms" in r}
    keys = list(dict.fromkeys((m, b) for m, b, _ in done))
    out = []
    for m, b in keys:
        ddp = done.get((m, b, "ddp"))
        mine = [(w, done[(m, b, w)]) for w in ("trainer-exchange", "trainer") if (m, b, w) in done]
        if not ddp or not mine:
            continue
        hvd = done.get((m, b, "horovod"))
        for way, r in mine:
            out.append(
                f"| {m} | {b} | {LABELS[way]} | {r['step_ms']:.3f} | {ddp['step_ms']:.3f} | "
                f"{_num(hvd['step_ms'] if hvd else None, '.3f')} | {1e3 * (r['step_ms'] - ddp['step_ms']):+.0f} | "
                f"{ddp['step_ms'] / r['step_ms']:.3f} |"
            )
    if not out:
        return []
    return [
        "The trainer's per-step cost against DDP (one rank; DDP-NCCL on a GPU, gloo on the CPU):",
        "",
        "| model | batch | trainer | trainer step ms | DDP step ms | bare Horovod step ms | "
        "trainer - DDP µs/step | trainer / DDP throughput |",
        "|---|--:|---|--:|--:|--:|--:|--:|",
        *out,
        "",
    ]


def parts_table(rows: list[dict]) -> list[str]:
    """``--parts``: where the trainer's step goes, per model and batch (:mod:`lab.common.stepparts`)."""
    from ..common.stepparts import table as by_part

    found = {(f"{r['model']} batch {r['batch']}", LABELS[r["way"]]): [r["parts"]] for r in rows if "parts" in r}
    if not found:
        return []
    return [
        "Where the trainer's step goes (--parts: the same run again, each part timed; on a GPU the wall time "
        "is where the CPU waited for the kernels):",
        "",
        by_part(found),
        "",
    ]


def nccl_version() -> str:
    v = torch.cuda.nccl.version()  # (2, 29, 7); an int such as 22907 in older torch
    return ".".join(map(str, v)) if isinstance(v, tuple) else str(v)


def describe_machine(device: str) -> str:
    parts = [f"torch {torch.__version__}"]
    if device == "cuda":
        props = torch.cuda.get_device_properties(0)
        parts += [
            f"CUDA {torch.version.cuda}",
            f"{props.name} ({props.total_memory / 2**30:.0f} GiB, sm_{props.major}{props.minor})",
            f"NCCL {nccl_version()}",
        ]
    else:
        parts.append("CPU only (dry run: checks the code path, the figures mean nothing for a GPU)")
    return ", ".join(parts)


def parse_busy(text: str) -> dict[str, int]:
    """``--busy lenet5=1024,resnet18=256``: the extra batch per model ("" for none)."""
    busy = {}
    for item in filter(None, text.split(",")):
        model, _, batch = item.partition("=")
        if model not in MODELS or not batch.isdigit() or int(batch) < 1:
            raise ValueError(f"--busy {item!r}: use MODEL=BATCH with a model of {', '.join(sorted(MODELS))}")
        busy[model] = int(batch)
    return busy


def run_single(args: argparse.Namespace, tmp: str, model: str, way: str, batch: int, parts: bool = False) -> dict:
    result = os.path.join(tmp, f"{model}-{way}-{batch}{'-parts' if parts else ''}.json")
    cmd = [
        sys.executable,
        "-m",
        "lab",
        "gpucheck",
        "--one",
        way,
        "--model",
        model,
        "--device",
        args.device,
        "--result",
        result,
        "--steps",
        str(args.steps),
        "--warmup-steps",
        str(args.warmup_steps),
        "--batch-size",
        str(batch),
        "--synthetic-samples",
        str(args.synthetic_samples),
        "--threads",
        str(args.threads),
        *(["--parts"] if parts else []),
    ]
    rc: int | str  # "timeout" when the job gave no result in time
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
        rc, out = proc.returncode, proc.stdout + proc.stderr
    except subprocess.TimeoutExpired as e:
        rc, out = "timeout", f"no result after {args.timeout} s; " + str(e.stdout or "")[-500:]
    if rc == 0 and os.path.exists(result):
        with open(result) as fh:
            return json.load(fh)
    tail = [ln for ln in out.strip().splitlines() if ln.strip()][-1:] or ["no output"]
    log(f"  FAILED (exit {rc}); its output ends:\n" + "\n".join(out.strip().splitlines()[-15:]))
    return {"model": model, "way": way, "batch": batch, "ranks": 1, "error": f"exit {rc}: {tail[0][:200]}"}


def run_all(args: argparse.Namespace) -> int:
    models = [m for m in args.models.split(",") if m]
    unknown = [m for m in models if m not in MODELS]
    if unknown:
        print(
            f"gpucheck: unknown model(s) {', '.join(unknown)}; choose from: {', '.join(sorted(MODELS))}",
            file=sys.stderr,
        )
        return 2
    ways = [w for w in args.ways.split(",") if w]
    if any(w not in WAYS for w in ways):
        print(f"gpucheck: --ways {args.ways!r}: choose from {', '.join(WAYS)}", file=sys.stderr)
        return 2
    two = [w for w in args.two_ranks.split(",") if w]
    if any(w not in TWO_RANK_WAYS for w in two):
        print(
            f"gpucheck: --two-ranks {args.two_ranks!r}: choose from {', '.join(TWO_RANK_WAYS)} (or '')", file=sys.stderr
        )
        return 2
    try:
        busy = parse_busy(args.busy)
    except ValueError as e:
        print(f"gpucheck: {e}", file=sys.stderr)
        return 2
    if args.device == "cuda" and not torch.cuda.is_available():
        print(
            f"gpucheck: no GPU visible to torch {torch.__version__} (CUDA {torch.version.cuda}); "
            "for a CPU run of the same code: tools/gpu_check.sh --dry-run",
            file=sys.stderr,
        )
        return 2
    log(describe_machine(args.device))
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for model in models:
            own = batch_for(model, args.batch_size)
            for batch in [own] + ([busy[model]] if model in busy and busy[model] != own else []):
                for way in ways:
                    log(
                        f"{model} / {LABELS[way]}: {args.warmup_steps} warm-up + {args.steps} timed steps, "
                        f"batch {batch}, on {args.device}"
                    )
                    t0 = time.perf_counter()
                    row = run_single(args, tmp, model, way, batch)
                    if "error" not in row:
                        log(
                            f"  {row['samples_per_sec']:.0f} samples/s, {row['step_ms']:.2f} ms/step "
                            f"({time.perf_counter() - t0:.1f} s with start-up); {row['note']}"
                        )
                    rows.append(row)
                timed = next(
                    (
                        r
                        for r in rows[::-1]
                        if r["model"] == model
                        and r["batch"] == batch
                        and r["way"] in ("trainer-exchange", "trainer")
                        and "samples_per_sec" in r
                    ),
                    None,
                )
                if args.parts and timed:  # the same run again with a timer around each part of the step
                    log(f"{model} / {LABELS[timed['way']]}, batch {batch}: once more, each part of the step timed")
                    again = run_single(args, tmp, model, timed["way"], batch, parts=True)
                    if "parts" in again:
                        timed["parts"] = again["parts"]
    for model in [m for m in args.two_rank_models.split(",") if m in models] if two else []:
        for way in two:
            log(
                f"{model} / {LABELS[way]} on one {args.device} device: {args.two_rank_steps} steps, "
                f"batch {batch_for(model, args.batch_size)} a rank"
            )
            row = run_two(args, way, model, batch_for(model, args.batch_size))
            log(f"  {row.get('note') or row.get('skipped') or row.get('error')}")
            rows.append(row)
    text = "\n".join([table(rows, args.device), "", *accounting(rows), *parts_table(rows)])
    print("\n" + text, flush=True)
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(
                {
                    "machine": describe_machine(args.device),
                    "steps": args.steps,
                    "warmup_steps": args.warmup_steps,
                    "two_rank_steps": args.two_rank_steps,
                    "rows": rows,
                },
                fh,
                indent=1,
            )
        log(f"rows written to {args.out}")
    failed = [r for r in rows if "error" in r or r.get("params_identical") is False]
    return 1 if failed else 0


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help="cpu: the dry run (default: cuda)")
    p.add_argument("--models", default=DEFAULT_MODELS, help=f"comma-separated (default: {DEFAULT_MODELS})")
    p.add_argument(
        "--ways", default=",".join(WAYS), help="one-rank runs, comma-separated subset of: " + ", ".join(WAYS)
    )
    p.add_argument(
        "--busy",
        default=DEFAULT_BUSY,
        help=f"a second batch per model, MODEL=BATCH,... ('' for none; default: {DEFAULT_BUSY})",
    )
    p.add_argument(
        "--two-ranks",
        default=",".join(TWO_RANK_WAYS),
        help="two-rank jobs on the one device, subset of: " + ", ".join(TWO_RANK_WAYS) + " ('' for none)",
    )
    p.add_argument("--two-rank-models", default=DEFAULT_MODELS, help="the models of the two-rank jobs (of --models)")
    p.add_argument("--two-rank-steps", type=int, default=50, help="steps of each two-rank job (default: 50)")
    p.add_argument(
        "--gloo-pythonpath",
        default="",
        help="where the ring-gloo ranks find a Horovod built without GPU operations (tools/gpu_check.sh sets it)",
    )
    p.add_argument("--steps", type=int, default=200, help="timed steps per run (default: 200)")
    p.add_argument("--warmup-steps", type=int, default=20, help="untimed steps first (default: 20)")
    p.add_argument("--batch-size", type=int, default=0, help="0: each model's own (default)")
    p.add_argument("--synthetic-samples", type=int, default=6400, help="the trainer's synthetic dataset size")
    p.add_argument("--threads", type=int, default=1, help="torch threads on the CPU (dry run)")
    p.add_argument("--lr", type=float, default=0.01, help="the bare loops' SGD learning rate")
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--timeout", type=float, default=300, help="seconds for one run or two-rank job")
    p.add_argument("--out", default="", help="also write the rows as JSON here")
    p.add_argument(
        "--parts",
        action="store_true",
        help="run the trainer once more per model and batch with each part of its step timed (issue 28)",
    )
    p.add_argument("--one", choices=WAYS, dest="way", help=argparse.SUPPRESS)  # one run, in its own process
    p.add_argument("--model", default="lenet5", help=argparse.SUPPRESS)
    p.add_argument("--result", default="", help=argparse.SUPPRESS)


def main(args: argparse.Namespace) -> int:
    if args.steps < 1 or args.warmup_steps < 1 or args.two_rank_steps < 2:
        print("gpucheck: --steps and --warmup-steps must be >= 1, --two-rank-steps >= 2", file=sys.stderr)
        return 2
    return run_one(args) if args.way else run_all(args)
