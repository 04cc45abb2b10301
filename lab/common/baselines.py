"""The bare baseline loops timed beside the trainer, in one place for every experiment that times them:
``bench``'s ranks (lab/bench/loops.py, under mpirun, on the CPU) and ``gpucheck``'s one-rank runs
(lab/gpucheck/one.py, on a GPU or in its CPU dry run).

* :func:`setup_horovod`: a bare Horovod loop, as in Horovod's ``examples/pytorch/pytorch_synthetic_benchmark.py``:
  ``hvd.DistributedOptimizer`` with Horovod's defaults, nothing else; or (``grouped``) one
  ``hvd.grouped_allreduce_`` of every gradient after backward.
* :func:`setup_ddp`: the same loop on ``torch.nn.parallel.DistributedDataParallel`` (gloo on the CPU, NCCL
  on a GPU), the obvious alternative to Horovod.
* :func:`time_steps`: the one timing loop both run: warm-up steps, then the timed ones.

Every loop trains on one fixed batch, the one the trainer's first step sees on this rank
(:func:`workload`, :mod:`.workloads`), so its speed compares equal work.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from allreduce_train.distributed.mpi import launched_as
from models import MODELS

from .workloads import first_batch, loss_of

# A step: (inputs, targets) -> the step's loss, detached; ``total`` sums a tensor over the ranks; ``close`` ends.
Step = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def launcher_rank() -> tuple[int, int]:
    """(rank, size) from Open MPI's environment; (0, 1) outside mpirun."""
    place = launched_as()
    return place.rank, place.size


def workload(
    model: str, batch_size: int, synthetic_samples: int, seed: int, rank: int, size: int, device: torch.device
) -> tuple[torch.nn.Module, torch.Tensor, torch.Tensor]:
    """A registered model with the trainer's initial parameters (its seed, then build) and this rank's share of
    the trainer's first batch, on ``device``."""
    torch.manual_seed(seed)
    net = MODELS[model].build().to(device)
    x, y = first_batch(model, batch_size, synthetic_samples, seed, rank, size)
    return net, x.to(device), y.to(device)


def scaled_optimizer(model: torch.nn.Module, lr: float, size: int, optimizer=None) -> torch.optim.Optimizer:
    """The loop's optimizer with every group's LR multiplied by the world size: ``optimizer`` (bench's: the
    recipe's, built by the trainer's own code, its LR for one worker), else SGD with momentum 0.9 at ``lr``."""
    opt = optimizer or torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    for group in opt.param_groups:
        group["lr"] *= size
    return opt


def setup_horovod(model: torch.nn.Module, lr: float, loss=None, grouped: bool = False, optimizer=None):
    """(step, total, close) of the bare Horovod loop; ``optimizer``: see :func:`scaled_optimizer`.

    ``grouped``: plain SGD and one ``hvd.grouped_allreduce_`` of every gradient after backward, instead of
    ``DistributedOptimizer``'s hooks: gpucheck's one-rank loop, where Horovod (0.28.1) registers the hooks only
    at size > 1, so ``DistributedOptimizer`` would send nothing; its rank starts from the seeded parameters
    and broadcasts nothing."""
    import horovod.torch as hvd

    hvd.init()  # communication: forms the process group (MPI_Init under mpirun; a world of one otherwise)
    opt = scaled_optimizer(model, lr, hvd.size(), optimizer)
    loss = loss or loss_of
    if grouped:

        def step(x, y):
            opt.zero_grad()
            out = loss(model, x, y)
            out.backward()
            # communication: every gradient, one fused Horovod allreduce (NCCL for CUDA tensors)
            grads = [p.grad for p in model.parameters() if p.grad is not None]
            hvd.grouped_allreduce_(grads, op=hvd.Average, name="grads")
            opt.step()
            return out.detach()

    else:
        # communication: gradients are allreduced from backward hooks (Horovod's defaults throughout)
        opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)  # communication
        hvd.broadcast_optimizer_state(opt, root_rank=0)  # communication

        def step(x, y):
            opt.zero_grad()
            out = loss(model, x, y)
            out.backward()
            opt.step()  # waits for the allreduces, then updates
            return out.detach()

    def total(t):
        return hvd.allreduce(t, op=hvd.Sum, name="total")  # communication

    return step, total, hvd.shutdown


def setup_ddp(
    model: torch.nn.Module, lr: float, port: int, loss=None, device: torch.device | None = None, optimizer=None
):
    """(step, total, close) of the DDP loop: gloo on the CPU, NCCL on a CUDA ``device``; rank 0 listens on
    ``port`` of 127.0.0.1; ``optimizer`` (over ``model``'s parameters, which DDP shares): see
    :func:`scaled_optimizer`."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    rank, size = launcher_rank()
    cuda = device is not None and device.type == "cuda"
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")  # one host: loopback only
    # communication: rank 0 listens on the port the orchestrator picked, the others connect
    dist.init_process_group(
        "nccl" if cuda else "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=size
    )
    # broadcasts rank 0's parameters; buckets allreduce in backward
    ddp = DistributedDataParallel(model, device_ids=[device.index] if cuda and device else None)
    opt = scaled_optimizer(model, lr, size, optimizer)

    loss = loss or loss_of

    def step(x, y):
        opt.zero_grad()
        out = loss(ddp, x, y)
        out.backward()  # the bucket allreduces run inside backward
        opt.step()
        return out.detach()

    def total(t):
        dist.all_reduce(t)  # communication: sum
        return t

    def close():
        # Both ranks finish before either tears gloo down: a rank whose peer has already closed its
        # sockets aborted now and then ("terminate called without an active exception", exit 134).
        if size > 1:
            dist.barrier()  # communication
        dist.destroy_process_group()

    return step, total, close


@dataclass
class Timed:
    """What :func:`time_steps` measured."""

    elapsed: float  # wall seconds of the timed steps (every step ends in a collective: all ranks agree)
    cpu_s: float  # this process's CPU seconds over them
    loss_first: float  # the first warm-up step's loss (nan without warm-up)
    loss_last: float  # the last timed step's (nan without timed steps)


def time_steps(step: Step, x, y, warmup_steps: int, steps: int, device: torch.device | None = None) -> Timed:
    """``warmup_steps`` untimed steps, then ``steps`` timed ones, on one fixed batch. On a GPU the clocks
    are read after the device finished its queued work (``torch.cuda.synchronize``)."""
    cuda = device is not None and device.type == "cuda"
    first = last = None
    for i in range(warmup_steps):
        loss = step(x, y)
        if i == 0:
            first = loss.item()
    if cuda:
        torch.cuda.synchronize()
    t0, c0 = time.perf_counter(), time.process_time()
    for _ in range(steps):
        last = step(x, y)
    if cuda:
        torch.cuda.synchronize()
    elapsed, cpu_s = time.perf_counter() - t0, time.process_time() - c0
    return Timed(elapsed, cpu_s, math.nan if first is None else first, math.nan if last is None else float(last.item()))
