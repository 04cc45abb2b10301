"""``--strategy none`` under mpirun: every rank trains alone on its shard (the bound of docs/performance.md)."""

import json

import pytest
import torch

from helpers import check, launch, load_params, rel_diff

pytestmark = pytest.mark.mpi

QUICK = ["--dataset", "synthetic", "--synthetic-samples", "2048", "--no-progress", "--log-every", "5",
         "--warmup-steps", "0", "--lr", "0.05", "--batch-size", "16", "--steps", "20"]


def run_args(tmp_path, name, *extra):
    return ["--run-dir", str(tmp_path), "--name", name, "--dump-params", str(tmp_path / f"{name}-{{rank}}.pt"), *extra]


def test_each_rank_trains_alone_on_its_shard_as_local_sgd_that_never_averages(tmp_path):
    check(launch(2, QUICK + run_args(tmp_path, "none", "--strategy", "none")))
    # the same ranks, each stepping on its own gradient: local SGD whose first averaging lies past the run
    check(launch(2, QUICK + run_args(tmp_path, "alone", "--average-every", "1000")))
    for rank in (0, 1):
        mine, alone = load_params(tmp_path / f"none-{rank}.pt"), load_params(tmp_path / f"alone-{rank}.pt")
        for k in mine:
            assert torch.equal(mine[k], alone[k]), f"rank {rank}: {k} differs from training alone on the shard"
    assert rel_diff(load_params(tmp_path / "none-0.pt"), load_params(tmp_path / "none-1.pt")) > 1e-3
    m = json.loads((tmp_path / "none" / "metrics.json").read_text())
    assert m["strategy"] == "none" and m["workers"] == 2 and m["global_batch"] == 32
    # the bookkeeping sums still cross the ranks: each rank's row of the end-of-run figures is filled
    assert [r["rank"] for r in m["ranks"]] == [0, 1] and all(r["compute_ms"] > 0 for r in m["ranks"])
