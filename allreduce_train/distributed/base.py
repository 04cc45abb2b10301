"""The gradient-exchange interface that the trainer talks to.

A strategy owns everything that crosses process boundaries: forming the process group, making
the initial parameters identical on every worker, moving gradients, and the few collectives the
trainer needs for metrics. The trainer loop, data, logging and checkpoints are shared by all
strategies. Ranks that only serve (a parameter server's dedicated servers) report
``is_worker == False`` and spend the run in :meth:`serve`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

import torch

from .buffers import flatten, views


class GradientExchange(ABC):
    name: str
    rank: int  # global rank
    size: int  # all processes, servers included
    local_rank: int
    local_size: int

    @property
    def is_main(self) -> bool:
        """The one process that writes logs, metrics and checkpoints: global rank 0."""
        return self.rank == 0

    @property
    def is_worker(self) -> bool:
        """Whether this rank trains (computes gradients)."""
        return True

    @property
    def num_workers(self) -> int:
        return self.size

    @property
    def worker_index(self) -> int:
        """This rank's index among the workers: which data shard it reads."""
        return self.rank

    def describe(self) -> dict[str, Any]:
        """Strategy-specific fields for metrics.json and the run's hparams."""
        return {}

    @abstractmethod
    def prepare(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
        """Make the model and optimizer state identical to the main rank's; return the optimizer to step."""

    @abstractmethod
    def synchronize(self) -> None:
        """Block until this step's gradients are exchanged (averaged over workers) and in ``.grad``."""

    def set_exchanging(self, on: bool) -> None:
        """Local SGD (:mod:`.localsgd`): whether this step's gradients travel; off, :meth:`synchronize`
        leaves each worker its own gradient. Called before the step's backward."""
        raise NotImplementedError(f"{self.name} has no local SGD")

    @abstractmethod
    def apply(self, optimizer: torch.optim.Optimizer) -> None:
        """Apply the exchanged gradients (after :meth:`synchronize` and any clipping)."""

    @abstractmethod
    def sum_over_workers(self, values: torch.Tensor) -> torch.Tensor:
        """Element-wise sum of a small CPU tensor over all workers (for global metrics)."""

    def sum_tensors(self, tensors: list[torch.Tensor], name: str = "") -> list[torch.Tensor]:
        """Element-wise sums over the workers of several tensors in one :meth:`sum_over_workers`:
        flattened into one CPU tensor, summed, and cut back into the tensors' shapes, each on its
        tensor's device (CPU tensors: views of one buffer). ``name`` labels the collective where an
        engine names them (PowerSGD's ``SumTensors``)."""
        total = self.sum_over_workers(flatten([t.detach() for t in tensors], device="cpu"))  # communication
        return [v.to(t.device) for v, t in zip(views(total, tensors), tensors)]  # CPU: the view itself

    def start_vote(self, flags: torch.Tensor) -> None:
        """Begin summing a few float64 flags over the workers without waiting (the trainer's per-step
        vote: stop requested, loss finite). Strategies send it beside the step's gradients."""
        self._vote = flags

    def end_vote(self) -> torch.Tensor:
        """The sum begun by :meth:`start_vote`, the same on every worker."""
        return self.sum_over_workers(self._vote)

    @abstractmethod
    def broadcast_object(self, obj: Any, root: int = 0) -> Any:
        """Send a picklable object from ``root`` to every rank."""

    @abstractmethod
    def allgather_object(self, obj: Any) -> list[Any]:
        """Collective over every rank: the list of each rank's ``obj``, by rank."""

    def gather_from_workers(self, obj: Any) -> list[Any]:
        """Collective over the workers: each worker's ``obj``, by worker index (checkpoints keep
        every worker's RNG and task state)."""
        return self.allgather_object(obj)

    def worker_state(self) -> Any:
        """This worker's exchange state for the checkpoint (PowerSGD's error feedback and Qs), or None."""
        return None

    def load_worker_state(self, state: Any) -> None:
        """Resume from :meth:`worker_state` (after :meth:`prepare`)."""

    def model_state_dict(self, model: torch.nn.Module) -> dict[str, torch.Tensor]:
        """The model's state for a checkpoint, on the main rank (the parameter server's float32 master
        parameters where workers hold 16-bit-rounded ones)."""
        return model.state_dict()

    def serve(self) -> None:
        """Run a non-worker rank until the workers finish."""
        raise NotImplementedError(f"{self.name} has no server ranks")

    def stats(self) -> dict[str, float]:
        """Counters since the last call (e.g. bytes moved); logged under comm/."""
        return {}

    @abstractmethod
    def close(self) -> None:
        """Leave the process group cleanly."""

    @abstractmethod
    def abort(self, code: int) -> None:
        """Terminate every rank of the job now (after an error on this rank), never hang."""
