"""Where a step's time goes: the trainer against the bare Horovod loop, part by part, in microseconds.

    python -m launch -np 2 --module lab.bench.stepcost -- --impl trainer --model lenet5 --out runs/stepcost
    python -m launch -np 2 --module lab.bench.stepcost -- --impl horovod --model lenet5 --out runs/stepcost

Every rank runs the real thing -- the trainer's ``train`` command with the flags ``bench`` gives it,
or the bare Horovod loop of :mod:`lab.common.baselines` -- with a timer wrapped around each part a step calls (the
batch, the forward pass and loss, backward, the exchange's wait, the vote, the optimizer step,
the watchdog's notes, the step meter, the progress bar, the log steps' figures and TensorBoard).
After the warm-up every call is timed; what no wrapper covers is the loop's own residue. Each
rank writes ``<out>/stepcost-<impl>-<model>-rank<R>.json``: per part the microseconds per step,
the calls per step, and the wrapper's own cost per call (measured on a no-op), which the figures
already exclude. ``python -m lab.bench.stepcost --table <out>`` prints them side by side.

Each part has two figures: wall clock (including any wait for the peer inside it) and this thread's
CPU time, which load from other processes changes far less. A wrapper costs about a microsecond per
call; a part called once per step is measured to that precision (:mod:`lab.common.stepparts`).
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
from ..common.stepparts import Meter, instrument_trainer, load, patch, result, table, thread_cpu, wall_clock


def trainer_argv(args: argparse.Namespace, out: str) -> list[str]:
    """The ``train`` flags that ``bench`` runs the trainer with (:func:`.main.job_args`)."""
    from .main import BenchSpec, job_args

    spec = BenchSpec(
        models=[args.model], steps=args.steps, warmup=args.warmup, batch_size=args.batch_size, threads=args.threads
    )
    _, argv = job_args("trainer", args.model, spec, "", os.path.join(out, "jobs"), f"stepcost-{args.model}")
    return ["train", *argv, *args.trainer_args]


def run_trainer(args: argparse.Namespace, meter: Meter) -> int:
    from allreduce_train.cli import main as train_main
    from allreduce_train.distributed.base import GradientExchange

    from .main import BenchSpec

    spec = BenchSpec(steps=args.steps, warmup=args.warmup)
    if args.no_vote:  # the ablation: every engine's vote becomes the base class's, then kept on this rank
        from allreduce_train.distributed import horovod, local, ring
        from allreduce_train.distributed.ps import exchange

        for cls in (horovod.HorovodAllreduce, ring.MPIRingAllreduce, exchange.ParameterServer, local.NoExchange):
            # the ablation replaces the engines' vote methods on purpose (in this process only)
            cls.start_vote = GradientExchange.start_vote  # type: ignore[method-assign]
            cls.end_vote = lambda self: self._vote  # type: ignore[method-assign]
    instrument_trainer(meter, spec.warmup_for(args.model), spec.steps_for(args.model))
    rc = train_main(trainer_argv(args, args.out))
    return rc


def run_horovod(args: argparse.Namespace, meter: Meter) -> int:
    """The bare Horovod loop of :mod:`lab.common.baselines`, written out here to put the same wrappers around
    its parts (its optimizer's methods are patched, which the shared loop keeps to itself)."""
    import torch

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
    patch(meter, torch.Tensor, "backward", "backward")
    patch(meter, opt, "zero_grad", "zero_grad")
    patch(meter, opt, "synchronize", "exchange wait (synchronize)")
    loss_fn = meter.wrap("forward+loss", loss_of)
    step_fn = meter.wrap("optimizer step (apply)", opt.step)

    def one_step():
        opt.zero_grad()
        loss_fn(model, x, y).backward()
        step_fn()

    for _ in range(spec.warmup_for(args.model)):
        one_step()
    n = spec.steps_for(args.model)
    meter.on, meter.started, meter.cpu_started = True, wall_clock(), thread_cpu()
    for _ in range(n):
        one_step()
    meter.stopped, meter.cpu_stopped, meter.on, meter.steps = wall_clock(), thread_cpu(), False, n
    hvd.shutdown()
    return 0


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
    meter = Meter()
    rc = (run_trainer if args.impl == "trainer" else run_horovod)(args, meter)
    rank, size = launcher_rank()
    if getattr(meter, "steps", 0):
        impl = args.impl + (f"-{args.tag}" if args.tag else "")
        path = os.path.join(args.out, f"stepcost-{impl}-{args.model}-rank{rank}.json")
        with open(path, "w") as fh:
            json.dump(result(meter, impl, args.model, rank, size), fh, indent=1)
    return rc


if __name__ == "__main__":
    sys.exit(main())
