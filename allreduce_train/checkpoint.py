"""Atomic checkpoints: written by global rank 0, loaded by rank 0 and broadcast by the strategy."""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass, field
from typing import Any

import torch

from .errors import UserError

CHECKPOINT_NAME = "checkpoint.pt"


@dataclass
class WorkerState:
    """One worker's part of a checkpoint (its entry in ``workers``), each piece saved and loaded by
    its owner, so that a resumed run continues bit-exactly mid-epoch:

    * ``rng``, ``cuda_rng``: the trainer's random state (dropout masks);
    * ``task``: the task's (an LSTM's hidden state, the text's position);
    * ``exchange``: the wire format's (PowerSGD's error feedback and Qs; :mod:`.distributed.wire`);
    * ``schedule``: the schedule's, under its key (``local_sgd``, ``diloco``: the worker's own
      parameters and optimizer state between averagings; :mod:`.distributed.schedules`).

    On disk it is a plain dict with those keys (checkpoints written before this class read the same).
    """

    rng: torch.Tensor
    task: Any = None
    exchange: Any = None
    schedule: dict[str, Any] = field(default_factory=dict)
    cuda_rng: torch.Tensor | None = None

    def to_dict(self) -> dict[str, Any]:
        out = {"rng": self.rng, "task": self.task, **self.schedule, "exchange": self.exchange}
        if self.cuda_rng is not None:
            out["cuda_rng"] = self.cuda_rng
        return out

    @classmethod
    def from_dict(cls, saved: dict[str, Any], path: str = "") -> WorkerState:
        if not isinstance(saved, dict) or "rng" not in saved:
            raise UserError(
                f"--resume {path}: the checkpoint's per-worker state has no 'rng'; it was not written by "
                "allreduce_train's trainer (start afresh without --resume)"
            )
        own = ("rng", "task", "exchange", "cuda_rng")
        return cls(
            saved["rng"],
            saved.get("task"),
            saved.get("exchange"),
            {k: v for k, v in saved.items() if k not in own},
            saved.get("cuda_rng"),
        )


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
