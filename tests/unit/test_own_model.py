"""Your own model and data, in one process: the sharded sampler, the task adapter, configuration and
the public API's surface (docs/own_model.md)."""

import subprocess
import sys

import pytest
import torch
from torch.utils.data import Dataset

import allreduce_train
from allreduce_train.config import add_arguments, build_config
from allreduce_train.data.images import ShardedBatches, TensorDataset
from allreduce_train.data.indexed import DatasetBatches, EvalPart
from allreduce_train.errors import ConfigError
from allreduce_train.usercode import label, parse_kwargs

from helpers import ROOT


class Indexed(Dataset):
    """Sample i is (i as a float vector, i): which samples a batch holds can be read off it."""

    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return torch.full((3,), float(i)), i


def test_shards_cover_each_global_batch_once_in_the_in_memory_order():
    n, b, w, seed = 103, 4, 3, 7
    memory = TensorDataset(torch.arange(n, dtype=torch.float32).unsqueeze(1), torch.arange(n))
    for epoch in (0, 1):
        ours = [list(DatasetBatches(Indexed(n), b, r, w, seed).batches(epoch)) for r in range(w)]
        theirs = [list(ShardedBatches(memory, b, r, w, seed).batches(epoch)) for r in range(w)]
        assert len(ours[0]) == n // (b * w)
        seen = []
        for step in range(len(ours[0])):
            for r in range(w):
                assert ours[r][step][1].tolist() == theirs[r][step][1].tolist()
                seen += ours[r][step][1].tolist()
        assert len(seen) == len(set(seen)) == (n // (b * w)) * b * w


def test_a_resumed_epoch_continues_the_same_order_and_background_workers_change_nothing():
    data = Indexed(200)
    full = [y.tolist() for _, y in DatasetBatches(data, 8, 1, 2, 3).batches(2)]
    tail = [y.tolist() for _, y in DatasetBatches(data, 8, 1, 2, 3).batches(2, start_step=5)]
    assert tail == full[5:]
    loaded = DatasetBatches(data, 8, 1, 2, 3, workers=2)
    assert [y.tolist() for _, y in loaded.batches(2)] == full
    assert [y.tolist() for _, y in loaded.batches(2, start_step=5)] == full[5:]  # the same loader, again


def test_evaluation_parts_cover_every_sample_once():
    data = Indexed(205)
    got = [y for r in range(2) for _, ys in EvalPart(data, r, 2).batches(50) for y in ys.tolist()]
    assert got == list(range(205))


def test_keyword_arguments_are_read_as_literals():
    assert parse_kwargs("--model-arg", ["depth=4", "p=0.1", "name=gpt", "bias=false", "shape=(1, 2)"]) == {
        "depth": 4,
        "p": 0.1,
        "name": "gpt",
        "bias": False,
        "shape": (1, 2),
    }
    with pytest.raises(ConfigError, match="KEY=VALUE"):
        parse_kwargs("--model-arg", ["depth"])
    with pytest.raises(ConfigError, match="given twice"):
        parse_kwargs("--model-arg", ["a=1", "a=2"])
    assert label("mypkg.net:build") == "net.build"


def _cfg(argv):
    import argparse

    p = argparse.ArgumentParser()
    add_arguments(p)
    return build_config(p.parse_args(argv))


def test_own_code_is_named_on_the_command_line_and_in_a_toml_file(tmp_path):
    cfg = _cfg(
        [
            "--model",
            "mypkg.net:build",
            "--model-arg",
            "depth=4",
            "--model-arg",
            "width=8",
            "--dataset",
            "mypkg.data:load",
            "--data-workers",
            "2",
        ]
    )
    assert (cfg.model.model, cfg.model.model_arg, cfg.data.dataset) == (
        "mypkg.net:build",
        ["depth=4", "width=8"],
        "mypkg.data:load",
    )
    assert cfg.model.label == "net.build"
    toml = tmp_path / "run.toml"
    toml.write_text(
        '[model]\nmodel = "mypkg.net:build"\nmodel_arg = {depth = 4, name = "x"}\n[data]\ndataset = "mypkg.data:load"\n'
    )
    cfg = _cfg(["--config", str(toml)])
    assert parse_kwargs("--model-arg", cfg.model.model_arg) == {"depth": 4, "name": "x"}
    with pytest.raises(ConfigError, match="--dataset: unknown value 'mnist'"):
        _cfg(["--dataset", "mnist"])
    with pytest.raises(ConfigError, match="--dataset-arg is for your own"):
        _cfg(["--dataset", "synthetic", "--dataset-arg", "n=3"])
    with pytest.raises(ConfigError, match="--data-workers must be >= 0"):
        _cfg(["--data-workers", "-1"])


def test_api_settings_are_the_trainers_flags_and_the_command_line_wins(tmp_path):
    """fit()/init()'s build_config(argv, overrides): a TOML file < settings < the command line."""
    toml = tmp_path / "run.toml"
    toml.write_text("[train]\nepochs = 7\nseed = 4\n[data]\nbatch_size = 8\n")
    cfg = build_config(["--epochs", "3"], {"epochs": 5, "batch_size": 16, "ps_placement": "colocated"})
    assert (cfg.train.epochs, cfg.data.batch_size, cfg.ps.placement) == (3, 16, "colocated")
    cfg = build_config(["--config", str(toml), "--epochs", "3"], {"batch_size": 16})
    assert (cfg.train.epochs, cfg.train.seed, cfg.data.batch_size) == (3, 4, 16)
    with pytest.raises(ConfigError, match="unknown setting batchsize=16"):
        build_config([], {"batchsize": 16})
    with pytest.raises(ConfigError, match="unknown argument '--nope'"):
        build_config(["--nope"], {})
    with pytest.raises(ConfigError, match="argument --batch-size: invalid int value: 'x'"):
        build_config(["--batch-size", "x"])  # one line for rank 0 to print, not argparse's exit on every rank


def test_the_public_surface_is_named_documented_and_import_stays_light():
    for name in allreduce_train.__all__:
        obj = getattr(allreduce_train, name)
        assert obj.__doc__ and obj.__doc__.strip(), name
    # import allreduce_train loads no torch (the launcher's and the CLI's start stay fast)
    code = "import sys, allreduce_train; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_the_loss_check_leaves_no_trace_and_names_a_misfit():
    from allreduce_train.usertask import Task

    class Counting(Task):
        seen = 0

        def loss(self, model, x, y):
            self.seen += 1
            return super().loss(model, x, y)

        def state_dict(self):
            return {"seen": self.seen}

        def load_state_dict(self, state):
            self.seen = state["seen"]

    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4), torch.nn.Dropout(0.5))
    task = Counting()
    task.source = "--task t"
    before = {k: v.clone() for k, v in model.state_dict().items()}
    x, y = torch.randn(8, 3), torch.randint(0, 4, (8,))
    rng = torch.get_rng_state()
    task.check(model, x, y)
    assert task.seen == 0 and torch.equal(torch.get_rng_state(), rng) and model.training
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    with pytest.raises(ConfigError, match="the loss on one training batch"):
        task.check(model, torch.randn(8, 3), torch.randint(0, 4, (8, 2)))
