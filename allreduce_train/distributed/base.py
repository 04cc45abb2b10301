"""The engine interface: the collective primitives that every layer above is built from.

An engine (Horovod, the mpi4py ring, torch.distributed, the parameter server) owns everything
that crosses process boundaries: forming the process group, making the initial state identical on
every worker (:meth:`prepare`), the gradient sum started from backward's hooks (:meth:`set_exchanging`,
:meth:`synchronize`), a grouped sum of any tensors (:meth:`sum_tensors`), broadcast, the step's
vote and abort. It knows no concept: wire formats (:mod:`.wire`: 16 bits, PowerSGD) and schedules
(:mod:`.schedules`: synchronous, local SGD, DiLoCo) are layers over these primitives, and which
combinations exist is one table in :mod:`allreduce_train.config`. The trainer loop, data, logging
and checkpoints are shared by all engines. Ranks that only serve (a parameter server's dedicated
servers) report ``is_worker == False`` and spend the run in :meth:`serve`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any

import torch

from ..trace import NULL, NullTracer
from .buffers import flatten, held_bytes, views
from .wire import FLOAT32, WireFormat

if TYPE_CHECKING:
    from .bucketing import BucketedReduction


class GradientExchange(ABC):
    name: str
    rank: int  # global rank
    size: int  # all processes, servers included
    local_rank: int
    local_size: int
    # Whether the workers train one model (gradients or parameters averaged): False for --strategy none,
    # where every rank trains its own and nothing of it is averaged, BatchNorm's statistics included.
    one_model: bool = True
    # --trace-steps (the trainer sets it): an engine reports each bucket's start and finish to it, once per place
    tracer: NullTracer = NULL
    # The run's wire format (--compression, made once: distributed.create_exchange): the engine's gradient
    # sum reads its dtype, and the schedule takes it from here. float32 where an engine is given none
    # (one process; --strategy none, whose --compression config keeps at none).
    wire: WireFormat = FLOAT32
    # The gradient sum started from backward's hooks, where the engine runs it on the shared machinery.
    reduction: BucketedReduction | None = None
    _closed = False

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
    def prepare(
        self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, every_step: bool = True
    ) -> torch.optim.Optimizer:
        """Make the model and optimizer state identical to the main rank's and set up the gradient sum;
        return the optimizer to step. ``every_step=False``: a schedule will turn the gradient sum on
        for some steps only (:meth:`set_exchanging`), or never (a wire format that sums after backward)."""

    @abstractmethod
    def synchronize(self) -> None:
        """Block until this step's gradients are exchanged (averaged over workers) and in ``.grad``."""

    def set_exchanging(self, on: bool) -> None:
        """Whether this step's gradients are summed (Fabric's backward sync control); off,
        :meth:`synchronize` leaves each worker its own gradient. Called before the step's backward,
        only by schedules that prepared with ``every_step=False``."""
        raise NotImplementedError(f"{self.name} sums every step's gradients (config's table refuses the rest)")

    @abstractmethod
    def apply(self, optimizer: torch.optim.Optimizer) -> None:
        """Apply the exchanged gradients (after :meth:`synchronize` and any clipping)."""

    @abstractmethod
    def sum_over_workers(self, values: torch.Tensor) -> torch.Tensor:
        """Element-wise sum of a small CPU tensor over all workers (for global metrics)."""

    def sum_tensors(self, tensors: list[torch.Tensor], name: str = "") -> list[torch.Tensor]:
        """The grouped sum: element-wise sums over the workers of several float32 tensors, each on
        its tensor's device. Here in one :meth:`sum_over_workers` of a flat CPU buffer (CPU tensors
        get views of it); engines with a grouped collective of their own override it. ``name``
        labels the collective where an engine names them."""
        total = self.sum_over_workers(flatten([t.detach() for t in tensors], device="cpu"))  # communication
        return [v.to(t.device) for v, t in zip(views(total, tensors), tensors, strict=True)]  # CPU: the view itself

    def start_vote(self, flags: torch.Tensor) -> None:
        """Begin summing a few float64 flags over the workers without waiting (the trainer's per-step
        vote: stop requested, loss finite). Strategies send it beside the step's gradients."""
        self._vote = flags

    def end_vote(self) -> torch.Tensor:
        """The sum begun by :meth:`start_vote`, the same on every worker."""
        return self.sum_over_workers(self._vote)

    def broadcast_state(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
        """Give every rank rank 0's parameters, buffers and optimizer state (fresh, or from a checkpoint),
        through :meth:`broadcast_object`: engines without a broadcast of their own start from it."""
        # communication: rank 0's model and optimizer state to every rank
        state = self.broadcast_object(
            {"model": model.state_dict(), "optimizer": optimizer.state_dict()} if self.is_main else None
        )
        if not self.is_main:
            model.load_state_dict(state["model"])
            optimizer.load_state_dict(state["optimizer"])

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

    def model_state_dict(self, model: torch.nn.Module) -> dict[str, torch.Tensor]:
        """The model's state for a checkpoint, on the main rank (the parameter server's float32 master
        parameters where workers hold 16-bit-rounded ones)."""
        return model.state_dict()

    def optimizer_state_dict(self, optimizer: torch.optim.Optimizer) -> dict[str, Any] | None:
        """The optimizer's state for a checkpoint, whole, on the main rank (None elsewhere): a collective over
        the workers, where the state is sharded over them (``--strategy sharded`` gathers every worker's)."""
        return optimizer.state_dict() if self.is_main else None

    def optimizer_shard(self, optimizer: torch.optim.Optimizer) -> dict[str, Any] | None:
        """This worker's own part of the optimizer's state, for a checkpoint of one file per worker beside a
        manifest (:meth:`optimizer_groups`), where the state is sharded over the workers (no communication);
        None where the checkpoint holds the state whole (:meth:`optimizer_state_dict`)."""
        return None

    def optimizer_groups(self, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
        """The optimizer's ``state_dict`` without its state (its parameter groups): what a sharded checkpoint's
        manifest holds beside the names of the files of :meth:`optimizer_shard`."""
        return {k: v for k, v in optimizer.state_dict().items() if k != "state"}

    def memory(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, int]:
        """Bytes this rank holds (``params``, ``grads``, ``optimizer``: every tensor of the optimizer's
        state, ``buffers``: the engine's own, :meth:`flat_buffers`), each tensor storage counted once.
        Engines that keep state elsewhere (the parameter server's servers, the sharded optimizer)
        override it; the formula to compare with is :func:`.memcost.per_rank`."""
        params = list(model.parameters())
        return held_bytes(
            {
                "params": params,
                "grads": [p.grad for p in params if p.grad is not None],
                "optimizer": [v for st in optimizer.state.values() for v in st.values() if isinstance(v, torch.Tensor)],
                "buffers": self.flat_buffers(),
            }
        )

    def flat_buffers(self) -> list[torch.Tensor]:
        """The engine's own buffers that Python can see (the ring's buckets and their receive scratch);
        none here (Horovod's fusion buffer lives in its C++ core, out of sight)."""
        return []

    def server_memory(self) -> list[dict[str, Any]]:
        """On the main rank: a row like :meth:`memory`'s (with ``rank``, ``role`` and ``peak_rss_mib``)
        for each rank that only serves and so never runs the trainer; none here."""
        return []

    def whole_parameters(self, model: torch.nn.Module) -> None:
        """Make ``model``'s parameters whole on every worker until its next training step: a collective over
        the workers where they are sharded (``--shard-stage 3``), nothing elsewhere."""
        return None  # whole already: every rank holds every parameter

    def serve(self) -> None:
        """Run a non-worker rank until the workers finish."""
        raise NotImplementedError(f"{self.name} has no server ranks")

    def stats(self) -> dict[str, float]:
        """Counters since the last call (e.g. bytes moved); logged under comm/."""
        return {}

    def close(self) -> None:
        """Leave the process group cleanly, once (a second call, from a ``finally`` after the first, does
        nothing): the gradient hooks come off, then :meth:`leave`."""
        if self._closed:
            return
        self._closed = True
        if self.reduction is not None:
            self.reduction.remove()
        self.leave()

    def leave(self) -> None:
        """This engine's own part of :meth:`close` (its process group left, its servers told)."""
        return None  # nothing beyond the hooks: an engine on MPI's COMM_WORLD leaves it at exit

    @abstractmethod
    def abort(self, code: int) -> None:
        """Terminate every rank of the job now (after an error on this rank), never hang."""
