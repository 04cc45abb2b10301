"""One process, no communication: the exchange of a run without mpirun.

Like Lightning Fabric's single-device strategy: every collective returns its input, so the whole
training loop (data, steps, evaluation, checkpoints, logging) runs in one process -- what the fast
in-process unit tests use. The average over one worker is its own gradient, so the parameters
match a one-rank run of any other strategy step for step.
"""

from __future__ import annotations

import os
from typing import Any

import torch

from .base import GradientExchange


class LocalExchange(GradientExchange):
    name = "local"
    rank, size, local_rank, local_size = 0, 1, 0, 1

    def prepare(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
        return optimizer

    def synchronize(self) -> None:
        pass

    def set_exchanging(self, on: bool) -> None:
        pass  # one worker: its own gradient is the average either way

    def apply(self, optimizer: torch.optim.Optimizer) -> None:
        optimizer.step()

    def sum_over_workers(self, values: torch.Tensor) -> torch.Tensor:
        return values

    def broadcast_object(self, obj: Any, root: int = 0) -> Any:
        return obj

    def allgather_object(self, obj: Any) -> list[Any]:
        return [obj]

    def close(self) -> None:
        pass

    def abort(self, code: int) -> None:
        os._exit(code)
