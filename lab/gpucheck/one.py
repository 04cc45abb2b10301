"""One (model, way) of the GPU check at one rank, in its own process (``--one WAY``): the trainer, or
a bare loop of :mod:`lab.common.baselines`; its row goes to ``--result`` as JSON."""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from typing import Any

import torch

from ..common.baselines import setup_ddp, setup_horovod, time_steps, workload
from ..common.jobs import free_port
from ..common.stepparts import result, trace_flags
from .ways import PRECISION, batch_for


def peak_mb(device: torch.device) -> float | None:
    return torch.cuda.max_memory_allocated(device) / 2**20 if device.type == "cuda" else None


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
            "--precision",
            PRECISION.get(args.way, "32"),
            # --parts (a run of its own): the trainer's trace of the timed steps (lab.common.stepparts reads it),
            # and a step more, whose evaluation at the end lies outside them
            *([*trace_flags(args.warmup_steps, args.steps), "--steps", str(total + 1)] if args.parts else []),
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
        note = (
            f"Horovod controller {result['horovod_controller']}, world size {result['world_size']}, "
            f"precision {result['precision']}"
            + (f" (loss scale {result['loss_scale']:g} at the end)" if "loss_scale" in result else "")
        )
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
            "precision": result["precision"],
            "note": note,
            **({"trace": trainer.trace.chrome()} if args.parts else {}),  # type: ignore[attr-defined]
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
    """The bare loop of ``args.way`` in a world of one: Horovod (one grouped allreduce of every gradient a
    step) or DDP (process group nccl on a GPU, gloo on the CPU), as ``bench`` times them."""
    batch = batch_for(args.model, args.batch_size)
    model, x, y = workload(args.model, batch, args.synthetic_samples, args.seed, 0, 1, device)
    if args.way == "horovod":
        import horovod.torch as hvd

        step, _, close = setup_horovod(model, args.lr, grouped=True)
        note = f"NCCL built: {bool(hvd.nccl_built())}, controller {'mpi' if hvd.mpi_enabled() else 'gloo'}"
    else:
        # communication: a process group of one on the loopback interface
        step, _, close = setup_ddp(model, args.lr, free_port(), device=device)
        note = f"process group {'nccl' if device.type == 'cuda' else 'gloo'}"
    try:
        timed = time_steps(step, x, y, args.warmup_steps, args.steps, device)
        return {
            "samples_per_sec": x.shape[0] * args.steps / timed.elapsed,
            "step_ms": 1e3 * timed.elapsed / args.steps,
            "peak_mb": peak_mb(device),
            "loss_first": timed.loss_first,
            "loss_last": timed.loss_last,
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
    row = run_trainer(args, device) if args.way.startswith("trainer") else run_loop(args, device)
    if "trace" in row:  # --parts: where the trainer's step goes, from its trace
        row["parts"] = result(row.pop("trace"), args.way, args.model, 0, 1)
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
