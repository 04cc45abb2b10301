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
