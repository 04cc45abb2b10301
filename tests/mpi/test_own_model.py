"""A user's own model, data and task from a package outside this repository (a temporary directory on
PYTHONPATH), trained by real ranks under mpirun: the properties that hold for the built-in models hold
for it -- bit-identical parameters on every rank, equality with one process at the double batch under
every engine, a bit-exact resume that restores the task's own state -- and the examples run."""

import json
import math
import os
import subprocess
import sys

import pytest
import torch

from helpers import ROOT, check, load_params, rel_diff, run_args, write_user_package

pytestmark = pytest.mark.mpi

# As tests/helpers.SHARED_RUN, on the user's data: 2,050 lazily made samples, 205 to evaluate
RUN = [
    "--model",
    "userpkg.net:build",
    "--model-arg",
    "hidden=16",
    "--dataset",
    "userpkg.data:build",
    "--no-progress",
    "--log-every",
    "5",
    "--warmup-steps",
    "0",
    "--no-scale-lr",
    "--lr",
    "0.05",
    "--steps",
    "20",
    "--eval-every",
    "10",
    "--checkpoint-every",
    "7",
]
TASK = ["--task", "userpkg.task:build", *RUN[6:]]  # the stateful task (same model and data)


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    site = write_user_package(tmp_path_factory.mktemp("site"))
    return {**os.environ, "PYTHONPATH": str(site), "OMP_NUM_THREADS": "1"}


def launch(env, np, args, launcher=(), timeout=300):
    cmd = [sys.executable, "-m", "launch", "-np", str(np), *launcher, "--", *args]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout, env=env)


def single(env, args, timeout=300):
    cmd = [sys.executable, "-m", "allreduce_train", "train", *args]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout, env=env)


@pytest.fixture(scope="module")
def runs(env, tmp_path_factory):
    """The user's code under each engine at 2 ranks (batch 16) and in one process (batch 32)."""
    d = tmp_path_factory.mktemp("own")
    check(launch(env, 2, TASK + run_args(d, "hvd", "--batch-size", "16")))
    check(
        launch(
            env, 2, RUN + run_args(d, "ring", "--batch-size", "16", "--allreduce-engine", "mpi", "--data-workers", "2")
        )
    )
    check(
        launch(env, 2, RUN + run_args(d, "ps", "--batch-size", "16", "--strategy", "ps", "--ps-placement", "colocated"))
    )
    check(single(env, RUN + run_args(d, "one", "--batch-size", "32")))
    check(single(env, TASK + run_args(d, "onetask", "--batch-size", "32")))
    return d


@pytest.mark.parametrize("name,reference", [("hvd", "onetask"), ("ring", "one"), ("ps", "one")])
def test_own_model_ranks_end_bit_identical_and_equal_one_process(runs, name, reference):
    r0, r1 = load_params(runs / f"{name}-0.pt"), load_params(runs / f"{name}-1.pt")
    for k in r0:
        assert torch.equal(r0[k], r1[k]), f"{name}: {k} differs between ranks"
    assert rel_diff(r0, load_params(runs / f"{reference}-0.pt")) <= 1e-5
    m = json.loads((runs / name / "metrics.json").read_text())
    assert m["steps"] == 20 and set(m["final"]) >= {"eval_loss", "eval_accuracy"}


def test_own_model_trained_and_logged_like_a_built_in_one(runs):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(runs / "hvd"))
    acc.Reload()
    assert {"train/loss", "eval/loss", "eval/accuracy", "eval/seen_mod", "perf/samples_per_sec"} <= set(
        acc.Tags()["scalars"]
    )
    m = json.loads((runs / "hvd" / "metrics.json").read_text())
    assert m["model"] == "userpkg.task:build" and m["final"]["eval_seen_mod"] == 20 % 4
    assert json.loads((runs / "ring" / "metrics.json").read_text())["model"] == "userpkg.net:build"
    assert [r["rank"] for r in m["ranks"]] == [0, 1] and all(r["peak_rss_mib"] > 50 for r in m["ranks"])


def test_own_task_resumes_bit_exactly_with_its_own_state(env, runs, tmp_path):
    args = TASK + ["--batch-size", "16"]
    check(launch(env, 2, args + run_args(tmp_path, "cut", "--exit-after-steps", "9")))
    saved = torch.load(tmp_path / "cut" / "checkpoint.pt", weights_only=True)
    assert [w["task"] for w in saved["workers"]] == [{"seen": 9}, {"seen": 9}]  # the check's batch not counted
    check(launch(env, 2, args + run_args(tmp_path, "cut", "--resume", "auto")))
    full, resumed = load_params(runs / "hvd-0.pt"), load_params(tmp_path / "cut-0.pt")
    for k in full:
        assert torch.equal(full[k], resumed[k]), k


# PowerSGD at rank 4 on the user's MLP: with 4 hidden units no matrix shrinks ((n + m) 4 is never under half of
# n m), so every tensor travels uncompressed; with 16 the first layer's 16 x 784 is compressed, the 10 x 16 not
PSGD4 = ["--compression", "powersgd", "--powersgd-rank", "4"]
MLP4 = [*RUN[:2], "--model-arg", "hidden=4", *RUN[4:]]


@pytest.fixture(scope="module")
def mlp4_one(env, tmp_path_factory):
    """The 4-unit MLP in one process at the double batch: where exact averaging ends."""
    d = tmp_path_factory.mktemp("mlp4")
    check(single(env, MLP4 + run_args(d, "one", "--batch-size", "32")))
    return load_params(d / "one-0.pt")


@pytest.mark.parametrize("engine", ["horovod", "mpi", "torch"])
def test_powersgd_on_a_model_with_no_matrix_to_compress_averages_exactly_on_every_engine(
    env, tmp_path, mlp4_one, engine
):
    check(launch(env, 2, MLP4 + PSGD4 + run_args(tmp_path, "p", "--batch-size", "16", "--allreduce-engine", engine)))
    r0, r1 = load_params(tmp_path / "p-0.pt"), load_params(tmp_path / "p-1.pt")
    assert all(torch.equal(r0[k], r1[k]) for k in r0)
    # every gradient travelled as it is: the run ends where one process at the double batch does
    assert rel_diff(r0, mlp4_one) <= 1e-5


def test_powersgd_on_a_model_with_some_matrices_to_compress_trains_alike_on_every_rank(env, tmp_path, runs):
    check(launch(env, 2, RUN + PSGD4 + run_args(tmp_path, "p", "--batch-size", "16")))
    r0, r1 = load_params(tmp_path / "p-0.pt"), load_params(tmp_path / "p-1.pt")
    assert all(torch.equal(r0[k], r1[k]) for k in r0)
    assert rel_diff(r0, load_params(runs / "one-0.pt")) > 1e-4  # the 16 x 784 layer went as rank-4 factors
    evals = [e["eval_loss"] for e in json.loads((tmp_path / "p" / "metrics.json").read_text())["evals"]]
    assert len(evals) == 2 and evals[-1] < evals[0]


def test_gpt_example_loss_falls_under_the_trainer(env, tmp_path):
    args = [
        "--task",
        "examples.gpt.task:build",
        "--model-arg",
        "max_chars=300000",
        "--model-arg",
        "block=32",
        "--steps",
        "40",
        "--eval-every",
        "10",
        "--batch-size",
        "16",
        "--lr",
        "0.1",
        "--warmup-steps",
        "10",
        "--no-progress",
        "--allreduce-engine",
        "mpi",
    ]
    check(launch(env, 2, args + run_args(tmp_path, "gpt")))
    m = json.loads((tmp_path / "gpt" / "metrics.json").read_text())
    evals = [e["eval_loss"] for e in m["evals"]]
    sys.path.insert(0, str(ROOT))
    from examples.gpt.task import CharGPT

    chance = math.log(len(CharGPT(max_chars=300000).chars))  # the loss of uniform guessing, where it starts
    assert len(evals) == 4 and evals[-1] < evals[0] - 0.05 and evals[-1] < chance - 0.4, (evals, chance)
    assert "eval_perplexity" in m["final"] and m["words_per_sec"] > 0
    r0, r1 = load_params(tmp_path / "gpt-0.pt"), load_params(tmp_path / "gpt-1.pt")
    assert all(torch.equal(r0[k], r1[k]) for k in r0)


def test_script_through_fit_runs_the_trainers_loop(env, tmp_path):
    args = ["--max-chars", "100000", "--steps", "6", "--batch-size", "8", "--no-progress", "--checkpoint-every", "3"]
    check(launch(env, 2, args + run_args(tmp_path, "fit"), launcher=["--script", "examples/gpt/train.py"]))
    assert (tmp_path / "fit" / "checkpoint.pt").exists() and (tmp_path / "fit" / "metrics.json").exists()
    r0, r1 = load_params(tmp_path / "fit-0.pt"), load_params(tmp_path / "fit-1.pt")
    assert all(torch.equal(r0[k], r1[k]) for k in r0)


def test_own_loop_through_the_api_equals_one_process(env, tmp_path):
    """examples/own_loop.py: 2 workers of batch 64 at LR 2 x 0.01 against one process of batch 128 at 0.02."""
    script = str(ROOT / "examples" / "own_loop.py")
    flags = ["--allreduce-engine", "mpi", "--steps", "30", "--seed", "3"]
    out = check(
        launch(env, 2, [*flags, "--dump-params", str(tmp_path / "loop-{rank}.pt")], launcher=["--script", script])
    )
    assert "mean over 2 workers" in out.stdout
    check(
        subprocess.run(
            [
                sys.executable,
                script,
                *flags,
                "--batch-size",
                "128",
                "--lr",
                "0.02",
                "--dump-params",
                str(tmp_path / "single-{rank}.pt"),
            ],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
            env=env,
        )
    )
    r0, r1 = load_params(tmp_path / "loop-0.pt"), load_params(tmp_path / "loop-1.pt")
    assert all(torch.equal(r0[k], r1[k]) for k in r0)
    assert rel_diff(r0, load_params(tmp_path / "single-0.pt")) <= 1e-5


@pytest.mark.long  # one more 2-rank job of the same script (~15 s)
def test_own_loop_under_shard_stage_3_dumps_the_rings_parameters(env, tmp_path):
    """examples/own_loop.py with --strategy sharded --shard-stage 3: each worker holds only its shards between
    steps; comm.whole_parameters() before the dump gathers them, and they are the ring's bit for bit (2 ranks:
    the same sum, an elementwise optimizer)."""
    script = str(ROOT / "examples" / "own_loop.py")
    flags = ["--allreduce-engine", "mpi", "--steps", "30", "--seed", "3"]
    for name, extra in (("ring", []), ("zero3", ["--strategy", "sharded", "--shard-stage", "3"])):
        dump = str(tmp_path / f"{name}-{{rank}}.pt")
        check(launch(env, 2, [*flags, *extra, "--dump-params", dump], launcher=["--script", script]))
    z0, z1, ring = (load_params(tmp_path / f) for f in ("zero3-0.pt", "zero3-1.pt", "ring-0.pt"))
    assert all(torch.isfinite(z0[k]).all() and torch.equal(z0[k], z1[k]) for k in z0)
    assert all(torch.equal(z0[k], ring[k]) for k in ring)
