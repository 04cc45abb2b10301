"""DiLoCo (``--diloco-every``) with real ranks under mpirun, on the mpi engine (it touches no engine:
distributed/diloco.py is a schedule over the engine's grouped sum)."""

import json

import pytest
import torch

from helpers import QUICK, check, launch, load_params, rel_diff, run_args

pytestmark = pytest.mark.mpi

# helpers.QUICK's short synthetic run, 20 steps on the mpi engine
RUN = [*QUICK, "--steps", "20", "--allreduce-engine", "mpi"]
DILOCO = ["--diloco-every", "4", "--checkpoint-every", "7"]


def same_on_every_rank(d, name):
    r0, r1 = load_params(d / f"{name}-0.pt"), load_params(d / f"{name}-1.pt")
    for k in r0:
        assert torch.equal(r0[k], r1[k]), f"{name}: {k} differs between ranks"
    return r0


@pytest.fixture(scope="module")
def diloco_dir(tmp_path_factory):
    """DiLoCo with H=4 run to the end (20 steps: the last one is an outer step)."""
    d = tmp_path_factory.mktemp("diloco")
    check(launch(2, RUN + DILOCO + run_args(d, "full")))
    return d


def test_diloco_ends_alike_on_every_rank_and_away_from_local_sgd_with_the_same_period(tmp_path, diloco_dir):
    got = same_on_every_rank(diloco_dir, "full")  # identical only because the last step was an outer step
    # local SGD with DiLoCo's inner optimizer (AdamW, its default): what differs is the outer optimizer
    check(launch(2, RUN + ["--average-every", "4", "--optimizer", "adamw"] + run_args(tmp_path, "local")))
    assert rel_diff(got, same_on_every_rank(tmp_path, "local")) > 1e-4  # the outer optimizer left its mark
    m = json.loads((diloco_dir / "full" / "metrics.json").read_text())
    assert (m["diloco_every"], m["diloco_outer_lr"], m["diloco_outer_momentum"]) == (4, 0.7, 0.9)
    assert m["optimizer"] == "AdamW"  # the paper's inner optimizer, without --optimizer


def test_diloco_resumes_exactly_mid_period_with_the_outer_state_and_every_workers_own(tmp_path, diloco_dir):
    args = RUN + DILOCO
    check(launch(2, args + run_args(tmp_path, "cut", "--exit-after-steps", "9")))  # one step into a period
    saved = torch.load(tmp_path / "cut" / "checkpoint.pt", weights_only=True)
    own = [w["diloco"]["params"] for w in saved["workers"]]
    assert any(not torch.equal(a, b) for a, b in zip(*own, strict=True)), "mid-period the workers' parameters differ"
    assert any(m.abs().sum() > 0 for m in saved["workers"][0]["diloco"]["momentum"])  # two outer steps taken
    check(launch(2, args + run_args(tmp_path, "cut", "--resume", "auto")))
    full, resumed = load_params(diloco_dir / "full-0.pt"), same_on_every_rank(tmp_path, "cut")
    for k in full:
        assert torch.equal(full[k], resumed[k]), k
