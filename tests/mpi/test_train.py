"""Real ranks under mpirun: properties that hold only if Horovod really exchanged gradients."""

import json

import pytest
import torch

from helpers import (
    FASHION_MNIST_DIR,
    SHARED_RUN,
    check,
    launch,
    load_params,
    needs_fashion_mnist,
    rel_diff,
    run_args,
    run_single,
    write_split,
)

pytestmark = pytest.mark.mpi


def test_two_ranks_end_bit_identical_and_equal_one_process_with_double_batch(sync_run, one_process_run):
    """(With weight decay and momentum: tests/mpi/test_ring_engine.py's Horovod runs at 2, 3 and 4 ranks.)"""
    r0, r1 = load_params(sync_run / "sync-0.pt"), load_params(sync_run / "sync-1.pt")
    for k in r0:
        assert torch.equal(r0[k], r1[k]), f"{k} differs between ranks"
    # one process never goes through Horovod's optimizer wrapper: plain torch SGD as the reference
    single = load_params(one_process_run / "one-0.pt")
    assert rel_diff(r0, single) <= 1e-5
    # ... and training moved the parameters far more than that tolerance
    check(run_single(SHARED_RUN + run_args(one_process_run, "short", "--batch-size", "32", "--steps", "1")))
    assert rel_diff(load_params(one_process_run / "short-0.pt"), single) > 1e-2


def test_without_the_exchange_the_same_ranks_diverge(alone_run):
    """The control for the test above: the same 2-rank run (same seed, so the same initial parameters;
    each rank on its own shard) with the gradient exchange turned off ends with different parameters on
    the ranks, so their bit-identity above comes from the exchange, not from the seed (tests/mpi/conftest.py's
    alone_run)."""
    r0, r1 = load_params(alone_run / "alone-0.pt"), load_params(alone_run / "alone-1.pt")
    assert rel_diff(r0, r1) > 1e-3


def test_resume_continues_exactly(tmp_path, sync_run):
    """Cut at step 9 and resumed, the run ends where the uncut sync_run (the same flags) ends, bit for bit."""
    args = SHARED_RUN + ["--batch-size", "16"]
    first = check(launch(2, args + run_args(tmp_path, "cut", "--exit-after-steps", "9")))
    assert (tmp_path / "cut" / "checkpoint.pt").exists()
    saved = torch.load(tmp_path / "cut" / "checkpoint.pt", weights_only=True)
    assert saved["step"] == 9
    metrics = json.loads((tmp_path / "cut" / "metrics.json").read_text())
    assert metrics["steps"] == 9 and metrics["completed"] is False, first.stdout
    check(launch(2, args + run_args(tmp_path, "cut", "--resume", "auto")))
    full, resumed = load_params(sync_run / "sync-0.pt"), load_params(tmp_path / "cut-0.pt")
    for k in full:
        assert torch.equal(full[k], resumed[k]), k
    assert json.loads((tmp_path / "cut" / "metrics.json").read_text())["steps"] == 20


def test_tensorboard_tags_and_metrics_json(sync_run):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run = sync_run / "sync"
    acc = EventAccumulator(str(run))
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    for tag in (
        "train/loss",
        "train/lr",
        "perf/samples_per_sec",
        "perf/step_ms",
        "comm/wait_ms",
        "eval/loss",
        "eval/accuracy",
    ):
        assert tag in tags, tag
    assert [e.step for e in acc.Scalars("eval/accuracy")] == [10, 20]
    assert "config/text_summary" in acc.Tags()["tensors"]
    m = json.loads((run / "metrics.json").read_text())
    for key in (
        "strategy",
        "world_size",
        "workers",
        "model",
        "dataset",
        "global_batch",
        "steps",
        "samples_per_sec",
        "step_ms",
    ):
        assert key in m, key
    assert (m["strategy"], m["world_size"], m["workers"], m["global_batch"], m["steps"]) == ("allreduce", 2, 2, 32, 20)
    assert m["samples_per_sec"] > 0 and m["step_ms"] > 0
    assert set(m["final"]) == {"train_loss", "eval_loss", "eval_accuracy"}
    assert sorted(p.name for p in run.iterdir() if p.name.startswith("events")) and not any(
        p.name.startswith("events") for p in sync_run.iterdir()
    )  # one TensorBoard writer, in the run dir


def test_global_eval_is_not_rank0s_share(sync_run, one_process_run):
    """Evaluation over 2 ranks must score the same samples as 1 process: the whole set (205 samples,
    which 2 ranks cannot split evenly), on parameters within 1e-5 of each other."""
    m2 = json.loads((sync_run / "sync" / "metrics.json").read_text())["final"]
    m1 = json.loads((one_process_run / "one" / "metrics.json").read_text())["final"]
    assert m2["eval_accuracy"] == pytest.approx(m1["eval_accuracy"], abs=1e-9)
    assert m2["eval_loss"] == pytest.approx(m1["eval_loss"], rel=1e-4)


@needs_fashion_mnist
def test_loss_falls_on_real_fashion_mnist(tmp_path):
    check(
        launch(
            2,
            [
                "--run-dir",
                str(tmp_path),
                "--name",
                "fm",
                "--steps",
                "150",
                "--no-progress",
                "--log-every",
                "10",
                "--eval-every",
                "150",
                "--data-dir",
                FASHION_MNIST_DIR,
            ],
        )
    )
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(tmp_path / "fm"))
    acc.Reload()
    losses = [e.value for e in acc.Scalars("train/loss")]
    assert losses[-1] < 0.6 * losses[0]
    assert json.loads((tmp_path / "fm" / "metrics.json").read_text())["final"]["eval_accuracy"] > 0.7


@pytest.mark.parametrize(
    "args, needle",
    [
        (["--data-dir", "/nonexistent/fmnist"], "/nonexistent/fmnist"),
        # config errors end every rank the same way: one under mpirun here, each flag's message in
        # tests/unit/test_config.py (--lr -0.1 among them)
        (["--model", "nosuchnet"], "--model"),
        (["--dataset", "synthetic", "--synthetic-samples", "100", "--batch-size", "64"], "fewer than one global batch"),
        (["--resume", "/nonexistent/ckpt.pt", "--dataset", "synthetic"], "/nonexistent/ckpt.pt"),
    ],
)
def test_bad_input_one_line_nonzero_exit_no_hang(tmp_path, args, needle):
    proc = launch(2, args + ["--run-dir", str(tmp_path)], timeout=60)
    assert proc.returncode != 0
    ours = [ln for ln in proc.stderr.splitlines() if ln.startswith("allreduce_train: error")]
    assert len(ours) == 1, proc.stderr
    assert needle in ours[0]


def test_corrupt_idx_file_is_named(tmp_path):

    d = tmp_path / "fm"
    d.mkdir()
    write_split(d, "train", 64)
    write_split(d, "t10k", 16)
    (d / "t10k-images-idx3-ubyte.gz").write_bytes(b"\x1f\x8bnot really gzip")
    proc = launch(2, ["--data-dir", str(d), "--run-dir", str(tmp_path), "--batch-size", "8"], timeout=60)
    assert proc.returncode != 0
    ours = [ln for ln in proc.stderr.splitlines() if ln.startswith("allreduce_train: error")]
    assert len(ours) == 1 and "t10k-images-idx3-ubyte.gz" in ours[0], proc.stderr
