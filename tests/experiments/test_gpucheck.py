"""The GPU check (tools/gpu_check.sh, experiments/gpucheck.py) end to end in its CPU dry run.

This machine has no GPU: the dry run checks the carried Horovod sdist and that every patch applies
to it, then runs the nine (model, way) runs on the CPU; the real run differs in the device and in
building Horovod first (docs/gpu.md).
"""

import json
import math
import os
import subprocess
import sys

import pytest

from helpers import ROOT as REPO

MODELS = ("lenet5", "resnet18", "ptb-lstm-small")
WAYS = ("trainer", "horovod", "ddp")


def env():
    e = dict(os.environ, PYTHON=sys.executable, HWLOC_COMPONENTS="-gl")
    e.pop("OUT", None)
    return e


# Nine processes that import torch (~25 s on an idle 2-core machine, minutes under load); the
# Horovod loop's hvd.init() starts MPI as a singleton.
@pytest.mark.slow
@pytest.mark.mpi
@pytest.mark.timeout(900)
def test_dry_run_end_to_end(tmp_path):
    proc = subprocess.run(["bash", "tools/gpu_check.sh", "--dry-run"], cwd=REPO, env={**env(), "OUT": str(tmp_path)},
                          capture_output=True, text=True, timeout=880)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    for step in ("step 1/4", "step 2/4", "step 3/4", "step 4/4"):
        assert step in out
    for patch in ("horovod-0.28.1-cxx17.patch", "horovod-0.28.1-cycle-phase.patch"):
        assert f"patch applies: tools/patches/{patch}" in out
    assert "HOROVOD_GPU_OPERATIONS=NCCL" in out and "HOROVOD_WITHOUT_MPI=1" in out  # the build it would run

    report = json.loads((tmp_path / "gpucheck.json").read_text())
    rows = {(r["model"], r["way"]): r for r in report["rows"]}
    assert set(rows) == {(m, w) for m in MODELS for w in WAYS}
    for (model, way), r in rows.items():
        assert "error" not in r, r
        assert r["device"] == "cpu" and r["samples_per_sec"] > 0 and r["step_ms"] > 0
        assert math.isfinite(r["loss_first"]) and math.isfinite(r["loss_last"])
        if model != "ptb-lstm-small" and way != "trainer":
            # three SGD steps on one fixed batch: the loss falls only if the gradients reached the update
            assert r["loss_last"] < r["loss_first"], r
    for model in MODELS:
        # one worker: Horovod's average and DDP's are the gradient itself, so both loops make the same updates
        hvd, ddp = rows[(model, "horovod")], rows[(model, "ddp")]
        assert math.isclose(hvd["loss_last"], ddp["loss_last"], rel_tol=1e-4), (hvd, ddp)
    assert "world size 1" in rows[("lenet5", "trainer")]["note"]
    assert "process group gloo" in rows[("lenet5", "ddp")]["note"]
    assert "NCCL built: False" in rows[("lenet5", "horovod")]["note"]  # the CPU venv's Horovod
    table = (tmp_path / "gpucheck.txt").read_text()
    assert table.count("| lenet5 |") == 3 and "peak GPU MB (CPU run)" in table


def test_without_gpu_the_real_check_says_so():
    proc = subprocess.run([sys.executable, "-m", "allreduce_train.experiments", "gpucheck", "--models", "lenet5"],
                          cwd=REPO, env=env(), capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "no GPU visible" in lines[0] and "--dry-run" in lines[0]


def test_unknown_model_is_named():
    proc = subprocess.run([sys.executable, "-m", "allreduce_train.experiments", "gpucheck", "--device", "cpu",
                           "--models", "lenet5,alexnet"], cwd=REPO, env=env(), capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 2 and "alexnet" in proc.stderr and "resnet18" in proc.stderr
