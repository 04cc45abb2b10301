"""A user's script with its own training loop, on the exchange of allreduce_train (Horovod's recipe).

    python -m launch -np 2 --script examples/own_loop.py -- --allreduce-engine mpi --steps 50

The arguments after ``--`` are the trainer's exchange flags (``--strategy ps``, ``--compression
fp16``, ...) plus ``--steps``, ``--batch-size``, ``--lr`` and ``--seed``, read by
:func:`allreduce_train.init`. Every rank runs this file.
"""

from __future__ import annotations

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
    opt = comm.distributed_optimizer(model, opt)  # communication: rank 0's parameters to all; averaged gradients

    steps = cfg.train.steps or 100
    step, epoch = 0, 0
    while step < steps:
        for inputs, targets in data.batches(epoch):
            opt.zero_grad()
            loss = F.mse_loss(model(inputs), targets)
            loss.backward()  # the gradients start travelling from their hooks
            opt.step()  # waits for the averaged gradients, then updates
            step += 1
            if step % 20 == 0 or step == steps:
                mean = comm.mean(loss.detach().reshape(1)).item()  # communication: the global figure
                if comm.is_main:
                    print(f"step {step}: loss {mean:.4f} (mean over {comm.num_workers} workers)", flush=True)
            if step == steps:
                break
        epoch += 1
    if cfg.run.dump_params:  # for the tests: every rank's parameters
        torch.save(model.state_dict(), cfg.run.dump_params.replace("{rank}", str(comm.rank)))
    comm.close()


if __name__ == "__main__":
    main(sys.argv[1:])
