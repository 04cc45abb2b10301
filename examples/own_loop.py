"""A user's script with its own training loop, on the exchange of allreduce_train (Horovod's recipe).

    python -m launch -np 2 --script examples/own_loop.py -- --allreduce-engine mpi --steps 50

The arguments after ``--`` are the trainer's exchange flags (``--strategy ps``, ``--compression
fp16``, ...) plus ``--steps``, ``--batch-size``, ``--lr``, ``--seed``, ``--run-dir``, ``--name`` and
``--resume auto``, read by :func:`allreduce_train.init`. Every rank runs this file.

Preemption (SIGTERM or SIGUSR1 to the launcher, docs/faults.md): every worker stops after the same
step, rank 0 writes RUN_DIR/NAME/checkpoint.pt, every rank exits 75; the same command with
``--resume auto`` continues from it.
"""

from __future__ import annotations

import os
import sys

import torch
import torch.nn.functional as F
from torch.utils.data import TensorDataset

import allreduce_train


def main(argv: list[str]) -> None:
    comm = allreduce_train.init(argv)  # the process group; a dedicated PS's servers serve inside and never return
    cfg = comm.config  # the parsed flags: cfg.train.steps, cfg.data.batch_size, cfg.optim.lr, ...
    torch.manual_seed(cfg.train.seed)

    # a small regression problem, the same on every rank; each worker reads its own shard of it
    x = torch.randn(4096, 16)
    y = x @ torch.randn(16, 1) + 0.1 * torch.randn(4096, 1)
    data = comm.shard(TensorDataset(x, y), batch_size=cfg.data.batch_size, seed=cfg.train.seed)

    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    # the LR scaled by the worker count (Goyal et al. 2017), as the trainer does
    opt = torch.optim.SGD(model.parameters(), lr=cfg.optim.lr * comm.num_workers, momentum=0.9)
    checkpoint = os.path.join(cfg.run.run_dir, cfg.run.name or "own_loop", "checkpoint.pt")
    step = 0
    if cfg.run.resume == "auto" and comm.is_main and os.path.exists(checkpoint):
        saved = torch.load(checkpoint, weights_only=True)
        model.load_state_dict(saved["model"])
        opt.load_state_dict(saved["optimizer"])
        step = saved["step"]
    step = comm.broadcast_object(step)  # communication: where rank 0's checkpoint left off
    opt = comm.distributed_optimizer(model, opt)  # communication: rank 0's parameters to all; averaged gradients

    steps = cfg.train.steps or 100
    epoch, done = divmod(step, data.steps_per_epoch)  # a resumed run starts mid-epoch where it stopped
    while step < steps:
        for inputs, targets in data.batches(epoch, start_step=done):
            opt.zero_grad()
            loss = F.mse_loss(model(inputs), targets)
            loss.backward()  # the gradients start travelling from their hooks
            opt.step()  # waits for the averaged gradients, then updates
            step += 1
            if step % 20 == 0 or step == steps:
                mean = comm.mean(loss.detach().reshape(1)).item()  # communication: the global figure
                if comm.is_main:
                    print(f"step {step}: loss {mean:.4f} (mean over {comm.num_workers} workers)", flush=True)
            if comm.stop_requested():  # communication: a stop signal reached a worker (preemption)
                # on every rank: under --strategy sharded gathering the whole state is a collective
                comm.whole_parameters(model)  # stage 3: each worker holds only its shard between steps
                state = {"model": model.state_dict(), "optimizer": opt.state_dict(), "step": step}
                if comm.is_main:  # the whole state, written once
                    os.makedirs(os.path.dirname(checkpoint), exist_ok=True)
                    torch.save(state, checkpoint + ".tmp")
                    os.replace(checkpoint + ".tmp", checkpoint)  # atomic: the last good one is never half-written
                dump(cfg, comm, model)
                comm.exit_preempted(step)  # one line from rank 0, exit 75 on every rank
            if step == steps:
                break
        epoch, done = epoch + 1, 0
    dump(cfg, comm, model)
    comm.close()


def dump(cfg, comm, model: torch.nn.Module) -> None:
    comm.whole_parameters(model)  # communication under --shard-stage 3 (every rank calls dump)
    if cfg.run.dump_params:  # for the tests: every rank's parameters
        torch.save(model.state_dict(), cfg.run.dump_params.replace("{rank}", str(comm.rank)))


if __name__ == "__main__":
    main(sys.argv[1:])
