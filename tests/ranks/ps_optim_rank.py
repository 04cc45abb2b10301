"""A user's own loop (:func:`allreduce_train.init`) with any torch optimizer and a torch LR scheduler:
``python -m ps_optim_rank [--optimizer adamw|own] [--stop-at K] [--state FILE] TRAINER_FLAGS`` under mpirun.

The model has a tensor of 4,800 elements (split across servers with a small ``--ps-split-bytes``),
a LayerNorm and biases; ``adamw`` is torch's AdamW with two groups (weight decay 0.1 on the
matrices, none on biases and norm weights), ``own`` an Optimizer subclass of this file
(:class:`SignMomentum`: per-element state, a tensor and a plain int). ``StepLR`` halves the LR every
4 steps on the optimizer :meth:`Communicator.distributed_optimizer` returns. Every worker dumps its parameters
(``--dump-params``, ``{rank}``); the main worker saves ``{"optimizer": state_dict(), "scheduler":
..., "model": ...}`` to ``--state`` after ``--stop-at`` steps (default: ``--steps``), and a run
given ``--resume FILE`` loads such a file into a fresh model and optimizer before the exchange
starts (which sends the optimizer's state to the servers), and continues from its step.

Also the trainer's ``--optimizer ps_optim_rank:needy``: an optimizer the parameter server refuses.
"""

from __future__ import annotations

import argparse
import sys

import torch
import torch.nn.functional as F
from torch.utils.data import TensorDataset

import allreduce_train


class SignMomentum(torch.optim.Optimizer):
    """The sign of a momentum (signSGD with momentum, Bernstein et al. 2018): not one of torch's."""

    def __init__(self, params, lr: float = 1e-3, beta: float = 0.9) -> None:
        super().__init__(params, {"lr": lr, "beta": beta})

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                m = state.setdefault("m", torch.zeros_like(p))
                m.mul_(group["beta"]).add_(p.grad, alpha=1 - group["beta"])
                state["updates"] = state.get("updates", 0) + 1
                p.add_(m.sign(), alpha=-group["lr"])


class Needy(torch.optim.SGD):
    """An optimizer whose constructor needs an argument its parameter groups do not hold."""

    def __init__(self, params, lr: float, special: int) -> None:
        super().__init__(params, lr=lr)
        self.special = special


def needy(groups):
    """``--optimizer ps_optim_rank:needy``: refused on the PS (the servers build the class from its groups)."""
    return Needy(groups, lr=0.1, special=3)


def build(kind: str, lr: float):
    model = torch.nn.Sequential(
        torch.nn.Linear(16, 300), torch.nn.LayerNorm(300), torch.nn.ReLU(), torch.nn.Linear(300, 3)
    )
    if kind == "own":
        return model, SignMomentum(model.parameters(), lr=lr / 10, beta=0.8)
    matrices = [p for p in model.parameters() if p.dim() > 1]
    others = [p for p in model.parameters() if p.dim() <= 1]
    groups = [{"params": matrices, "weight_decay": 0.1}, {"params": others, "weight_decay": 0.0}]
    return model, torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.99))


def main(argv: list[str]) -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--optimizer", default="adamw", choices=["adamw", "own"])
    p.add_argument("--stop-at", type=int, default=0)
    p.add_argument("--state", default="")
    p.add_argument("--resume", default="")
    mine, rest = p.parse_known_args(argv)
    comm = allreduce_train.init(rest)
    cfg = comm.config
    torch.manual_seed(cfg.train.seed)
    x = torch.randn(2048, 16)
    y = (x[:, :3] * x[:, 3:6]).tanh() + 0.05 * torch.randn(2048, 3)
    data = comm.shard(TensorDataset(x, y), batch_size=cfg.data.batch_size, seed=cfg.train.seed)
    model, opt = build(mine.optimizer, cfg.optim.lr)
    saved = None
    if mine.resume:  # every worker reads it (one host; a broadcast before the servers start would reach them)
        saved = torch.load(mine.resume, weights_only=True)
        model.load_state_dict(saved["model"])
        opt.load_state_dict(saved["optimizer"])  # before the exchange starts: it sends the state to the servers
    dist = comm.distributed_optimizer(model, opt)
    sched = torch.optim.lr_scheduler.StepLR(dist, step_size=4, gamma=0.5)
    if saved:
        sched.load_state_dict(saved["scheduler"])
    step = skip = sched.last_epoch
    stop = mine.stop_at or cfg.train.steps
    epoch = 0
    while step < stop:
        for inputs, targets in data.batches(epoch):
            if skip:  # resumed: the batches the first run consumed
                skip -= 1
                continue
            dist.zero_grad()
            F.mse_loss(model(inputs), targets).backward()
            dist.step()
            sched.step()
            step += 1
            if step == stop:
                break
        epoch += 1
    if comm.is_main:
        cls = SignMomentum if mine.optimizer == "own" else torch.optim.AdamW
        print(f"lr {dist.param_groups[0]['lr']:g}, a {cls.__name__}: {isinstance(dist, cls)}", flush=True)
        if mine.state:  # communication: every server's optimizer state
            torch.save(
                {"model": model.state_dict(), "optimizer": dist.state_dict(), "scheduler": sched.state_dict()},
                mine.state,
            )
    if cfg.run.dump_params:
        torch.save(model.state_dict(), cfg.run.dump_params.replace("{rank}", str(comm.rank)))
    comm.close()


if __name__ == "__main__":
    main(sys.argv[1:])
