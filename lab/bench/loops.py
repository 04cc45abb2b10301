"""The loops that ``bench`` times next to the trainer, run on every rank (``bench-rank``).

* ``horovod``: a bare Horovod loop, as in Horovod's ``examples/pytorch/pytorch_synthetic_benchmark.py``:
  one fixed batch, ``hvd.DistributedOptimizer`` with Horovod's defaults, nothing else.
* ``ddp``: the same loop on ``torch.nn.parallel.DistributedDataParallel`` over gloo, the
  obvious alternative to Horovod.
* ``trainer``: only for ``--dump-grads``: one step of the project's own :class:`Trainer` through
  its gradient exchange, so the gradient check covers the code the benchmark times (the
  benchmark itself times the real ``train`` command).

The two bare loops and the timing loop are :mod:`lab.common.baselines`, which ``gpucheck`` runs too; this
module is bench's side: its flags, a user's model, the gradient dump and rank 0's result file.

Every loop trains on the same batch the trainer's first step sees on this rank (same seed,
same synthetic data, same shard), from the same initial parameters, so ``--dump-grads`` can
check that all of them compute the same averaged gradient: the speed comparison is between
equal work. Language models (``ptb-lstm-*``) run the same way on the first window of tokens;
the bare loops restart the hidden state at zero every step, the trainer carries it (detached),
which costs the same. A user's model (``--model MODULE:CALLABLE``, ``--task``, their ``--dataset``) runs on the
trainer's own first batch and loss for it (lab/common/usermodel.py), so the loops still do the trainer's work.
The recipe flags (lab/common/recipe.py) give the loops the trainer's optimizer, built by the trainer's own
code (a task's own included), and its autocast around the forward pass; the loops keep a constant LR and do
not clip (neither costs measurably per step).
"""

from __future__ import annotations

import argparse
import json

import torch

from ..common import recipe, usermodel
from ..common.baselines import launcher_rank, setup_ddp, setup_horovod, time_steps, workload

IMPLS = ("horovod", "ddp", "trainer")


def grads_of(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


def trainer_grads(args: argparse.Namespace) -> tuple[dict[str, torch.Tensor], int]:
    """One step of the real trainer through its exchange; the averaged gradients stay in ``.grad``."""
    from allreduce_train.config import (
        Config,
        DataConfig,
        ExchangeConfig,
        HorovodConfig,
        ModelConfig,
        RunConfig,
        TrainConfig,
    )
    from allreduce_train.distributed import create_exchange
    from allreduce_train.trainer import Trainer

    cfg = Config(
        model=ModelConfig(args.model),
        data=DataConfig(dataset="synthetic", batch_size=args.batch_size, synthetic_samples=args.synthetic_samples),
        exchange=ExchangeConfig(allreduce_engine=args.allreduce_engine),
        horovod=HorovodConfig(backend=args.horovod_backend),
        train=TrainConfig(seed=args.seed, threads=args.threads, device="cpu", flush_denormal=args.flush_denormal),
        run=RunConfig(tensorboard=False, progress=False),
    )
    ex = create_exchange(cfg)
    try:
        trainer = Trainer(cfg, ex, run_dir="")
        s = trainer.build()
        opt = trainer.schedule.prepare(s.model, s.optimizer)
        x, y = next(s.batches.batches(0))
        trainer.train_step(s.model, opt, x, y, k=1)  # the optimizer step leaves the averaged .grad in place
        return grads_of(s.model), ex.rank
    finally:
        ex.close()


def run_rank(args: argparse.Namespace) -> int:
    torch.set_num_threads(args.threads)
    if args.flush_denormal:
        torch.set_flush_denormal(True)  # as the trainer's --flush-denormal
    rank, size = launcher_rank()
    if args.impl == "trainer":
        grads, rank = trainer_grads(args)
        torch.save(grads, args.dump_grads.replace("{rank}", str(rank)))
        return 0

    w = usermodel.from_args(
        args.model, task=args.task, dataset=args.dataset, model_args=args.model_arg, dataset_args=args.dataset_arg
    )
    loss, task = None, None
    if w.own or w.dataset not in ("", "synthetic"):
        # a user's model or data: the trainer's own task gives the batch, the model and the loss
        task, x, y = usermodel.first_batch(w, args.batch_size, rank, size, args.seed, args.synthetic_samples)
        torch.manual_seed(args.seed)  # as the trainer: seed, then build
        model = task.build_model()
        loss = task.loss
    else:  # the trainer's seed: identical initial parameters
        model, x, y = workload(
            args.model, args.batch_size, args.synthetic_samples, args.seed, rank, size, torch.device("cpu")
        )
    optimizer, loss, precision = with_recipe(w, args, model, loss, task)
    if args.impl == "horovod":
        step, total, close = setup_horovod(model, 0.0, loss, optimizer=optimizer)
    else:
        step, total, close = setup_ddp(model, 0.0, args.port, loss, optimizer=optimizer)
    try:
        if args.dump_grads:
            step(x, y)
            torch.save(grads_of(model), args.dump_grads.replace("{rank}", str(rank)))
            return 0
        timed = time_steps(step, x, y, args.warmup, args.steps)
        elapsed = timed.elapsed  # every step ends in a collective: all ranks agree
        cpu_s = total(torch.tensor([timed.cpu_s], dtype=torch.float64))[0].item()
        if rank == 0 and args.result:
            with open(args.result, "w") as fh:
                json.dump(
                    {
                        "samples_per_sec": size * args.batch_size * args.steps / elapsed,
                        "step_ms": 1e3 * elapsed / args.steps,
                        "cpu_ms_per_step": 1e3 * cpu_s / args.steps,
                        "world_size": size,
                        # what ran, in the trainer's metrics.json words (lab/common/recipe.py reads both)
                        "optimizer": type(optimizer).__name__,
                        "lr_schedule": "constant",
                        "precision": precision,
                    },
                    fh,
                )
        return 0
    finally:
        close()


def with_recipe(w: usermodel.Workload, args: argparse.Namespace, model: torch.nn.Module, loss, task):
    """(optimizer, loss, precision) of the recipe flags: the trainer's optimizer over ``model`` (``task``'s own
    when it has one), its LR for one worker, and the loss under the trainer's autocast (``loss`` None: the
    registered models' :func:`~lab.common.workloads.loss_of`)."""
    from allreduce_train.optim import build_optimizer
    from allreduce_train.precision import Precision

    from ..common.workloads import loss_of

    cfg = usermodel.config(w, recipe.argv(args))
    optimizer = build_optimizer(cfg.optim, model, task)
    precision = Precision(cfg.train.precision, torch.device("cpu"))
    if precision.dtype is None:
        return optimizer, loss, cfg.train.precision
    plain = loss or loss_of

    def autocast_loss(m, x, y):
        with precision.forward_context():  # as the trainer: forward and loss under autocast, backward outside
            return plain(m, x, y)

    return optimizer, autocast_loss, cfg.train.precision


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--impl", choices=IMPLS, required=True)
    p.add_argument("--model", default="lenet5", help="a registered model or your own MODULE:CALLABLE")
    p.add_argument("--task", default="", help="your own task, MODULE:CALLABLE")
    p.add_argument("--model-arg", action="append", default=[], help="KEY=VALUE for --model's/--task's callable")
    p.add_argument("--dataset", default="synthetic", help="synthetic, or the trainer's --dataset for your own model")
    p.add_argument("--dataset-arg", action="append", default=[], help="KEY=VALUE for --dataset's callable")
    recipe.add_trainer_flag(p, "batch_size", "per rank")
    p.add_argument("--steps", type=int, default=400, help="timed steps")
    # bench's own name: --warmup-steps is the recipe's LR warm-up
    p.add_argument("--warmup", type=int, default=50, help="untimed steps first")
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads per rank")
    p.add_argument("--flush-denormal", action="store_true", help="treat denormal floats as zero, as the trainer's flag")
    # the trainer's own flags, with its defaults (allreduce_train/config.py)
    recipe.add_trainer_flag(p, "seed")
    recipe.add_trainer_flag(p, "synthetic_samples")
    recipe.add_trainer_flag(p, "horovod_backend", "the trainer's (--impl trainer)")
    recipe.add_trainer_flag(p, "allreduce_engine", "the trainer's (--impl trainer)")
    p.add_argument("--port", type=int, default=0, help="rendezvous port on 127.0.0.1 (ddp)")
    p.add_argument("--result", default="", help="rank 0 writes the throughput here as JSON")
    p.add_argument(
        "--dump-grads",
        default="",
        help="take one step, save the averaged gradients to this file ({rank} replaced) and exit",
    )
    recipe.add_arguments(p)  # --lr (for one worker; scaled by the world size), --optimizer, --precision, ...
