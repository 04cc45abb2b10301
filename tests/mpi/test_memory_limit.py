"""A model that fits a per-rank memory limit only sharded (``make bench-memory``'s fit run, at 2 ranks).

Under an RLIMIT_AS set on mpirun and every rank (lab/memory/limited.py), between what the ring needs by the
ZeRO formula and what stage 3 needs: the ring is refused before its first step, on every rank alike, with
one line naming the need, the limit and the stages that fit (exit 2, no traceback, no rank left running);
the same limit with a stage that fits by the formula trains (stage 3: the gradient shards freed between
steps, and a checkpoint of one file per worker's shard, no state gathered onto rank 0)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from allreduce_train.distributed.memcost import per_rank
from lab.memory.model import parameters

from helpers import ROOT, check, run_args

pytestmark = [pytest.mark.mpi, pytest.mark.long]  # a 87M-parameter model built on 2 ranks (~30 s each)

WIDTH, DEPTH = 4096, 6  # 87M parameters: 0.32 GiB, whose AdamW run needs 0.97 GiB more by the formula at 2 ranks
# a rank's virtual memory before its model (~0.9-1.0 GiB here), the model, and 0.5 GiB: under the 0.97 GiB
# the ring needs beyond the model, over stage 3's 0.32 GiB (0.65 GiB per rank at 2 ranks, the model's 0.32 in it)
LIMIT = int((1.0 + 4 * parameters(WIDTH, DEPTH) / (1 << 30) + 0.5) * (1 << 30))
MODEL = ["--model", "lab.memory.model:build", "--model-arg", f"width={WIDTH}", "--model-arg", f"depth={DEPTH}"]
MODEL += ["--dataset", "lab.memory.model:data", "--optimizer", "adamw", "--batch-size", "16", "--no-progress"]


def limited(np_: int, args: list[str]) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "lab.memory.limited", str(LIMIT), "--", sys.executable, "-m", "launch"]
    cmd += ["-np", str(np_), "--", *MODEL, *args]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)


def test_the_ring_over_its_limit_is_refused_in_one_line_naming_the_stages_that_fit(tmp_path):
    proc = limited(2, ["--allreduce-engine", "mpi", "--steps", "2", *run_args(tmp_path, "ring")])
    assert proc.returncode == 2, proc.stderr[-3000:]
    errors = [ln for ln in proc.stderr.splitlines() if "error" in ln]
    assert len(errors) == 1 and errors[0].startswith("allreduce_train: error: memory: --strategy allreduce needs")
    line = errors[0]
    assert f"for {parameters(WIDTH, DEPTH):,} parameters, 8 bytes of AdamW state each, 2 worker(s)" in line
    assert f"under RLIMIT_AS {LIMIT / (1 << 30):.2f} GiB" in line
    assert "--strategy sharded fits with --shard-stage" in line
    stage3 = per_rank(parameters(WIDTH, DEPTH), 2, "sharded", stage=3)["total"]  # (4 + 4 + 8) / 2 bytes each
    assert f"3 ({stage3 / (1 << 30):.2f} GiB)" in line
    assert "Traceback" not in proc.stderr and not (tmp_path / "ring").exists()


def test_the_same_limit_trains_sharded_at_stage_3(tmp_path):
    flags = ["--strategy", "sharded", "--shard-stage", "3", "--allreduce-engine", "mpi", "--steps", "2"]
    check(limited(2, flags + run_args(tmp_path, "zero3")))
