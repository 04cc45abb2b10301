"""Where a step's time goes: the trainer against the bare Horovod loop, part by part, in microseconds.

    python -m launch -np 2 --module lab.bench.stepcost -- --impl trainer --model lenet5 --out runs/stepcost
    python -m launch -np 2 --module lab.bench.stepcost -- --impl horovod --model lenet5 --out runs/stepcost

Every rank runs the real thing -- the trainer's ``train`` command with the flags ``bench`` gives it (any
engine: add its flags after ``--``, e.g. ``-- --allreduce-engine torch``), or the bare Horovod loop of
:mod:`lab.common.baselines` -- and traces the timed steps after the warm-up: the trainer with its own
``--trace-steps`` (each phase it marks: the batch, the forward pass and loss, backward, the exchange's wait,
the update, evaluation, checkpoint), the bare loop with the same tracer around the same phases. What no
phase covers is the step's residue. Each rank writes ``<out>/stepcost-<impl>-<model>-rank<R>.json``: per
phase the microseconds per step and the spans per step, and the tracer's own cost per mark, which the
residue already excludes. ``python -m lab.bench.stepcost --table <out>`` prints them side by side; the trace
itself lies beside them (``<out>/jobs/stepcost-<model>/trace/``, or ``<out>/trace-horovod-<model>-rank<R>.json``).

Each part has two figures: wall clock (including any wait for the peer inside it) and this thread's
CPU time, which load from other processes changes far less (:mod:`lab.common.stepparts`).
``--no-vote`` (trainer only, a measurement, not a mode) keeps the per-step stop/loss vote on each
rank instead of summing it over the ranks: paired with a run without it, the vote's whole cost,
the background thread's included.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from ..common.baselines import launcher_rank
from ..common.stepparts import load, read, table, trace_flags


def trainer_argv(args: argparse.Namespace, out: str) -> list[str]:
    """The ``train`` flags that ``bench`` runs the trainer with (:func:`.main.job_args`), traced."""
    from .main import BenchSpec, job_args

    spec = BenchSpec(
        models=[args.model], steps=args.steps, warmup=args.warmup, batch_size=args.batch_size, threads=args.threads
    )
    _, argv = job_args("trainer", args.model, spec, "", run_dir(out), f"stepcost-{args.model}")
    warmup, steps = spec.warmup_for(args.model), spec.steps_for(args.model)
    # one step more than bench runs: its evaluation and checkpoint at the end fall outside the traced steps
    longer = ["--steps", str(warmup + steps + 1)]
    return ["train", *argv, *longer, *trace_flags(warmup, steps), *args.trainer_args]


def run_dir(out: str) -> str:
    return os.path.join(out, "jobs")


def run_trainer(args: argparse.Namespace) -> tuple[int, str]:
    """The trainer's run, and the trace file this rank wrote."""
    from allreduce_train.cli import main as train_main
    from allreduce_train.distributed.base import GradientExchange

    if args.no_vote:  # the ablation: every engine's vote becomes the base class's, then kept on this rank
        from allreduce_train.distributed import c10d, horovod, local, ring
        from allreduce_train.distributed.ps import exchange

        engines = (horovod.HorovodAllreduce, ring.MPIRingAllreduce, c10d.TorchDistributed, exchange.ParameterServer)
        for cls in (*engines, local.NoExchange):
            # the ablation replaces the engines' vote methods on purpose (in this process only)
            cls.start_vote = GradientExchange.start_vote  # type: ignore[method-assign]
            cls.end_vote = lambda self: self._vote  # type: ignore[method-assign]
    rc = train_main(trainer_argv(args, args.out))
    rank, _ = launcher_rank()
    return rc, os.path.join(run_dir(args.out), f"stepcost-{args.model}", "trace", f"rank{rank}.json")


def run_horovod(args: argparse.Namespace) -> tuple[int, str]:
    """The bare Horovod loop of :mod:`lab.common.baselines`, written out here to trace the same phases as the
    trainer's (the exchange's wait apart from the optimizer's step: Horovod's synchronize, then step without it)."""
    import torch

    from allreduce_train.trace import Tracer
    from models import MODELS

    from ..common.workloads import first_batch, loss_of
    from .main import BenchSpec

    spec = BenchSpec(models=[args.model], steps=args.steps, warmup=args.warmup, batch_size=args.batch_size)
    torch.set_num_threads(args.threads)
    torch.set_flush_denormal(True)  # as bench runs every implementation (main.job_args)
    rank, size = launcher_rank()
    torch.manual_seed(42)
    model = MODELS[args.model].build()
    x, y = first_batch(args.model, spec.batch_for(args.model), spec.synthetic_samples, 42, rank, size)
    import horovod.torch as hvd

    hvd.init()  # communication
    opt = torch.optim.SGD(model.parameters(), lr=0.01 * hvd.size(), momentum=0.9)
    opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())  # communication: hooks
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)  # communication
    warmup, n = spec.warmup_for(args.model), spec.steps_for(args.model)
    path = os.path.join(args.out, f"trace-horovod-{args.model}-rank{rank}.json")
    tracer = Tracer(rank, warmup, warmup + n, path)
    for step in range(warmup + n):
        tracer.step(step)  # the data phase: zero_grad (the batch is the same every step)
        opt.zero_grad()
        tracer.mark("forward")
        loss = loss_of(model, x, y)
        tracer.mark("backward")
        loss.backward()  # communication: each gradient's allreduce starts from its hook
        tracer.mark("wait")
        opt.synchronize()  # communication: wait for them
        tracer.mark("update")
        with opt.skip_synchronize():
            opt.step()
    tracer.close()
    hvd.shutdown()
    return 0, path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m lab.bench.stepcost", description=__doc__.split("\n\n")[0])
    p.add_argument("--impl", choices=("trainer", "horovod"), default="trainer")
    p.add_argument("--model", default="lenet5")
    p.add_argument("--steps", type=int, default=0, help="timed steps (default: bench's per model)")
    p.add_argument("--warmup", type=int, default=-1, help="untimed steps first (default: bench's per model)")
    p.add_argument("--batch-size", type=int, default=0, help="per rank (default: the model's own)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", default="runs/stepcost")
    p.add_argument(
        "--no-vote",
        action="store_true",
        help="trainer: keep the per-step vote on each rank (a measurement of its cost, not a mode)",
    )
    p.add_argument("--tag", default="", help="added to the result files' impl name (e.g. novote)")
    p.add_argument("--table", metavar="DIR", help="print the table of the results in DIR and exit")
    p.add_argument("trainer_args", nargs="*", help="extra `train` flags after --")
    args = p.parse_args(argv)
    if args.table:
        found = load(args.table)
        if not found:
            print(f"stepcost: no stepcost-*.json in {args.table}", file=sys.stderr)
            return 2
        print(table(found))
        return 0
    os.makedirs(args.out, exist_ok=True)
    rc, traced = (run_trainer if args.impl == "trainer" else run_horovod)(args)
    rank, size = launcher_rank()
    if rc == 0:
        impl = args.impl + (f"-{args.tag}" if args.tag else "")
        path = os.path.join(args.out, f"stepcost-{impl}-{args.model}-rank{rank}.json")
        with open(path, "w") as fh:
            json.dump(read(traced, impl, args.model, rank, size), fh, indent=1)
    return rc


if __name__ == "__main__":
    sys.exit(main())
