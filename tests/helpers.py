"""Helpers shared by the test folders: run real ranks through the project's launcher, compare
parameters, write small datasets. Imported as ``from helpers import ...`` (tests/ is on sys.path
through tests/conftest.py)."""

from __future__ import annotations

import gzip
import os
import random
import signal
import struct
import subprocess
import sys
import threading
import time
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


def launch(np: int, args: list[str], timeout: float = 240, command: str = "train", module: str = "",
           oversubscribe: bool = False, env: dict[str, str] | None = None,
           launcher: list[str] = ()) -> subprocess.CompletedProcess:
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


def run_single(args: list[str], timeout: float = 240) -> subprocess.CompletedProcess:
    """One process without mpirun (Horovod forms a world of size 1)."""
    cmd = [sys.executable, "-m", "allreduce_train", "train", *args]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})


def check(proc: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert proc.returncode == 0, f"exit {proc.returncode}\nstdout:\n{proc.stdout[-4000:]}\nstderr:\n{proc.stderr[-4000:]}"
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
            env = open(f"/proc/{entry}/environ", "rb").read().split(b"\0")
            cmd = open(f"/proc/{entry}/cmdline", "rb").read()
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

    def __init__(self, np: int, args: list[str], tag: str, oversubscribe: bool = False,
                 launcher: list[str] = (), command: list[str] | None = None) -> None:
        """``command``: run this instead of ``python -m launch -np NP [launcher] -- ARGS``."""
        cmd = command or [sys.executable, "-m", launcher_module(launcher), "-np", str(np),
                          *(["--oversubscribe"] if oversubscribe else []), *launcher, "--", *args]
        self.tag = tag
        env = {**os.environ, "OMP_NUM_THREADS": "1", "FAULT_TEST_TAG": tag}
        self.proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        self.out: list[str] = []
        self.err: list[str] = []
        self._readers = [threading.Thread(target=lambda s=s, d=d: d.extend(s), daemon=True)
                         for s, d in ((self.proc.stdout, self.out), (self.proc.stderr, self.err))]
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
    not os.path.isdir(FASHION_MNIST_DIR), reason="dataset-fashion-mnist not installed (make install)")


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


WORDS = "the cat dog sat on mat a ran fast slow big small red blue".split()


def write_corpus(d, lines=(300, 40, 40), seed=0, words=WORDS):
    """A tiny corpus in PTB format: one sentence per line, a space before and after, some <unk>."""
    rng = random.Random(seed)
    d.mkdir(parents=True, exist_ok=True)
    for split, n in zip(ptb.SPLITS, lines):
        with open(d / f"ptb.{split}.txt", "w") as fh:
            for _ in range(n):
                sent = [rng.choice(words) if rng.random() > 0.05 else "<unk>" for _ in range(rng.randint(3, 12))]
                fh.write(" " + " ".join(sent) + " \n")
    return d


# ------------------------------------------------------------------ configuration

def parse(argv):
    """The Config that `train ARGV` builds."""
    from allreduce_train.cli import make_parser
    from allreduce_train.config import build_config

    return build_config(make_parser().parse_args(["train", *argv]))
