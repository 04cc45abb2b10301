"""``gpucheck``: LeNet-5, ResNet-18 and the small LSTM for a fixed number of steps on one GPU, one
rank, three ways, and one table (samples/s, step ms, peak GPU memory).

* ``trainer``: the project's :class:`Trainer` through its Horovod exchange (``--strategy allreduce``),
  as ``train`` runs it. At one rank it exchanges nothing (the average over one worker is its own
  gradient), so this row is the trainer's own cost on the GPU.
* ``horovod``: a bare loop that allreduces every gradient through Horovod each step
  (``hvd.grouped_allreduce_``): with CUDA tensors, Horovod's NCCL operations.
* ``ddp``: the same loop on ``torch.nn.parallel.DistributedDataParallel``, process group ``nccl``.

Each (model, way) runs in its own process, so the peak memory is its own and one failure does not
hide the rest. ``--device cpu`` (tools/gpu_check.sh --dry-run) runs everything on the CPU instead:
Horovod's CPU operations and DDP over gloo; it checks the code, not the figures. The bare loops
train on one fixed batch, as Horovod's synthetic benchmark does; the trainer on the synthetic
dataset. Started by tools/gpu_check.sh (make gpu-check); docs/gpu.md.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time

import torch

from models import MODELS

from .bench.loops import first_batch, loss_of

WAYS = ("trainer", "horovod", "ddp")
DEFAULT_MODELS = "lenet5,resnet18,ptb-lstm-small"


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
    cli = parser.parse_args([
        "--model", args.model, "--dataset", "synthetic", "--strategy", "allreduce", "--device", device.type,
        "--batch-size", str(batch_for(args.model, args.batch_size)), "--steps", str(total),
        "--perf-warmup-steps", str(args.warmup_steps), "--log-every", str(max(1, total // 4)),
        "--synthetic-samples", str(args.synthetic_samples), "--seed", str(args.seed),
        "--threads", str(args.threads)])
    cfg = build_config(cli)
    ex = create_exchange(cfg)  # communication: hvd.init(), a world of one
    try:
        with tempfile.TemporaryDirectory() as run_dir:
            trainer = Trainer(cfg, ex, run_dir)
            setup = trainer.build()
            logger = Losses()
            result = trainer.run(setup, logger)
        return {"samples_per_sec": result["samples_per_sec"], "step_ms": 1e3 * result["global_batch"] / result["samples_per_sec"],
                "peak_mb": peak_mb(setup.device), "loss_first": logger.losses[0], "loss_last": logger.losses[-1],
                "note": f"Horovod controller {result['horovod_controller']}, world size {result['world_size']}"}
    finally:
        ex.close()


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
            hvd.grouped_allreduce_([p.grad for p in model.parameters() if p.grad is not None],
                                   op=hvd.Average, name="grads")
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
        return {"samples_per_sec": batch * args.steps / elapsed, "step_ms": 1e3 * elapsed / args.steps,
                "peak_mb": peak_mb(device), "loss_first": first, "loss_last": last.item(), "note": note}
    finally:
        close()


def run_one(args: argparse.Namespace) -> int:
    device = torch.device("cuda", 0) if args.device == "cuda" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
        torch.cuda.reset_peak_memory_stats(device)
    else:
        torch.set_num_threads(args.threads)
    row = run_trainer(args, device) if args.way == "trainer" else run_loop(args, device)
    with open(args.result, "w") as fh:
        json.dump({"model": args.model, "way": args.way, "device": str(device), **row}, fh)
    return 0


# ---------------------------------------------------------------- the whole check
def table(rows: list[dict], device: str) -> str:
    mem = "peak GPU MB" if device == "cuda" else "peak GPU MB (CPU run)"
    lines = [f"| model | way | samples/s | step ms | {mem} | loss first -> last | |",
             "|---|---|--:|--:|--:|---|---|"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['model']} | {r['way']} | - | - | - | - | FAILED: {r['error']} |")
            continue
        peak = f"{r['peak_mb']:.0f}" if r["peak_mb"] is not None else "-"
        lines.append(f"| {r['model']} | {r['way']} | {r['samples_per_sec']:.0f} | {r['step_ms']:.2f} | {peak} | "
                     f"{r['loss_first']:.3f} -> {r['loss_last']:.3f} | {r['note']} |")
    return "\n".join(lines)


def nccl_version() -> str:
    v = torch.cuda.nccl.version()  # (2, 29, 7); an int such as 22907 in older torch
    return ".".join(map(str, v)) if isinstance(v, tuple) else str(v)


def describe_machine(device: str) -> str:
    parts = [f"torch {torch.__version__}"]
    if device == "cuda":
        props = torch.cuda.get_device_properties(0)
        parts += [f"CUDA {torch.version.cuda}", f"{props.name} ({props.total_memory / 2**30:.0f} GiB, "
                  f"sm_{props.major}{props.minor})", f"NCCL {nccl_version()}"]
    else:
        parts.append("CPU only (dry run: checks the code path, the figures mean nothing for a GPU)")
    return ", ".join(parts)


def run_all(args: argparse.Namespace) -> int:
    models = [m for m in args.models.split(",") if m]
    unknown = [m for m in models if m not in MODELS]
    if unknown:
        print(f"gpucheck: unknown model(s) {', '.join(unknown)}; choose from: {', '.join(sorted(MODELS))}",
              file=sys.stderr)
        return 2
    ways = [w for w in args.ways.split(",") if w]
    if any(w not in WAYS for w in ways):
        print(f"gpucheck: --ways {args.ways!r}: choose from {', '.join(WAYS)}", file=sys.stderr)
        return 2
    if args.device == "cuda" and not torch.cuda.is_available():
        print(f"gpucheck: no GPU visible to torch {torch.__version__} (CUDA {torch.version.cuda}); "
              "for a CPU run of the same code: tools/gpu_check.sh --dry-run", file=sys.stderr)
        return 2
    log(describe_machine(args.device))
    rows, failed = [], 0
    with tempfile.TemporaryDirectory() as tmp:
        for model in models:
            for way in ways:
                result = os.path.join(tmp, f"{model}-{way}.json")
                cmd = [sys.executable, "-m", "allreduce_train.experiments", "gpucheck", "--one", way,
                       "--model", model, "--device", args.device, "--result", result,
                       "--steps", str(args.steps), "--warmup-steps", str(args.warmup_steps),
                       "--batch-size", str(args.batch_size), "--synthetic-samples", str(args.synthetic_samples),
                       "--threads", str(args.threads)]
                log(f"{model} / {way}: {args.warmup_steps} warm-up + {args.steps} timed steps, "
                    f"batch {batch_for(model, args.batch_size)}, on {args.device}")
                t0 = time.perf_counter()
                try:
                    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
                    rc, out = proc.returncode, proc.stdout + proc.stderr
                except subprocess.TimeoutExpired as e:
                    rc, out = "timeout", f"no result after {args.timeout} s; " + str(e.stdout or "")[-500:]
                if rc == 0 and os.path.exists(result):
                    with open(result) as fh:
                        row = json.load(fh)
                    log(f"  {row['samples_per_sec']:.0f} samples/s, {row['step_ms']:.2f} ms/step "
                        f"({time.perf_counter() - t0:.1f} s with start-up); {row['note']}")
                else:
                    failed += 1
                    tail = [ln for ln in out.strip().splitlines() if ln.strip()][-1:] or ["no output"]
                    row = {"model": model, "way": way, "error": f"exit {rc}: {tail[0][:200]}"}
                    log(f"  FAILED (exit {rc}); its output ends:\n" + "\n".join(out.strip().splitlines()[-15:]))
                rows.append(row)
    text = table(rows, args.device)
    print("\n" + text, flush=True)
    if args.out:
        with open(args.out, "w") as fh:
            json.dump({"machine": describe_machine(args.device), "steps": args.steps,
                       "warmup_steps": args.warmup_steps, "rows": rows}, fh, indent=1)
        log(f"rows written to {args.out}")
    return 1 if failed else 0


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help="cpu: the dry run (default: cuda)")
    p.add_argument("--models", default=DEFAULT_MODELS, help=f"comma-separated (default: {DEFAULT_MODELS})")
    p.add_argument("--ways", default=",".join(WAYS), help="comma-separated subset of: " + ", ".join(WAYS))
    p.add_argument("--steps", type=int, default=200, help="timed steps per run (default: 200)")
    p.add_argument("--warmup-steps", type=int, default=20, help="untimed steps first (default: 20)")
    p.add_argument("--batch-size", type=int, default=0, help="0: each model's own (default)")
    p.add_argument("--synthetic-samples", type=int, default=6400, help="the trainer's synthetic dataset size")
    p.add_argument("--threads", type=int, default=1, help="torch threads on the CPU (dry run)")
    p.add_argument("--lr", type=float, default=0.01, help="the bare loops' SGD learning rate")
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--timeout", type=float, default=300, help="seconds for one (model, way) run")
    p.add_argument("--out", default="", help="also write the rows as JSON here")
    p.add_argument("--one", choices=WAYS, dest="way", help=argparse.SUPPRESS)  # one run, in its own process
    p.add_argument("--model", default="lenet5", help=argparse.SUPPRESS)
    p.add_argument("--result", default="", help=argparse.SUPPRESS)


def main(args: argparse.Namespace) -> int:
    if args.steps < 1 or args.warmup_steps < 1:
        print("gpucheck: --steps and --warmup-steps must be >= 1", file=sys.stderr)
        return 2
    return run_one(args) if args.way else run_all(args)
