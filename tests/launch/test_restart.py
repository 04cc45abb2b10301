"""``python -m launch --max-restarts N``: a failed job is relaunched with --resume auto and ends as
if nothing had happened."""

import json
import os
import re
import signal
import time

import pytest
import torch

from helpers import QUICK, Job, check, job_pids, launch, load_params

pytestmark = pytest.mark.mpi


def test_a_killed_rank_restarts_from_the_checkpoint_and_ends_bit_identical(tmp_path):
    args = QUICK + ["--run-dir", str(tmp_path), "--steps", "300", "--checkpoint-every", "10"]
    tag = f"{os.getpid()}-restart"
    job = Job(
        2,
        args + ["--name", "hit", "--dump-params", str(tmp_path / "hit-{rank}.pt")],
        tag,
        launcher=["--max-restarts", "2"],
    )
    try:
        deadline = time.monotonic() + 240
        while not (tmp_path / "hit" / "checkpoint.pt").exists():  # the first checkpoint is there: kill a rank
            assert job.proc.poll() is None and time.monotonic() < deadline, job.text()
            time.sleep(0.1)
        os.kill(job_pids(tag)[1], signal.SIGKILL)
        rc = job.finish(timeout=300)
    finally:
        job.kill_leftovers()
    err = "".join(job.err)
    assert rc == 0, job.text()
    assert "exit 137 (a rank was killed by SIGKILL); restart 1 of 2 with --resume auto" in err, job.text()
    assert "restart 2 of 2" not in err
    starts = [int(n) for n in re.findall(r", from step (\d+)", "".join(job.out))]
    assert len(starts) == 2 and starts[0] == 0 and starts[1] > 0 and starts[1] % 10 == 0, starts  # from a checkpoint
    assert json.loads((tmp_path / "hit" / "metrics.json").read_text())["steps"] == 300
    check(launch(2, args + ["--name", "ref", "--dump-params", str(tmp_path / "ref-{rank}.pt")]))
    got, ref = load_params(tmp_path / "hit-0.pt"), load_params(tmp_path / "ref-0.pt")
    for k in ref:
        assert torch.equal(got[k], ref[k]), f"{k} differs from the uninterrupted run"


def test_what_cannot_succeed_is_not_restarted(tmp_path):
    proc = launch(
        2,
        ["--dataset", "synthetic", "--lr", "-1", "--run-dir", str(tmp_path)],
        timeout=120,
        launcher=["--max-restarts", "3"],
    )
    assert proc.returncode == 2 and "restart" not in proc.stderr, proc.stderr
