"""Atomic checkpoints: written by global rank 0, loaded by rank 0 and broadcast by the strategy."""

from __future__ import annotations

import os
import tempfile
from typing import Any

import torch

from .errors import UserError

CHECKPOINT_NAME = "checkpoint.pt"


def save(path: str, state: dict[str, Any]) -> None:
    """Write ``state`` to ``path`` atomically.

    The bytes go to a temporary file in the same directory, are flushed to disk, and only then
    renamed over ``path``: a crash at any moment leaves either the previous good checkpoint or the
    new one, never a torn file.
    """
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".checkpoint-", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "wb") as fh:
            torch.save(state, fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    dir_fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dir_fd)  # make the rename itself durable
    finally:
        os.close(dir_fd)


def load(path: str) -> dict[str, Any]:
    """Read a checkpoint (tensors and plain data only: ``weights_only=True``)."""
    if not os.path.isfile(path):
        raise UserError(f"--resume {path}: checkpoint not found; give an existing checkpoint file or 'auto'")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # torch raises several types for a torn or foreign file
        raise UserError(f"--resume {path}: not a readable checkpoint ({type(e).__name__}: {e})") from None
    for key in ("model", "optimizer", "step", "config"):
        if key not in state:
            raise UserError(f"--resume {path}: checkpoint lacks {key!r}; was it written by allreduce_train?")
    return state
