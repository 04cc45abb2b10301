"""The recipe in one process: the optimizer the flags build, every schedule's LR at given steps, the loss
scaler's rules, and the refusals (allreduce_train/optim.py, precision.py)."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

from allreduce_train.config import OptimConfig
from allreduce_train.errors import ConfigError
from allreduce_train.optim import LRSchedule, build_optimizer, param_groups
from allreduce_train.precision import LossScaler, Precision
from models import MODELS


def schedule(kind: str, workers: int = 1, total: int = 100, **kw) -> LRSchedule:
    return LRSchedule.make(OptimConfig(lr_schedule=kind, **kw), workers, total, steps_per_epoch=10)


def test_cosine_rises_from_zero_over_the_warm_up_then_falls_to_the_floor_at_the_last_step():
    s = schedule("cosine", workers=2, total=110, lr=0.1, warmup_steps=10, min_lr=0.01)
    peak = 0.2  # 2 workers x lr 0.1 (--scale-lr)
    assert s.lr(0, 0.1) == pytest.approx(peak / 10)  # the first update already moves
    assert s.lr(9, 0.1) == pytest.approx(peak)
    assert s.lr(10, 0.1) == pytest.approx(peak)
    assert s.lr(60, 0.1) == pytest.approx(0.02 + (peak - 0.02) * 0.5)  # halfway: the mean of peak and floor
    assert s.lr(110, 0.1) == pytest.approx(0.02)  # the floor, scaled like --lr
    assert s.lr(500, 0.1) == pytest.approx(0.02)  # past the end (a longer resumed run) it stays there


def test_linear_decays_in_a_straight_line_and_constant_stays():
    lin = schedule("linear", total=100, lr=1.0, warmup_steps=0, min_lr=0.0)
    assert [lin.lr(s, 1.0) for s in (0, 25, 50, 100)] == pytest.approx([1.0, 0.75, 0.5, 0.0])
    const = schedule("constant", total=100, lr=1.0, warmup_steps=4)
    assert [const.lr(s, 1.0) for s in (0, 3, 4, 99)] == pytest.approx([0.25, 1.0, 1.0, 1.0])


def test_step_is_the_papers_goyal_warm_up_and_per_epoch_decay():
    s = schedule("step", workers=4, lr=0.1, warmup_steps=10, lr_decay=0.5, lr_decay_after=2)
    assert s.lr(0, 0.1) == pytest.approx(0.1)  # from the one-worker LR (Goyal et al.)
    assert s.lr(5, 0.1) == pytest.approx(0.25)
    assert [s.lr(st, 0.1) for st in (10, 19, 20, 30)] == pytest.approx([0.4, 0.4, 0.2, 0.1])  # 10 steps an epoch


def test_each_group_is_scaled_from_its_own_initial_lr():
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.LayerNorm(3))
    groups: list[dict[str, Any]] = [{"params": model[0].parameters(), "lr": 0.1}, {"params": model[1].parameters()}]
    opt = torch.optim.AdamW(groups, lr=1)
    for g in opt.param_groups:
        g["initial_lr"] = g["lr"]
    s = schedule("cosine", workers=2, total=10, lr=1.0, warmup_steps=0)
    s.set(opt, 5)
    assert [g["lr"] for g in opt.param_groups] == pytest.approx([0.2 * 0.5, 2.0 * 0.5])


def my_schedule(step: int) -> float:  # a user's schedule for --lr-schedule tests.unit.test_recipe:my_schedule
    return 0.5**step


def bad_schedule(step: int):
    return "fast"


def test_a_users_schedule_is_a_factor_of_the_peak_and_a_bad_one_is_one_line():
    s = schedule("unit.test_recipe:my_schedule", workers=2, lr=0.1)
    assert [s.lr(st, 0.1) for st in (0, 1, 3)] == pytest.approx([0.2, 0.1, 0.025])
    with pytest.raises(ConfigError, match=r"--lr-schedule unit.test_recipe:bad_schedule: returned 'fast'"):
        schedule("unit.test_recipe:bad_schedule")


def test_no_decay_norm_bias_puts_biases_and_norm_weights_in_a_group_without_decay():
    model = MODELS["resnet18"].build()
    opt = build_optimizer(OptimConfig(optimizer="adamw", weight_decay=0.1, decay_norm_bias=False, lr=0.01), model)
    assert isinstance(opt, torch.optim.AdamW)
    decayed, free = opt.param_groups
    assert (decayed["weight_decay"], free["weight_decay"]) == (0.1, 0.0)
    assert all(p.dim() >= 2 for p in decayed["params"]) and all(p.dim() < 2 for p in free["params"])
    assert len(decayed["params"]) + len(free["params"]) == len(list(model.parameters()))
    assert all(g["initial_lr"] == 0.01 for g in opt.param_groups)
    one = param_groups(model, OptimConfig())
    assert len(one) == 1


def test_tied_weights_appear_once_and_a_bias_only_model_gets_one_group():
    from examples.gpt.model import GPT

    gpt = GPT(vocab_size=11, block_size=8, dim=8, layers=1, heads=2)
    groups = param_groups(gpt, OptimConfig(decay_norm_bias=False))
    ids = [id(p) for g in groups for p in g["params"]]
    assert len(ids) == len(set(ids)) == len(list(gpt.parameters()))
    bias_only = torch.nn.Linear(3, 2)
    del bias_only.weight
    bias_only.weight = torch.ones(2, 3)  # a buffer-like plain tensor: only the bias trains
    groups = param_groups(bias_only, OptimConfig(decay_norm_bias=False))
    assert len(groups) == 1 and groups[0]["weight_decay"] == 0.0


def make_sgd_with_nesterov(groups, momentum: float = 0.9):  # --optimizer tests.unit.test_recipe:make_sgd_with_nesterov
    return torch.optim.SGD(groups, momentum=momentum, nesterov=True)


def not_an_optimizer(groups):
    return {"lr": 1}


def test_a_users_optimizer_callable_gets_groups_with_lr_and_its_arguments():
    model = torch.nn.Linear(3, 2)
    cfg = OptimConfig(optimizer="unit.test_recipe:make_sgd_with_nesterov", optimizer_arg=["momentum=0.5"], lr=0.2)
    opt = build_optimizer(cfg, model)
    assert isinstance(opt, torch.optim.SGD)
    assert (opt.param_groups[0]["lr"], opt.param_groups[0]["momentum"], opt.param_groups[0]["nesterov"]) == (
        0.2,
        0.5,
        True,
    )
    with pytest.raises(ConfigError, match=r"returned a dict; return a torch.optim.Optimizer"):
        build_optimizer(OptimConfig(optimizer="unit.test_recipe:not_an_optimizer"), model)


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        (dict(optimizer="lion"), "--optimizer: unknown value 'lion'; choose one of: sgd, adam, adamw"),
        (dict(lr_schedule="warmup"), "--lr-schedule: unknown value 'warmup'"),
        (dict(betas="0.9"), "--betas '0.9': write B1,B2"),
        (dict(optimizer_arg=["a=1"]), "--optimizer-arg is for your own --optimizer"),
        (dict(min_lr=1.0, lr=0.1), "--min-lr must be in [0, --lr]"),
    ],
)
def test_bad_recipe_flags_are_one_line_naming_the_flag(kwargs, needle):
    with pytest.raises(ConfigError) as e:
        OptimConfig(**kwargs)
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_16_mixed_needs_cuda():
    with pytest.raises(ConfigError, match=r"--precision 16-mixed needs a CUDA device.*use --precision bf16-mixed"):
        Precision("16-mixed", torch.device("cpu"))


def test_the_loss_scaler_backs_off_and_skips_on_inf_grows_after_its_interval():
    s = LossScaler(scale=8.0, growth_interval=3)
    for found in (False, False, True, False, False, False):
        s.update(found)
    assert (s.scale, s.good_steps) == (8.0, 0)  # 8 -> 4 on the inf, x2 after 3 good steps
    restored = LossScaler()
    restored.load_state_dict(s.state_dict())
    assert restored.state_dict() == s.state_dict()


def test_unscaling_divides_the_gradients_and_an_inf_anywhere_skips_the_step_for_every_parameter():
    # the scaler's arithmetic is the same on any device: CPU tensors stand in for a GPU's here
    prec = Precision("32", torch.device("cpu"))
    prec.scaler = LossScaler(scale=4.0)
    a, b = torch.nn.Parameter(torch.ones(3)), torch.nn.Parameter(torch.ones(2))
    a.grad, b.grad = torch.full((3,), 8.0), torch.full((2,), 2.0)
    assert not prec.unscale([a, b])
    assert a.grad.tolist() == [2.0, 2.0, 2.0] and b.grad.tolist() == [0.5, 0.5]
    a.grad, b.grad = torch.tensor([1.0, math.inf, 0.0]), torch.ones(2)
    votes = []

    def vote(t):  # the workers' sum: here another worker found an inf too
        votes.append(t.clone())
        return t + 1

    assert prec.unscale([a, b], vote=vote)
    assert a.grad is None and b.grad is None and prec.scaler.scale == 2.0
    assert votes[0].item() > 0


def test_a_torch_lr_scheduler_drives_the_distributed_optimizer_of_init():
    """init()'s optimizer is an instance of the user's class sharing its groups: StepLR accepts it, and the
    LR it sets is the one the update uses (gamma 0: the second step leaves the parameters alone)."""
    from allreduce_train.api import Communicator, DistributedOptimizer
    from allreduce_train.config import Config
    from allreduce_train.distributed.local import LocalExchange

    comm = Communicator(LocalExchange(), Config())
    model = torch.nn.Linear(4, 1)
    opt = comm.distributed_optimizer(model, torch.optim.AdamW(model.parameters(), lr=0.1))
    assert isinstance(opt, torch.optim.AdamW) and isinstance(opt, DistributedOptimizer)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.0)
    x = torch.randn(8, 4)
    moved = []
    for _ in range(2):
        before = [p.detach().clone() for p in model.parameters()]
        opt.zero_grad()
        model(x).pow(2).mean().backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)  # torch's utilities take it too
        opt.step()
        sched.step()
        moved.append(any(not torch.equal(b, p) for b, p in zip(before, model.parameters(), strict=True)))
    assert moved == [True, False] and opt.param_groups[0]["lr"] == 0.0
    assert opt.steps == 2 and opt.state_dict()["state"][0]["step"].item() == 2


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--strategy", "ps", "--precision", "16-mixed"], "--precision 16-mixed with --strategy ps"),
        (["--reduce-op", "adasum", "--precision", "16-mixed"], "--precision 16-mixed with --reduce-op adasum"),
    ],
)
def test_16_mixed_where_no_scaler_can_unscale_before_the_update_is_refused_before_any_rank_starts(argv, needle):
    from helpers import parse

    with pytest.raises(ConfigError, match=needle):
        parse(argv)


def test_the_scalers_vote_is_needed_only_where_the_workers_gradients_differ():
    """16-mixed votes on inf/NaN only on steps whose gradients were not averaged (schedules' averaged())."""
    from allreduce_train.distributed.diloco import DiLoCo
    from allreduce_train.distributed.local import LocalExchange
    from allreduce_train.distributed.localsgd import LocalSGD
    from allreduce_train.distributed.schedules import Sync
    from allreduce_train.distributed.wire import WireFormat

    ex, wire = LocalExchange(), WireFormat("none")
    assert all(Sync(ex, wire).averaged(s) for s in range(1, 9))
    assert [s for s in range(1, 9) if LocalSGD(ex, wire, 4).averaged(s)] == [4, 8]
    assert not any(DiLoCo(ex, wire, 4).averaged(s) for s in range(1, 9))
