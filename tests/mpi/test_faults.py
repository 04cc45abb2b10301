"""Faults injected into real jobs through the launcher: frozen ranks, preemption, divergence.

Every case asserts what docs/faults.md promises: the job ends (or stops cleanly) with its
documented exit code and one line that says what happened, no rank is left behind, and a
checkpoint is never lost or replaced by a bad one.
"""

from __future__ import annotations

import os
import shutil
import signal
import time
from pathlib import Path

import pytest
import torch

from helpers import LM, LM_STEPS, QUICK, SHARED_RUN, Job, check, job_pids, launch, load_params

pytestmark = pytest.mark.mpi

STALL = "6"  # --stall-timeout in these tests (the default is 120 s)


@pytest.mark.parametrize(
    "strategy, np, frozen",
    [
        # the main rank frozen, and a PS worker: the long tier (make test under 20 min; CI runs it)
        pytest.param("mpi", 2, 0, marks=pytest.mark.long),
        ("mpi", 2, 1),
        pytest.param("gloo", 2, 0, marks=pytest.mark.long),
        ("gloo", 2, 1),
        ("ps-server", 3, 0),
        pytest.param("ps-worker", 3, 2, marks=pytest.mark.long),
        ("ring-mpi", 2, 1),
        # a checkpoint every step: the main worker is often fetching the optimizer state from the
        # server when it freezes, a step behind the other worker, and must not be named for that
        ("ps-server-ckpt", 3, 0),
    ],
)
def test_a_frozen_rank_ends_the_job_naming_it(tmp_path, strategy, np, frozen):
    """SIGSTOP one rank mid-training: Open MPI sees nothing wrong, the peers block in a collective
    (or a parameter server's wait); only the stall watchdog can end the job."""
    args = (
        ["--horovod-backend", strategy]
        if strategy in ("mpi", "gloo")
        else ["--allreduce-engine", "mpi"]
        if strategy == "ring-mpi"
        else ["--strategy", "ps", "--ps-placement", "dedicated"]
    )
    if strategy == "ps-server-ckpt":
        args += ["--checkpoint-every", "1"]
    tag = f"{os.getpid()}-{strategy}-{frozen}"
    job = Job(
        np,
        QUICK + args + ["--steps", "100000", "--stall-timeout", STALL, "--run-dir", str(tmp_path)],
        tag,
        oversubscribe=np > 2,
    )
    try:
        job.wait_for(", from step 0")
        time.sleep(1.0)  # well into the training loop
        os.kill(job_pids(tag)[frozen], signal.SIGSTOP)
        rc = job.finish(timeout=float(STALL) + 60)
        left = job.kill_leftovers()
    finally:
        job.kill_leftovers()
    err = "".join(job.err)
    said = [ln for ln in err.splitlines() if "stalled at step" in ln]
    assert rc == 69, job.text()
    assert len(said) == 1 and f"rank(s) {frozen} did not arrive" in said[0], job.text()
    assert left == [], f"ranks {left} survived the job"


def test_a_killed_parameter_server_ends_the_job(tmp_path):
    """kill -9 (the out-of-memory killer) of the dedicated server: mpirun ends the job at once."""
    tag = f"{os.getpid()}-killed-server"
    job = Job(3, QUICK + ["--strategy", "ps", "--steps", "100000", "--run-dir", str(tmp_path)], tag, oversubscribe=True)
    try:
        job.wait_for(", from step 0")
        time.sleep(1.0)
        os.kill(job_pids(tag)[0], signal.SIGKILL)
        rc = job.finish(timeout=60)
        left = job.kill_leftovers()
    finally:
        job.kill_leftovers()
    assert rc == 128 + signal.SIGKILL, job.text()
    assert left == [], f"ranks {left} survived the job"


def dump(tmp_path: Path, name: str) -> list[str]:
    return ["--name", name, "--dump-params", str(tmp_path / f"{name}-{{rank}}.pt")]


def assert_same_params(a: Path, b: Path) -> None:
    pa, pb = load_params(a), load_params(b)
    for k in pa:
        assert torch.equal(pa[k], pb[k]), f"{k} differs"


def test_sigterm_to_the_launcher_checkpoints_exits_75_and_resume_is_bit_identical(tmp_path):
    """What a scheduler's preemption does: SIGTERM to the job's main process. The launcher turns it
    into SIGUSR1 for mpirun, every rank finishes the same step, rank 0 saves, all exit 75."""
    args = QUICK + ["--run-dir", str(tmp_path)]
    tag = f"{os.getpid()}-preempt"
    job = Job(2, args + ["--name", "cut", "--steps", "100000"], tag)
    try:
        job.wait_for(", from step 0")
        time.sleep(1.0)
        job.proc.send_signal(signal.SIGTERM)
        rc = job.finish(timeout=60)
    finally:
        job.kill_leftovers()
    assert rc == 75, job.text()
    said = [ln for ln in "".join(job.err).splitlines() if "preempted" in ln]
    saved = torch.load(tmp_path / "cut" / "checkpoint.pt", weights_only=True)
    step = saved["step"]
    assert len(said) == 1 and f"after step {step};" in said[0], job.text()
    assert 0 < step < 100000
    # the same command with --resume auto continues: its end equals an uninterrupted run's, bit for bit
    end = str(step + 12)
    check(launch(2, args + dump(tmp_path, "cut") + ["--steps", end, "--resume", "auto"]))
    check(launch(2, args + dump(tmp_path, "ref") + ["--steps", end]))
    assert_same_params(tmp_path / "cut-0.pt", tmp_path / "ref-0.pt")


def test_a_stop_signal_to_one_rank_stops_every_rank_at_the_same_step(tmp_path):
    """SIGUSR1 to rank 1 alone (a node's agent, a kubelet): the per-step vote carries it to rank 0."""
    tag = f"{os.getpid()}-one-rank"
    job = Job(2, QUICK + ["--run-dir", str(tmp_path), "--name", "one", "--steps", "100000"], tag)
    try:
        job.wait_for(", from step 0")
        time.sleep(1.0)
        os.kill(job_pids(tag)[1], signal.SIGUSR1)
        rc = job.finish(timeout=60)
    finally:
        job.kill_leftovers()
    assert rc == 75, job.text()
    step = torch.load(tmp_path / "one" / "checkpoint.pt", weights_only=True)["step"]
    assert f"preempted (a signal to another rank) after step {step};" in "".join(job.err), job.text()


@pytest.mark.long
def test_sigterm_to_an_init_scripts_job_ends_75_after_the_scripts_own_checkpoint(tmp_path):
    """A script with its own loop through init() (examples/own_loop.py): SIGTERM to the launcher; the
    script's stop_requested() says so on every worker after the same step, rank 0 writes the script's
    checkpoint, exit_preempted() ends every rank with 75; its --resume auto ends bit-identical to a run
    never stopped."""
    script = ["--script", "examples/own_loop.py"]
    args = ["--allreduce-engine", "mpi", "--seed", "3", "--run-dir", str(tmp_path)]
    tag = f"{os.getpid()}-init-preempt"
    job = Job(2, args + dump(tmp_path, "cut") + ["--steps", "100000"], tag, launcher=script)
    try:
        job.wait_for("step 20: loss")
        job.proc.send_signal(signal.SIGTERM)
        rc = job.finish(timeout=60)
    finally:
        job.kill_leftovers()
    assert rc == 75, job.text()
    said = [ln for ln in "".join(job.err).splitlines() if "preempted" in ln]
    saved = torch.load(tmp_path / "cut" / "checkpoint.pt", weights_only=True)
    step = saved["step"]
    assert said == [f"allreduce_train: preempted (SIGUSR1) after step {step}"], job.text()
    assert 20 <= step < 100000
    # both workers stopped after the same step: the parameters they hold are the checkpoint's
    for rank in (0, 1):
        held = load_params(tmp_path / f"cut-{rank}.pt")
        assert all(torch.equal(held[k], saved["model"][k]) for k in held), rank
    end = str(step + 40)  # over an epoch's end (32 steps of 2 x 64 samples)
    check(launch(2, args + dump(tmp_path, "cut") + ["--steps", end, "--resume", "auto"], launcher=script))
    check(launch(2, args + dump(tmp_path, "ref") + ["--steps", end], launcher=script))
    assert_same_params(tmp_path / "cut-0.pt", tmp_path / "ref-0.pt")
    assert_same_params(tmp_path / "cut-1.pt", tmp_path / "ref-0.pt")


def test_divergence_exits_65_naming_the_step_and_keeps_a_good_checkpoint(tmp_path, sync_run):
    """Resumed from the good checkpoint of tests/mpi/conftest.py's sync_run (step 20, batch 16)."""
    (tmp_path / "div").mkdir()
    shutil.copy(sync_run / "sync" / "checkpoint.pt", tmp_path / "div" / "checkpoint.pt")
    args = SHARED_RUN + ["--batch-size", "16", "--run-dir", str(tmp_path), "--name", "div"]
    # a LR that blows up at once; a checkpoint after every step tempts the trainer to save the wreck
    proc = launch(
        2, args + ["--steps", "200", "--resume", "auto", "--lr", "1e8", "--checkpoint-every", "1"], timeout=120
    )
    assert proc.returncode == 65, proc.stderr
    said = [ln for ln in proc.stderr.splitlines() if "diverged at step" in ln]
    assert len(said) == 1, proc.stderr
    diverged = int(said[0].split("diverged at step ")[1].split(":")[0])
    saved = torch.load(tmp_path / "div" / "checkpoint.pt", weights_only=True)
    assert 20 <= saved["step"] < diverged
    assert all(torch.isfinite(t).all() for t in saved["model"].values())


def test_lstm_mid_epoch_resume_is_bit_identical(tmp_path, lstm_run):
    """The hidden state carried between windows is part of the checkpoint: without it a resumed
    language model starts the rest of the epoch from zeros and ends elsewhere (the uncut run:
    tests/mpi/conftest.py's lstm_run)."""
    args = LM + LM_STEPS + ["--data-dir", str(lstm_run / "corpus"), "--batch-size", "4", "--run-dir", str(tmp_path)]
    first = check(launch(2, args + ["--name", "cut", "--exit-after-steps", "5"]))
    spe = int(first.stdout.split("steps (")[1].split("/epoch")[0])
    assert 5 % spe and spe > 5, f"step 5 must be mid-epoch ({spe} steps per epoch)"
    check(launch(2, args + dump(tmp_path, "cut") + ["--resume", "auto"]))
    assert_same_params(tmp_path / "cut-0.pt", lstm_run / "np2-0.pt")
