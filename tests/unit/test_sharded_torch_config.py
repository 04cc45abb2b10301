"""``--strategy sharded --allreduce-engine torch`` in process: the refusals every sharded engine shares hold for
it (one line, exit 2, before any rank starts), and the modules FSDP2 shards apart from the root."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from allreduce_train.distributed.sharded.fsdp import _own_modules
from allreduce_train.errors import ConfigError

from helpers import parse

BASE = ["--model", "lenet5", "--dataset", "synthetic", "--strategy", "sharded", "--allreduce-engine", "torch"]


def test_every_stage_is_accepted_on_the_torch_engine():
    for stage in ("1", "2", "3"):
        cfg = parse([*BASE, "--shard-stage", stage, "--compression", "bf16", "--precision", "bf16-mixed"])
        assert (cfg.exchange.engine, cfg.exchange.shard_stage) == ("torch", int(stage))


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--average-every", "2"], r"use --strategy allreduce"),
        (["--compression", "powersgd"], r"use --compression fp16"),
        (["--reduce-op", "adasum"], r"use --reduce-op average"),
        (["--precision", "16-mixed"], r"use --precision bf16-mixed"),
    ],
)
def test_what_no_sharded_engine_runs_is_refused_on_the_torch_engine_in_one_line(argv, needle, capsys):
    from allreduce_train.cli import main

    with pytest.raises(ConfigError, match=needle):
        parse([*BASE, *argv])
    capsys.readouterr()
    with pytest.raises(SystemExit) as ended:  # the train command exits, as at its entry point
        main(["train", *BASE, *argv])
    assert ended.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("allreduce_train: error: ")


class Tied(nn.Module):
    """An embedding and a head sharing one weight, a block with a weight of its own and a child."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(10, 4)
        self.block = nn.Sequential(nn.Linear(4, 4), nn.LayerNorm(4))
        self.block.scale = nn.Parameter(torch.ones(4))  # the block's own, beside its children's
        self.head = nn.Linear(4, 10, bias=False)
        self.head.weight = self.emb.weight


def test_fsdp2_shards_each_module_with_weights_of_its_own_bottom_up_and_leaves_a_tied_weight_to_the_root():
    model = Tied()
    got = _own_modules(model)
    # emb and head share their weight: neither is sharded apart (the root shards it once)
    assert got == [model.block[1], model.block[0], model.block]
    assert model.emb not in got and model.head not in got and model not in got
