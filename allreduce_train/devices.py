"""Which device a rank trains on: ``--device auto|cpu|cuda`` and the local rank.

One rank per GPU: the rank with local rank ``r`` on a host takes GPU ``r % count``, so a job
started with as many ranks per host as GPUs (mpirun ``-npernode``, Slurm ``--gpus-per-node``) puts
each rank on its own GPU. ``auto`` without a visible GPU trains on the CPU; when torch is a CUDA
build (someone meant to use a GPU) rank 0 says so in one line.
"""

from __future__ import annotations

import os
import sys
from typing import Any, TextIO

import torch

from .errors import ConfigError


def pick_device(
    want: str,
    local_rank: int,
    *,
    announce: bool = True,
    cuda: Any = torch.cuda,
    cuda_build: str | None = torch.version.cuda,
    out: TextIO | None = None,
) -> torch.device:
    """The device for ``--device want`` on the rank with this local rank.

    ``announce``: this rank prints the no-GPU line (rank 0 only, so a job says it once).
    ``cuda``/``cuda_build``: ``torch.cuda`` and ``torch.version.cuda``, replaceable for tests.
    """
    if want not in ("auto", "cpu", "cuda"):
        raise ConfigError(f"--device {want!r}: use auto, cpu or cuda")
    if want == "cpu":
        return torch.device("cpu")
    if cuda.is_available():
        cuda.set_device(local_rank % cuda.device_count())
        return torch.device("cuda", cuda.current_device())
    if want == "cuda":
        build = (
            f"torch {torch.__version__} is a CPU build"
            if not cuda_build
            else f"torch {torch.__version__} (CUDA {cuda_build}) finds no GPU or driver"
        )
        raise ConfigError(f"--device cuda: no CUDA device is visible ({build}); use --device auto or cpu")
    if cuda_build and announce:
        print(
            f"--device auto: no GPU found (torch {torch.__version__}, CUDA {cuda_build}; no device or driver "
            f"visible); training on the CPU",
            file=out or sys.stdout,
            flush=True,
        )
    return torch.device("cpu")


def local_cores() -> int:
    """The cores this process may run on (its affinity), which the ranks on this host share."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1
