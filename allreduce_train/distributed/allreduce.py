"""Ring allreduce through Horovod (MPI or Gloo on CPU, NCCL on GPU)."""

from __future__ import annotations

import os
from typing import Any

import torch

from ..config import ExchangeConfig
from ..errors import UserError
from .base import GradientExchange


def _import_horovod():
    try:
        import horovod.torch as hvd
    except ImportError as e:
        raise UserError(
            f"horovod.torch cannot be imported ({e}); run `make install` (it builds the patched Horovod wheel)"
        ) from None
    return hvd


def check_horovod_env(environ) -> None:
    """Refuse controller / CPU-operation combinations that crash Horovod 0.28.1 or silently do nothing.

    Found with a four-line reproduction (hvd.init(); one hvd.allreduce) under ``mpirun -np 2``:
    * MPI controller + ``HOROVOD_CPU_OPERATIONS=gloo``: SIGSEGV in the first allreduce, in
      ``gloo::Context::getTimeout(this=0x0)`` from ``GlooAllreduce::Execute``: the process set's
      Gloo context is only created when Gloo is also the controller, so it stays null.
    * ``HOROVOD_CONTROLLER=gloo`` + MPI operations: MPI aborts with MPI_ERR_COMM (the MPI
      communicators are never set up).
    * Gloo for both under mpirun: Gloo finds none of horovodrun's rendezvous variables, so every
      rank forms a world of size 1 and no gradient is ever exchanged.
    """

    def lib(var: str) -> str:
        return environ.get(var, "mpi").strip().lower() or "mpi"

    controller, ops = lib("HOROVOD_CONTROLLER"), lib("HOROVOD_CPU_OPERATIONS")
    if ops == "gloo" and controller == "mpi":
        raise UserError("HOROVOD_CPU_OPERATIONS=gloo with Horovod's MPI controller crashes Horovod 0.28.1 "
                        "(segmentation fault in the first allreduce); unset HOROVOD_CPU_OPERATIONS, or use Gloo "
                        "for both through `horovodrun --gloo`")
    if controller == "gloo" and ops != "gloo":
        raise UserError("HOROVOD_CONTROLLER=gloo with MPI CPU operations aborts with MPI_ERR_COMM; unset "
                        "HOROVOD_CONTROLLER, or use Gloo for both through `horovodrun --gloo`")
    if controller == "gloo" and "HOROVOD_GLOO_RENDEZVOUS_ADDR" not in environ:
        raise UserError("HOROVOD_CONTROLLER=gloo without horovodrun's rendezvous: every rank would train alone "
                        "(world size 1, no exchange); unset HOROVOD_CONTROLLER and HOROVOD_CPU_OPERATIONS under "
                        "mpirun, or launch with `horovodrun --gloo`")


class HorovodAllreduce(GradientExchange):
    """Every worker holds all parameters; gradients are averaged with Horovod's ring allreduce.

    Horovod starts the allreduce of each gradient from a backward hook as soon as it is ready,
    fusing small tensors (HOROVOD_FUSION_THRESHOLD), so communication overlaps the rest of the
    backward pass; :meth:`synchronize` waits for whatever is still in flight.
    """

    name = "allreduce"

    def __init__(self, cfg: ExchangeConfig) -> None:
        self.cfg = cfg
        check_horovod_env(os.environ)
        self.hvd = hvd = _import_horovod()
        hvd.init()  # communication: forms the process group (MPI_Init under mpirun)
        self.rank, self.size = hvd.rank(), hvd.size()
        self.local_rank, self.local_size = hvd.local_rank(), hvd.local_size()
        self._optimizer = None

    def describe(self) -> dict[str, Any]:
        return {
            "compression": self.cfg.compression,
            "backward_passes_per_step": self.cfg.backward_passes_per_step,
            "reduce_op": self.cfg.reduce_op,
            "horovod_controller": "mpi" if self.hvd.mpi_enabled() else "gloo",
        }

    def prepare(self, model, optimizer):
        hvd = self.hvd
        compression = hvd.Compression.fp16 if self.cfg.compression == "fp16" else hvd.Compression.none
        op = hvd.Adasum if self.cfg.reduce_op == "adasum" else hvd.Average
        # communication: wraps step() so gradients are allreduced from backward hooks.
        wrapped = hvd.DistributedOptimizer(
            optimizer,
            named_parameters=model.named_parameters(),
            compression=compression,
            backward_passes_per_step=self.cfg.backward_passes_per_step,
            op=op,
        )
        # The wrapper is a new optimizer over the same parameters with empty state: carry over
        # what was loaded from a checkpoint (momentum buffers), or a resumed run would diverge.
        wrapped.load_state_dict(optimizer.state_dict())
        # communication: rank 0's parameters and optimizer state (fresh or from a checkpoint) to all.
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        hvd.broadcast_optimizer_state(wrapped, root_rank=0)
        self._optimizer = wrapped
        return wrapped

    def synchronize(self) -> None:
        self._optimizer.synchronize()  # communication: wait for the in-flight allreduces

    def apply(self, optimizer) -> None:
        with optimizer.skip_synchronize():
            optimizer.step()

    def sum_over_workers(self, values: torch.Tensor) -> torch.Tensor:
        return self.hvd.allreduce(values, op=self.hvd.Sum, name="metrics")  # communication

    def broadcast_object(self, obj: Any, root: int = 0) -> Any:
        return self.hvd.broadcast_object(obj, root_rank=root)  # communication

    def allgather_object(self, obj: Any) -> list[Any]:
        return self.hvd.allgather_object(obj, name="allgather_object")  # communication

    def close(self) -> None:
        self.hvd.shutdown()

    def abort(self, code: int) -> None:
        if self.size > 1:
            # MPI_Abort makes mpirun end every rank at once; ranks blocked in a collective would
            # otherwise wait forever for the one that failed.
            from mpi4py import MPI

            MPI.COMM_WORLD.Abort(code)
        os._exit(code)
