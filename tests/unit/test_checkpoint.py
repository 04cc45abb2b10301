import os

import pytest
import torch

from allreduce_train import checkpoint
from allreduce_train.errors import UserError


def state(v):
    return {"model": {"w": torch.full((3,), float(v))}, "optimizer": {}, "step": v, "config": {}}


def test_roundtrip_and_replace(tmp_path):
    p = str(tmp_path / "c.pt")
    checkpoint.save(p, state(1))
    checkpoint.save(p, state(2))
    assert checkpoint.load(p)["step"] == 2
    assert os.listdir(tmp_path) == ["c.pt"]  # no temporary left behind


def test_failed_write_keeps_previous_good_checkpoint(tmp_path):
    p = str(tmp_path / "c.pt")
    checkpoint.save(p, state(1))

    class Unpicklable:
        def __reduce__(self):
            raise RuntimeError("disk full, say")

    with pytest.raises(RuntimeError):
        checkpoint.save(p, {**state(2), "bad": Unpicklable()})
    assert checkpoint.load(p)["step"] == 1
    assert os.listdir(tmp_path) == ["c.pt"]


def test_load_rejects_missing_torn_and_foreign_files(tmp_path):
    with pytest.raises(UserError, match="not found"):
        checkpoint.load(str(tmp_path / "none.pt"))
    torn = tmp_path / "torn.pt"
    torn.write_bytes(b"PK\x03\x04garbage")
    with pytest.raises(UserError, match="not a readable checkpoint"):
        checkpoint.load(str(torn))
    foreign = tmp_path / "foreign.pt"
    torch.save({"weights": torch.zeros(1)}, foreign)
    with pytest.raises(UserError, match="lacks 'model'"):
        checkpoint.load(str(foreign))


def test_weights_only_refuses_code(tmp_path):
    p = tmp_path / "evil.pt"
    torch.save({"model": {}, "optimizer": {}, "step": 0, "config": {}, "x": os.getcwd}, p)
    with pytest.raises(UserError):
        checkpoint.load(str(p))


def test_a_workers_state_round_trips_and_reads_the_keys_checkpoints_had_before_it(tmp_path):
    rng = torch.get_rng_state()
    mine = checkpoint.WorkerState(
        rng,
        {"hidden": torch.ones(2)},
        exchange={"error": [torch.zeros(1)]},
        schedule={"local_sgd": {"params": [torch.ones(3)]}},
    )
    saved = mine.to_dict()
    # on disk the keys every checkpoint had: rng, task, exchange, and the schedule's under its own name
    assert set(saved) == {"rng", "task", "exchange", "local_sgd"}
    checkpoint.save(str(tmp_path / "c.pt"), {**state(1), "workers": [saved]})
    back = checkpoint.WorkerState.from_dict(checkpoint.load(str(tmp_path / "c.pt"))["workers"][0])
    assert torch.equal(back.rng, rng) and torch.equal(back.task["hidden"], torch.ones(2))
    assert torch.equal(back.schedule["local_sgd"]["params"][0], torch.ones(3)) and back.cuda_rng is None
    # written before PowerSGD existed: no "exchange" key
    old = checkpoint.WorkerState.from_dict({"rng": rng, "task": None})
    assert old.exchange is None and old.schedule == {}


def test_a_workers_state_without_rng_is_refused_in_one_line():
    with pytest.raises(UserError, match=r"--resume x\.pt: the checkpoint's per-worker state has no 'rng'"):
        checkpoint.WorkerState.from_dict({"task": None}, "x.pt")
