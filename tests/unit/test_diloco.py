"""DiLoCo's schedule (distributed/diloco.py) in one process: the outer Nesterov step on the averaged
parameter delta, when it happens, what it costs on the wire, and the combinations it refuses."""

import pytest
import torch

from allreduce_train.distributed.diloco import DiLoCo, bytes_per_step
from allreduce_train.distributed.local import LocalExchange
from allreduce_train.distributed.wire import WireFormat
from allreduce_train.distributed.wirecost import ring_bytes
from allreduce_train.errors import ConfigError

from helpers import parse


class TwinExchange(LocalExchange):
    """Two workers that moved alike: every sum is twice this worker's tensor; records the sums."""

    size = 2

    def __init__(self):
        self.sums = []

    def sum_tensors(self, tensors, name=""):
        self.sums.append(name)
        return [2 * t for t in tensors]


def schedule_on(model, lr, mu, every=4):
    ex = TwinExchange()
    sch = DiLoCo(ex, WireFormat("none"), every, lr, mu)
    # no gradients: the inner SGD's step() leaves the parameters alone; the tests move them by hand
    opt = sch.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
    return ex, sch, opt


@torch.no_grad()
def inner_move(model, seed):
    gen = torch.Generator().manual_seed(seed)
    for p in model.parameters():
        p.add_(0.1 * torch.randn(p.shape, generator=gen))


@pytest.mark.parametrize("lr, mu", [(0.7, 0.9), (0.5, 0.0)])
def test_the_outer_step_is_torchs_nesterov_sgd_on_the_averaged_delta_at_each_period_end(lr, mu):
    torch.manual_seed(0)
    model = torch.nn.Linear(5, 3)
    outer = [torch.nn.Parameter(p.detach().clone()) for p in model.parameters()]  # torch's own outer optimizer
    ref = torch.optim.SGD(outer, lr=lr, momentum=mu, nesterov=mu > 0)
    ex, sch, opt = schedule_on(model, lr, mu)
    for step in range(1, 13):
        inner_move(model, step)
        if step % 4 == 0:  # the reference, before the schedule moves the parameters
            for o, p in zip(outer, model.parameters(), strict=True):
                o.grad = (o - p).detach()  # the twins' average delta is this worker's own
            ref.step()
        sch.apply(opt, model, step)
        if step % 4 == 0:
            for o, p in zip(outer, model.parameters(), strict=True):
                assert torch.allclose(p, o, rtol=0, atol=1e-6), step
    assert ex.sums == ["diloco.delta"] * 3


def test_outer_lr_1_without_momentum_is_parameter_averaging():
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    _, sch, opt = schedule_on(model, 1.0, 0.0, every=2)
    inner_move(model, 1)
    sch.apply(opt, model, 1)
    inner_move(model, 2)
    moved = [p.detach().clone() for p in model.parameters()]
    sch.apply(opt, model, 2)
    for p, m in zip(model.parameters(), moved, strict=True):
        assert torch.allclose(p, m, rtol=0, atol=1e-6)  # the twins' average is where this worker went


def test_no_sum_between_period_ends():
    model = torch.nn.Linear(3, 1)
    ex, sch, opt = schedule_on(model, 0.7, 0.9, every=5)
    for step in range(1, 5):
        sch.apply(opt, model, step)
        assert not sch.exchanging(step)
    assert ex.sums == []
    sch.apply(opt, model, 5)
    assert ex.sums == ["diloco.delta"]


def test_diloco_sends_one_float32_parameter_ring_per_period():
    assert bytes_per_step(1000, 4, 8) == ring_bytes(1000, 4) / 8
    assert bytes_per_step(1000, 1, 8) == 0


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["--strategy", "ps", "--diloco-every", "4"], "--diloco-every is DiLoCo over an allreduce"),
        (["--diloco-every", "4", "--compression", "fp16"], "DiLoCo sends no gradients"),
        (["--diloco-every", "4", "--average-every", "4"], "choose one"),
        (["--diloco-every", "4", "--reduce-op", "adasum"], "--reduce-op average"),
        (["--strategy", "none", "--diloco-every", "4"], "--strategy none exchanges nothing"),
        (["--diloco-every", "4", "--diloco-outer-momentum", "1"], "--diloco-outer-momentum"),
        (["--diloco-every", "-1"], "--diloco-every"),
    ],
)
def test_diloco_combinations_that_cannot_work_are_named(argv, needle):
    with pytest.raises(ConfigError, match=needle):
        parse(argv)
