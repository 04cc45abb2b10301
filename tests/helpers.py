"""Helpers shared by the test folders: run real ranks through the project's launcher, compare
parameters, write small datasets. Imported as ``from helpers import ...`` (tests/ is on sys.path
through tests/conftest.py)."""

from __future__ import annotations

import functools
import gzip
import os
import random
import signal
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest
import torch

from allreduce_train.data import ptb

ROOT = Path(__file__).resolve().parent.parent
FASHION_MNIST_DIR = "/usr/share/datasets/fashion-mnist"


def launcher_module(launcher) -> str:
    """``python -m launch``, or the lab's front end of it when the job runs on emulated hosts."""
    return "lab.emulation" if "--emulate-hosts" in launcher else "launch"


def launch(
    np: int,
    args: list[str],
    timeout: float = 240,
    command: str = "train",
    module: str = "",
    oversubscribe: bool = False,
    env: dict[str, str] | None = None,
    launcher: Sequence[str] = (),
) -> subprocess.CompletedProcess:
    """``python -m launch -np N [LAUNCHER...] -- ARGS`` with a hard timeout: a hanging rank fails the test.
    ``module``: run that rank program (``python -m MODULE ARGS``) instead of the trainer."""
    cmd = [sys.executable, "-m", launcher_module(launcher), "-np", str(np), "--command", command, *launcher]
    if module:
        cmd += ["--module", module]
    if oversubscribe:
        cmd.append("--oversubscribe")
    cmd += ["--", *args]
    full_env = {**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout, env=full_env)


def lab_in_process(capsys, *argv: str) -> tuple[int, str]:
    """``python -m lab ARGV`` inside the test's process: its exit code and what it wrote to stderr. For
    refusals of bad input, which end before any job starts: one subprocess per command checks the real entry
    point, the other cases need no interpreter of their own (each would import torch again, ~2 s of CPU)."""
    from lab.__main__ import main

    capsys.readouterr()
    try:
        code = main(list(argv))
    except SystemExit as e:  # argparse's refusals; a str or None code exits as Python's interpreter does it
        code = e.code if isinstance(e.code, int) else 0 if e.code is None else 1
    return code, capsys.readouterr().err


def run_single(args: list[str], timeout: float = 240) -> subprocess.CompletedProcess:
    """One process without mpirun (Horovod forms a world of size 1)."""
    cmd = [sys.executable, "-m", "allreduce_train", "train", *args]
    return subprocess.run(
        cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout, env={**os.environ, "OMP_NUM_THREADS": "1"}
    )


# The short synthetic run that tests/mpi's shared jobs (tests/mpi/conftest.py) and the tests set against
# them run: no warm-up or LR scaling, so one process at the double batch runs the workers' schedule;
# an evaluation every 10 steps and a checkpoint every 7 (neither changes where training ends); 2,050
# samples, so that the 205 evaluation samples do not split evenly over 2 ranks.
SHARED_RUN = [
    "--dataset",
    "synthetic",
    "--synthetic-samples",
    "2050",
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


# The engines' comparison (tests/mpi/test_ring_engine.py, test_torch_engine.py): no warm-up and no LR scaling,
# so one process with the global batch runs the workers' schedule; momentum and weight decay on, so every
# step's gradient carries into the end parameters; a checkpoint every 5 steps (which must not change the
# result: the 2-rank mpi-engine job is also the resume tests' uncut reference). MPI_ENGINE: LeNet-5's ten
# tensors in buckets of at most 3,000 bytes: 9 buckets of 10 to 48,000 elements, most of them not a multiple
# of 3 or 4, so the ring's chunks differ in size.
ENGINE_RUN = [
    "--dataset",
    "synthetic",
    "--synthetic-samples",
    "960",
    "--no-progress",
    "--log-every",
    "4",
    "--batch-size",
    "8",
    "--steps",
    "12",
    "--warmup-steps",
    "0",
    "--no-scale-lr",
    "--lr",
    "0.05",
    "--weight-decay",
    "1e-3",
    "--checkpoint-every",
    "5",
]
MPI_ENGINE = ["--allreduce-engine", "mpi", "--mpi-bucket-bytes", "3000"]

# AdamW at a transformer's LR, decoupled decay on the matrices only, 4 warm-up steps then a cosine to a
# tenth over ENGINE_RUN's 12 steps, bf16 autocast on the CPU; the later flags win over ENGINE_RUN's
# (tests/mpi/test_recipe.py, test_ps_optimizers.py).
RECIPE = [
    "--optimizer",
    "adamw",
    "--betas",
    "0.9,0.95",
    "--lr",
    "0.002",
    "--weight-decay",
    "0.1",
    "--no-decay-norm-bias",
    "--lr-schedule",
    "cosine",
    "--warmup-steps",
    "4",
    "--min-lr",
    "0.0002",
    "--precision",
    "bf16-mixed",
]

# The small LSTM on a tiny corpus (write_corpus): lr 1 rather than the recipe's 20 (gentler steps keep rounding
# differences from growing); a clip below the gradient norm on this corpus (about 0.12 at the start), so that
# clipping takes part. LM_STEPS: the length of tests/mpi/conftest.py's lstm_run.
LM = [
    "--model",
    "ptb-lstm-small",
    "--no-progress",
    "--log-every",
    "5",
    "--warmup-steps",
    "0",
    "--no-scale-lr",
    "--lr",
    "1",
    "--grad-clip",
    "0.05",
]
LM_STEPS = ["--steps", "15", "--eval-every", "15"]


# A short synthetic job with no warm-up and no LR scaling, batch 16: the launcher, fault and cluster tests'
# common trainer flags (each adds its steps, run directory and what it tests).
QUICK = [
    "--dataset",
    "synthetic",
    "--synthetic-samples",
    "2048",
    "--no-progress",
    "--log-every",
    "5",
    "--warmup-steps",
    "0",
    "--no-scale-lr",
    "--lr",
    "0.05",
    "--batch-size",
    "16",
]


def run_args(run_dir, name: str, *extra: str) -> list[str]:
    """The trainer flags that put run NAME in RUN_DIR and dump every rank's end parameters beside it
    (NAME-RANK.pt)."""
    return [
        "--run-dir",
        str(run_dir),
        "--name",
        name,
        "--dump-params",
        str(Path(run_dir) / f"{name}-{{rank}}.pt"),
        *extra,
    ]


def check(proc: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert proc.returncode == 0, (
        f"exit {proc.returncode}\nstdout:\n{proc.stdout[-4000:]}\nstderr:\n{proc.stderr[-4000:]}"
    )
    return proc


def load_params(path: Path) -> dict[str, torch.Tensor]:
    return torch.load(path, weights_only=True)


def rel_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    num = sum(float((a[k].double() - b[k].double()).pow(2).sum()) for k in a)
    den = sum(float(b[k].double().pow(2).sum()) for k in b)
    return (num / den) ** 0.5


# ------------------------------------------------------------------ jobs in the background (fault tests)


def job_pids(tag: str) -> dict[int, int]:
    """Global rank -> pid of the ranks of the job whose environment carries FAULT_TEST_TAG=tag."""
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            env = Path(f"/proc/{entry}/environ").read_bytes().split(b"\0")
            cmd = Path(f"/proc/{entry}/cmdline").read_bytes()
        except OSError:
            continue
        if b"allreduce_train" not in cmd:
            continue
        vars_ = dict(v.split(b"=", 1) for v in env if b"=" in v)
        if vars_.get(b"FAULT_TEST_TAG") == tag.encode() and b"OMPI_COMM_WORLD_RANK" in vars_:
            found[int(vars_[b"OMPI_COMM_WORLD_RANK"])] = int(entry)
    return found


class Job:
    """A launcher run in the background whose output lines are collected as they come."""

    def __init__(
        self,
        np: int,
        args: list[str],
        tag: str,
        oversubscribe: bool = False,
        launcher: Sequence[str] = (),
        command: list[str] | None = None,
    ) -> None:
        """``command``: run this instead of ``python -m launch -np NP [launcher] -- ARGS``."""
        cmd = command or [
            sys.executable,
            "-m",
            launcher_module(launcher),
            "-np",
            str(np),
            *(["--oversubscribe"] if oversubscribe else []),
            *launcher,
            "--",
            *args,
        ]
        self.tag = tag
        env = {**os.environ, "OMP_NUM_THREADS": "1", "FAULT_TEST_TAG": tag}
        self.proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        self.out: list[str] = []
        self.err: list[str] = []
        self._readers = [
            threading.Thread(target=lambda s=s, d=d: d.extend(s), daemon=True)
            for s, d in ((self.proc.stdout, self.out), (self.proc.stderr, self.err))
        ]
        for r in self._readers:
            r.start()

    def wait_for(self, needle: str, timeout: float = 240) -> None:
        deadline = time.monotonic() + timeout
        while not any(needle in ln for ln in self.out):
            assert self.proc.poll() is None, f"the job ended early: {self.text()}"
            assert time.monotonic() < deadline, f"{needle!r} never came: {self.text()}"
            time.sleep(0.2)

    def finish(self, timeout: float) -> int:
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise AssertionError(f"the job did not end within {timeout} s: {self.text()}") from None
        for r in self._readers:
            r.join(timeout=10)
        return self.proc.returncode

    def text(self) -> str:
        return "stdout:\n" + "".join(self.out)[-3000:] + "\nstderr:\n" + "".join(self.err)[-3000:]

    def kill_leftovers(self) -> list[int]:
        left = job_pids(self.tag)
        for pid in left.values():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        return sorted(left)


needs_fashion_mnist = pytest.mark.skipif(
    not os.path.isdir(FASHION_MNIST_DIR), reason="dataset-fashion-mnist not installed (make install)"
)


RANKS = ROOT / "tests" / "ranks"  # rank helper programs, run under mpirun with PYTHONPATH=RANKS


# ------------------------------------------------------------------ small datasets


def idx_bytes(arr: np.ndarray) -> bytes:
    return struct.pack(">BBBB", 0, 0, 0x08, arr.ndim) + struct.pack(f">{arr.ndim}I", *arr.shape) + arr.tobytes()


def write_split(d, prefix, n, gz=True, labels=None):
    imgs = np.random.default_rng(0).integers(0, 256, (n, 28, 28), dtype=np.uint8)
    lbls = np.arange(n, dtype=np.uint8) % 10 if labels is None else labels
    for stem, arr in ((f"{prefix}-images-idx3-ubyte", imgs), (f"{prefix}-labels-idx1-ubyte", lbls)):
        data = idx_bytes(arr)
        if gz:
            (d / (stem + ".gz")).write_bytes(gzip.compress(data))
        else:
            (d / stem).write_bytes(data)
    return imgs, lbls


WORDS = ["the", "cat", "dog", "sat", "on", "mat", "a", "ran", "fast", "slow", "big", "small", "red", "blue"]


def write_corpus(d, lines=(300, 40, 40), seed=0, words=WORDS):
    """A tiny corpus in PTB format: one sentence per line, a space before and after, some <unk>."""
    rng = random.Random(seed)
    d.mkdir(parents=True, exist_ok=True)
    for split, n in zip(ptb.SPLITS, lines, strict=True):
        with open(d / f"ptb.{split}.txt", "w") as fh:
            for _ in range(n):
                sent = [rng.choice(words) if rng.random() > 0.05 else "<unk>" for _ in range(rng.randint(3, 12))]
                fh.write(" " + " ".join(sent) + " \n")
    return d


# ------------------------------------------------------------------ configuration


@functools.cache
def _parser():
    from allreduce_train.cli import make_parser

    return make_parser()  # ~10 ms to build: made once, as the matrix of combinations parses hundreds of lines


def parse(argv):
    """The Config that `train ARGV` builds."""
    from allreduce_train.config import build_config

    return build_config(_parser().parse_args(["train", *argv]))


# ------------------------------------------------------------------ a user's own package (docs/own_model.md)

USER_PACKAGE = {
    "__init__.py": "",
    "net.py": '''
import torch
import torch.nn as nn


def build(hidden=32, classes=10, dropout=0.0):
    """An MLP over 28x28 inputs (no dropout by default: with it, the workers' masks are not one process's)."""
    return nn.Sequential(nn.Flatten(), nn.Linear(28 * 28, hidden), nn.ReLU(), nn.Dropout(dropout),
                         nn.Linear(hidden, classes))


def bn(width=4, classes=10):
    """A small convolutional net with BatchNorm, 2-d and 1-d: running statistics that each worker tracks."""
    return nn.Sequential(nn.Conv2d(1, width, 3, stride=2), nn.BatchNorm2d(width), nn.ReLU(), nn.Flatten(),
                         nn.Linear(width * 13 * 13, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, classes))


class Shift(nn.Module):
    """A layer whose one parameter is a bias: a vector added to its input."""

    def __init__(self, width):
        super().__init__()
        self.bias = nn.Parameter(torch.zeros(width))

    def forward(self, x):
        return x + self.bias


def odd(classes=10):
    """The tensors an exchange can trip over, in one net: a matrix PowerSGD compresses at rank 1 (16x784)
    and two too small to (2x16, 10x2), a BatchNorm's parameters and running statistics, a bias-only layer."""
    return nn.Sequential(nn.Flatten(), nn.Linear(28 * 28, 16), nn.BatchNorm1d(16), nn.ReLU(),
                         nn.Linear(16, 2, bias=False), Shift(2), nn.Linear(2, classes))


def wrong_type():
    return "not a module"


def raises():
    raise RuntimeError("the user's model failed to build")


def bad_output(classes=10):
    return nn.Sequential(nn.Flatten(), nn.Linear(28 * 28, 3), nn.Unflatten(1, (1, 3)))

NOT_CALLABLE = 3
''',
    "data.py": '''
import torch
from torch.utils.data import Dataset


class Lazy(Dataset):
    """Sample i made from i alone when it is read: nothing is held in memory."""

    def __init__(self, n, offset=0):
        self.n, self.offset = n, offset

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(self.offset + i)
        y = int(torch.randint(0, 10, (1,), generator=g))
        x = torch.randn(1, 28, 28, generator=g) + 0.5 * y
        return x, y


def build(n=2050, evaluation=205):
    return Lazy(n), Lazy(evaluation, offset=10_000_000)


def tiny():
    return Lazy(10), Lazy(10)


class Stream(torch.utils.data.IterableDataset):
    def __iter__(self):
        return iter([(torch.zeros(1, 28, 28), 0)] * 100)


def iterable():
    return Stream(), Lazy(10)
''',
    "task.py": '''
import torch.nn.functional as F

import allreduce_train

from . import data, net


class Counting(allreduce_train.Task):
    """A task with state of its own: the loss weight cycles with the batches this worker has seen,
    so a resumed run ends where the uncut one does only if that count came back from the checkpoint."""

    def __init__(self, hidden=16):
        super().__init__(model=lambda: net.build(hidden), data=lambda: data.build())
        self.seen = 0

    def loss(self, model, inputs, targets):
        self.seen += 1
        return F.cross_entropy(model(inputs), targets) * (1.0 + 0.25 * (self.seen % 4))

    def eval_metrics(self, sums):
        return {**super().eval_metrics(sums), "seen_mod": float(self.seen % 4)}

    def state_dict(self):
        return {"seen": self.seen}

    def load_state_dict(self, state):
        self.seen = state["seen"]


def build(hidden=16):
    return Counting(hidden)


def not_a_task():
    return object()
''',
    "broken.py": "raise ImportError('a dependency of the user module is missing')\n",
}


def write_user_package(root: Path, name: str = "userpkg") -> Path:
    """A user's own package under ``root`` (outside this repository): put ``root`` on PYTHONPATH."""
    pkg = Path(root) / name
    pkg.mkdir(parents=True, exist_ok=True)
    for file, text in USER_PACKAGE.items():
        (pkg / file).write_text(text)
    return Path(root)
