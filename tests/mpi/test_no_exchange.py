"""``--strategy none`` under mpirun: every rank trains alone on its shard (the bound of docs/performance.md)."""

import json

import pytest
import torch

from helpers import SHARED_RUN, check, launch, load_params, rel_diff, run_args

pytestmark = pytest.mark.mpi


def test_each_rank_trains_alone_on_its_shard_as_local_sgd_that_never_averages(tmp_path, alone_run):
    check(launch(2, SHARED_RUN + run_args(tmp_path, "none", "--batch-size", "16", "--strategy", "none")))
    # the same ranks, each stepping on its own gradient: local SGD whose first averaging lies past the run
    # (tests/mpi/conftest.py's alone_run)
    for rank in (0, 1):
        mine, alone = load_params(tmp_path / f"none-{rank}.pt"), load_params(alone_run / f"alone-{rank}.pt")
        for k in mine:
            assert torch.equal(mine[k], alone[k]), f"rank {rank}: {k} differs from training alone on the shard"
    assert rel_diff(load_params(tmp_path / "none-0.pt"), load_params(tmp_path / "none-1.pt")) > 1e-3
    m = json.loads((tmp_path / "none" / "metrics.json").read_text())
    assert m["strategy"] == "none" and m["workers"] == 2 and m["global_batch"] == 32
    # the bookkeeping sums still cross the ranks: each rank's row of the end-of-run figures is filled
    assert [r["rank"] for r in m["ranks"]] == [0, 1] and all(r["compute_ms"] > 0 for r in m["ranks"])
