"""The GPU check (tools/gpu_check.sh, lab/gpucheck/) end to end in its CPU dry run.

This machine has no GPU: the dry run checks the carried Horovod sdist and that every patch applies
to it, then runs the one-rank runs (four ways, each model's batch and one busy batch) and the three
two-rank jobs on the CPU; the real run differs in the device and in building Horovod first
(docs/gpu.md).
"""

import json
import math
import os
import subprocess
import sys

import pytest

from models import MODELS as MODELS_BY_NAME

from helpers import ROOT as REPO

MODELS = ("lenet5", "resnet18", "ptb-lstm-small")
WAYS = ("trainer", "trainer-bf16-mixed", "trainer-16-mixed", "trainer-exchange", "horovod", "ddp")
OWN_BATCH = 4  # the dry run's --batch-size
BUSY = ("lenet5", 16)  # the dry run's --busy


def env():
    e = dict(os.environ, PYTHON=sys.executable, HWLOC_COMPONENTS="-gl")
    e.pop("OUT", None)
    return e


# Sixteen one-rank processes that import torch and three two-rank jobs (~1 min on an idle 2-core
# machine, many minutes under load); the Horovod loop's hvd.init() starts MPI as a singleton.
@pytest.mark.long  # the whole gpu-check run (~90 s): make test-long, .ci/run
@pytest.mark.mpi
@pytest.mark.timeout(1800)
def test_dry_run_end_to_end(tmp_path):
    proc = subprocess.run(
        ["bash", "tools/gpu_check.sh", "--dry-run"],
        cwd=REPO,
        env={**env(), "OUT": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=1780,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    for step in ("step 1/4", "step 2/4", "step 3/4", "step 4/4"):
        assert step in out
    for patch in ("horovod-0.28.1-cxx17.patch", "horovod-0.28.1-cycle-phase.patch"):
        assert f"patch applies: tools/patches/{patch}" in out
    assert "HOROVOD_GPU_OPERATIONS=NCCL" in out and "HOROVOD_WITHOUT_MPI=1" in out  # the build it would run
    check_dry_run_outputs(tmp_path)


def check_dry_run_outputs(tmp_path):
    """The dry run's gpucheck.json and gpucheck.txt in ``tmp_path`` (what tools/gpu_check.sh --dry-run's runs
    write: its last step, ``python -m lab gpucheck --device cpu`` with the script's dry-run settings)."""
    report = json.loads((tmp_path / "gpucheck.json").read_text())
    rows = {(r["model"], r["way"], r["batch"]): r for r in report["rows"] if r["ranks"] == 1}
    expected = {(m, w, OWN_BATCH) for m in MODELS for w in WAYS} | {(BUSY[0], w, BUSY[1]) for w in WAYS}
    assert set(rows) == expected
    for (model, way, _batch), r in rows.items():
        assert "error" not in r, r
        if way == "trainer-16-mixed":  # float16 autocast with a loss scaler: CUDA only, said, not failed
            assert r["skipped"].startswith("needs CUDA"), r
            continue
        assert r["device"] == "cpu" and r["samples_per_sec"] > 0 and r["step_ms"] > 0
        assert math.isfinite(r["loss_first"]) and math.isfinite(r["loss_last"])
        if model != "ptb-lstm-small" and way in ("horovod", "ddp"):
            # three SGD steps on one fixed batch: the loss falls only if the gradients reached the update
            assert r["loss_last"] < r["loss_first"], r
    for model, batch in [(m, OWN_BATCH) for m in MODELS] + [BUSY]:
        # one worker: Horovod's average and DDP's are the gradient itself, so both loops make the same updates
        hvd, ddp = rows[(model, "horovod", batch)], rows[(model, "ddp", batch)]
        assert math.isclose(hvd["loss_last"], ddp["loss_last"], rel_tol=1e-4), (hvd, ddp)
        # the trainer through Horovod's allreduce: one allreduce per parameter per step, started by
        # the backward hooks (counted as Horovod's optimizer calls them) ...
        exch, alone = rows[(model, "trainer-exchange", batch)], rows[(model, "trainer", batch)]
        n_params = sum(1 for p in MODELS_BY_NAME[model].build().parameters() if p.requires_grad)
        assert exch["allreduces"] == n_params * exch["steps_run"] > 0, exch
        assert "allreduces of cpu gradients" in exch["note"]
        # ... and the average over one rank leaves the training as it is without the exchange
        assert math.isclose(exch["loss_last"], alone["loss_last"], rel_tol=1e-6), (exch, alone)
        # bf16-mixed runs on the CPU: the same seed and batches, so only the autocast can make its losses differ
        bf16 = rows[(model, "trainer-bf16-mixed", batch)]
        assert bf16["precision"] == "bf16-mixed" and alone["precision"] == "32", (bf16, alone)
        assert "precision bf16-mixed" in bf16["note"] and bf16["loss_first"] != alone["loss_first"], (bf16, alone)
    assert "world size 1" in rows[("lenet5", "trainer", OWN_BATCH)]["note"]
    assert "process group gloo" in rows[("lenet5", "ddp", OWN_BATCH)]["note"]
    assert "NCCL built: False" in rows[("lenet5", "horovod", OWN_BATCH)]["note"]  # the CPU venv's Horovod

    # two ranks: each rank trains on its own shard, so their parameters end identical only if the
    # exchange averaged every step's gradients
    pairs = {r["way"]: r for r in report["rows"] if r["ranks"] == 2}
    assert set(pairs) == {"ring-gloo", "ring-mpi", "ps-sync-colocated"}
    for r in pairs.values():
        assert "error" not in r and r["model"] == "lenet5", r
        assert r["world_size"] == 2 and r["params_identical"] is True, r
    assert "Horovod controller gloo" in pairs["ring-gloo"]["note"]

    table = (tmp_path / "gpucheck.txt").read_text()
    # 6 + 6 rows of one rank (two batches), 3 of two ranks, 4 of the per-step accounting against DDP
    assert table.count("| lenet5 |") == 6 + 6 + 3 + 4 and "peak GPU MB (CPU run)" in table
    assert "| lenet5 | trainer, no exchange, 16-mixed | 1 | 4 | - | - | - | - | skipped: needs CUDA" in table
    assert "| lenet5 | trainer, no exchange, bf16-mixed | 1 | 16 |" in table
    line = next(ln for ln in table.splitlines() if ln.startswith("lenet5 batch 16, the trainer's samples/s"))
    assert "bf16-mixed " in line and "x; 16-mixed needs CUDA" in line
    assert "| lenet5 | 16 | trainer, Horovod allreduce |" in table and "| lenet5 | 4 | trainer, no exchange |" in table
    assert (
        "| lenet5 | trainer, no exchange | 1 | 4 |" in table
        and "| lenet5 | trainer, Horovod allreduce | 1 | 16 |" in table
    )
    assert "lenet5: batch 16 is 4x batch 4" in table  # the regime line


@pytest.mark.heavy
def test_without_gpu_the_real_check_says_so():
    proc = subprocess.run(
        [sys.executable, "-m", "lab", "gpucheck", "--models", "lenet5"],
        cwd=REPO,
        env=env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "no GPU visible" in lines[0] and "--dry-run" in lines[0]


@pytest.mark.heavy
def test_unknown_model_is_named():
    proc = subprocess.run(
        [sys.executable, "-m", "lab", "gpucheck", "--device", "cpu", "--models", "lenet5,alexnet"],
        cwd=REPO,
        env=env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2 and "alexnet" in proc.stderr and "resnet18" in proc.stderr


@pytest.mark.heavy
def test_a_bad_busy_batch_is_named():
    proc = subprocess.run(
        [sys.executable, "-m", "lab", "gpucheck", "--device", "cpu", "--busy", "lenet5=big"],
        cwd=REPO,
        env=env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2 and "--busy 'lenet5=big'" in proc.stderr and "MODEL=BATCH" in proc.stderr


@pytest.mark.parametrize("value,expected", [(None, False), ("0", False), ("1", True), ("yes", None)])
def test_exchange_at_one_rank_reads_its_variable(value, expected):
    from allreduce_train.distributed.horovod import exchange_at_one_rank
    from allreduce_train.errors import UserError

    environ = {} if value is None else {"ALLREDUCE_TRAIN_EXCHANGE_AT_ONE_RANK": value}
    if expected is None:
        with pytest.raises(UserError, match="ALLREDUCE_TRAIN_EXCHANGE_AT_ONE_RANK='yes': use 1"):
            exchange_at_one_rank(environ)
    else:
        assert exchange_at_one_rank(environ) is expected
