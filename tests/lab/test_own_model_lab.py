"""The lab takes a user's model: `bench --model MODULE:CALLABLE` times the trainer, the bare loops and the bound on
it, `time-to-accuracy --model MODULE:CALLABLE --target METRIC>=X` trains it to the target; the user's package is
made in a temporary directory, on PYTHONPATH only."""

import argparse
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from lab.bench.loops import add_arguments
from lab.bench.main import BenchSpec, job_args

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = {
    "__init__.py": "",
    "net.py": textwrap.dedent("""
    import torch.nn as nn


    def build(hidden=16):
        return nn.Sequential(nn.Flatten(), nn.Linear(28 * 28, hidden), nn.ReLU(), nn.Linear(hidden, 10))
    """),
    "data.py": textwrap.dedent('''
    import torch
    from torch.utils.data import Dataset


    class Lazy(Dataset):
        """Sample i made from i when it is read."""

        def __init__(self, n, offset=0):
            self.n, self.offset = n, offset

        def __len__(self):
            return self.n

        def __getitem__(self, i):
            g = torch.Generator().manual_seed(self.offset + i)
            y = int(torch.randint(0, 10, (1,), generator=g))
            x = torch.randn(1, 28, 28, generator=g) * 0.1
            x[0, y] += 1.0  # row y lit: a linear model separates the classes in a few steps
            return x, y


    def build(n=640, evaluation=128):
        return Lazy(n), Lazy(evaluation, offset=10_000)
    '''),
}
REF, DATA = "userpkg.net:build", "userpkg.data:build"


def user_env(tmp_path):
    pkg = tmp_path / "site" / "userpkg"
    pkg.mkdir(parents=True)
    for name, text in PACKAGE.items():
        (pkg / name).write_text(text)
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(tmp_path / "site"), str(ROOT)]),
        "OMPI_ALLOW_RUN_AS_ROOT": "1",
        "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
        "HWLOC_COMPONENTS": "-gl",
    }


def lab(args, env, timeout=300):
    return subprocess.run(
        [sys.executable, "-m", "lab", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout
    )


def test_bench_gives_the_trainer_and_the_bare_loops_the_users_model_and_data():
    spec = BenchSpec(models=[REF], dataset=DATA, model_args=["hidden=8"])
    _, trainer = job_args("trainer", REF, spec, "", "/tmp/r", "x")
    _, bare = job_args("horovod", REF, spec, "/tmp/r.json", "/tmp/r", "x")
    for args in (trainer, bare):
        assert args[args.index("--model") + 1] == REF and args[args.index("--dataset") + 1] == DATA
        assert args[args.index("--model-arg") + 1] == "hidden=8"
    p = argparse.ArgumentParser()
    add_arguments(p)  # the bare loops' ranks take the same flags
    got = p.parse_args(bare)
    assert (got.model, got.dataset, got.model_arg) == (REF, DATA, ["hidden=8"])
    # a task names its own model and data
    gpt = "examples.gpt.task:build"
    tspec = BenchSpec(models=[gpt], tasks=[gpt], model_args=["max_chars=1000"])
    for impl in ("trainer", "ddp"):
        _, args = job_args(impl, gpt, tspec, "/tmp/r.json", "/tmp/r", "x")
        assert args[args.index("--task") + 1] == gpt and "--model" not in args and "--dataset" not in args
    assert p.parse_args(args).task == gpt
    # a registered model keeps the synthetic data unless --dataset is given
    _, reg = job_args("trainer", "lenet5", spec.__class__(models=["lenet5"]), "", "/tmp/r", "x")
    assert reg[reg.index("--dataset") + 1] == "synthetic"


@pytest.mark.long  # the bench end to end with a user's model (~13 s): make test-long, .ci/run
def test_bench_times_a_users_model_beside_a_bare_horovod_loop(tmp_path):
    env, out = user_env(tmp_path), tmp_path / "bench"
    proc = lab(
        [
            "bench",
            "--model",
            REF,
            "--dataset",
            DATA,
            "--np",
            "1",
            "--impls",
            "trainer,horovod",
            "--repeats",
            "1",
            "--steps",
            "5",
            "--warmup",
            "1",
            "--out",
            str(out),
        ],
        env,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    (row,) = json.loads((out / "bench.json").read_text())["rows"]
    assert row["model"] == REF and set(row["impls"]) == {"trainer", "horovod"}
    assert all(s["median"] > 0 for s in row["impls"].values())


@pytest.mark.heavy
def test_time_to_accuracy_trains_a_users_model_to_its_target(tmp_path):
    env, out = user_env(tmp_path), tmp_path / "tta"
    proc = lab(
        [
            "time-to-accuracy",
            "--model",
            REF,
            "--dataset",
            DATA,
            "--target",
            "eval/accuracy>=0.5",
            "--workers",
            "1",
            "--methods",
            "ring-mpi",
            "--max-epochs",
            "3",
            "--evals-per-epoch",
            "2",
            "--extra=--lr",
            "--extra=0.1",
            "--out-dir",
            str(out),
        ],
        env,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads((out / "results.json").read_text())
    (job,) = res["jobs"]
    assert job["model"] == REF and job["ok"] and job["reached"], job
    assert job["grad_shapes"] == [[16, 784], [16], [10, 16], [10]]  # for the cost model, without importing it
    assert res["targets"] == {REF: "eval/accuracy>=0.5"}
    assert (out / "runs" / "net.build").is_dir() and (out / "report.md").exists()


@pytest.mark.heavy
def test_time_to_accuracy_refuses_a_bad_reference_or_a_missing_target_in_one_line(tmp_path):
    env = user_env(tmp_path)
    for args, needle in (
        (["--model", "userpkg.net:nope", "--target", "eval/accuracy>=0.5"], "no attribute 'nope'"),
        (["--model", REF], "--target"),
    ):
        proc = lab(["time-to-accuracy", *args, "--workers", "1", "--out-dir", str(tmp_path / "o")], env)
        assert proc.returncode == 2 and needle in proc.stderr, proc.stderr
        assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
