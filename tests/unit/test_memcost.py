"""The ZeRO paper's per-rank memory formula (allreduce_train/distributed/memcost.py)."""

import subprocess
import sys

import pytest

from allreduce_train.distributed.memcost import per_rank

PSI = 1_000_000  # parameters


def test_replication_holds_everything_on_every_rank():
    for concept in ("ring", "none"):
        for n in (1, 2, 4):
            got = per_rank(PSI, n, concept)
            assert got == {"params": 4 * PSI, "grads": 4 * PSI, "optimizer": 8 * PSI, "total": 16 * PSI}


def test_each_sharded_stage_divides_one_more_kind_by_the_workers():
    n = 4
    s1, s2, s3 = (per_rank(PSI, n, "sharded", stage=k) for k in (1, 2, 3))
    assert (s1["params"], s1["grads"], s1["optimizer"]) == (4 * PSI, 4 * PSI, 8 * PSI / n)
    assert (s2["params"], s2["grads"], s2["optimizer"]) == (4 * PSI, 4 * PSI / n, 8 * PSI / n)
    assert (s3["params"], s3["grads"], s3["optimizer"]) == (4 * PSI / n, 4 * PSI / n, 8 * PSI / n)
    assert s3["total"] == 16 * PSI / n  # the paper's Psi (2 + 2 + K) / N with our byte counts
    assert per_rank(PSI, 1, "sharded", stage=3)["total"] == per_rank(PSI, 1, "ring")["total"]


def test_the_parameter_servers_shards_sit_on_the_servers():
    colocated = per_rank(PSI, 4, "ps")
    assert colocated == {"params": 4 * PSI + PSI, "grads": 4 * PSI, "optimizer": 2 * PSI, "total": 11 * PSI}
    dedicated = per_rank(PSI, 3, "ps", dedicated=True, servers=2, param_bytes=4, state_bytes_per_param=4)
    assert (dedicated["params"], dedicated["grads"], dedicated["optimizer"]) == (4 * PSI, 4 * PSI, 0)
    assert (dedicated["server_params"], dedicated["server_optimizer"]) == (2 * PSI, 2 * PSI)
    assert dedicated["server_total"] == 4 * PSI


def test_bad_arguments_name_the_fix():
    with pytest.raises(ValueError, match="stages 1, 2 and 3"):
        per_rank(PSI, 2, "sharded")
    with pytest.raises(ValueError, match="one of ring, ps, sharded, none"):
        per_rank(PSI, 2, "zero")


def test_importing_the_formula_loads_no_torch():
    code = "import allreduce_train.distributed.memcost, sys; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"
