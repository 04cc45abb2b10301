"""Shared helpers: run real ranks through the project's own launcher."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
FASHION_MNIST_DIR = "/usr/share/datasets/fashion-mnist"


def launch(np: int, args: list[str], timeout: float = 240, command: str = "train",
           oversubscribe: bool = False, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """``python -m launch -np N -- ARGS`` with a hard timeout: a hanging rank fails the test."""
    cmd = [sys.executable, "-m", "launch", "-np", str(np), "--command", command]
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


needs_fashion_mnist = pytest.mark.skipif(
    not os.path.isdir(FASHION_MNIST_DIR), reason="dataset-fashion-mnist not installed (make install)")
