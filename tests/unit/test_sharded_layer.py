"""The sharded layer in one process: ``ShardedExchange`` over a one-rank ``ShardCollectives`` (a sum over one
rank is the identity: the shard is the whole bucket), through ``init()``'s ``distributed_optimizer``. What
holds at any worker count holds here: the update equals the user's optimizer's, bit for bit, at every
stage; the optimizer's ``state_dict()`` is the class's own and loads back; stage 3 keeps no parameter
between its uses. The multi-rank properties are tests/mpi/test_sharded.py's."""

from __future__ import annotations

import copy

import pytest
import torch

from allreduce_train.api import Communicator
from allreduce_train.config import Config, ExchangeConfig
from allreduce_train.distributed.local import LocalExchange
from allreduce_train.distributed.sharded.exchange import ShardedExchange
from allreduce_train.distributed.wire import FLOAT32


class OneRank:
    """:class:`~allreduce_train.distributed.sharded.collectives.ShardCollectives` of a world of one rank."""

    rank, size = 0, 1

    def bounds(self, numel: int) -> list[tuple[int, int]]:
        return [(0, numel)]

    def start_reduce_scatter(self, key: int, flat: torch.Tensor) -> None:
        return None  # the sum over one rank: the bucket as it is

    def start_allgather(self, key: int, flat: torch.Tensor) -> None:
        return None

    def wait(self, handles: list, what: str) -> None:
        return None


class Net(torch.nn.Module):
    """A matrix, a BatchNorm, two layers with one weight, a tiny matrix, a bias-only parameter, in-place ReLUs."""

    def __init__(self) -> None:
        super().__init__()
        self.inp, self.bn = torch.nn.Linear(12, 8), torch.nn.BatchNorm1d(8)
        self.a, self.b = torch.nn.Linear(8, 8), torch.nn.Linear(8, 8)
        self.b.weight = self.a.weight
        self.tiny = torch.nn.Linear(8, 2, bias=False)
        self.shift = torch.nn.Parameter(torch.zeros(2))
        self.relu = torch.nn.ReLU(inplace=True)

    def forward(self, x):
        h = self.relu(self.bn(self.inp(x)))
        return self.tiny(self.relu(self.b(self.relu(self.a(h))))) + self.shift


def adamw(model: torch.nn.Module) -> torch.optim.Optimizer:
    matrices = [p for p in model.parameters() if p.dim() > 1]
    rest = [p for p in model.parameters() if p.dim() <= 1]
    groups: list[dict] = [{"params": matrices}, {"params": rest, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=0.01)


def sharded(stage: int, model: torch.nn.Module, clip: float = 0.0):
    x = ExchangeConfig(strategy="sharded", shard_stage=stage)
    ex = ShardedExchange(x, LocalExchange(), OneRank(), grad_clip=clip, wire=FLOAT32, bucket_bytes=200)
    return ex, Communicator(ex, Config(exchange=x)).distributed_optimizer(model, adamw(model))


def steps(model, opt, n: int, seed: int = 0) -> None:
    g = torch.Generator().manual_seed(seed)
    for _ in range(n):
        opt.zero_grad()
        model(torch.randn(6, 12, generator=g)).pow(2).mean().backward()
        opt.step()


@pytest.mark.heavy
@pytest.mark.parametrize("stage", [1, 2, 3])
def test_every_stage_updates_as_the_users_optimizer_and_its_state_is_the_classs_own(stage):
    torch.manual_seed(0)
    ref = Net()
    model = copy.deepcopy(ref)
    ex, opt = sharded(stage, model)
    assert len(ex.layout.buckets) > 1 and isinstance(opt, torch.optim.AdamW)
    ref_opt = adamw(ref)
    steps(ref, ref_opt, 3)
    steps(model, opt, 3)
    if stage == 3:  # between steps only the shards are held: every parameter points at a NaN of its shape
        assert all(p.stride() == (0,) * p.dim() and p.isnan().all() for p in model.parameters())
    ex.whole_parameters(model)
    for a, b in zip(ref.state_dict().values(), model.state_dict().values(), strict=True):
        assert torch.equal(a, b)
    mine, theirs = opt.state_dict(), ref_opt.state_dict()
    assert mine["param_groups"] == theirs["param_groups"] and mine["state"].keys() == theirs["state"].keys()
    for i, st in theirs["state"].items():
        assert all(torch.equal(mine["state"][i][k], v) for k, v in st.items())
    # a whole state loads back into a fresh sharded optimizer (a resume), and both go on alike
    fresh = copy.deepcopy(ref)
    ex2, again = sharded(stage, fresh)
    again.load_state_dict(mine)
    steps(ref, ref_opt, 1, seed=1)
    steps(fresh, again, 1, seed=1)
    ex2.whole_parameters(fresh)
    assert all(torch.equal(a, b) for a, b in zip(ref.parameters(), fresh.parameters(), strict=True))


def test_grad_clip_over_the_shards_is_torchs_clip_grad_norm():
    torch.manual_seed(0)
    ref = Net()
    model = copy.deepcopy(ref)
    _, opt = sharded(2, model, clip=0.01)
    ref_opt = adamw(ref)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(6, 12, generator=g)
    ref(x).pow(2).mean().backward()
    assert torch.nn.utils.clip_grad_norm_(ref.parameters(), 0.01) > 0.01  # it clips
    ref_opt.step()
    opt.zero_grad()
    model(x).pow(2).mean().backward()
    opt.step()
    for a, b in zip(ref.parameters(), model.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)  # the norm summed in float64: its last bits
