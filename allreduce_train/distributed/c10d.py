"""torch.distributed (c10d) as an engine: ``--allreduce-engine torch``.

Gloo on CPU, NCCL on a GPU, no Horovod build: the process group is torch's own
(``cpu:gloo,cuda:nccl`` where CUDA is present, so each tensor's device picks its backend), formed
under mpirun from Open MPI's environment (``OMPI_COMM_WORLD_RANK``/``SIZE``). Rank 0 serves the
rendezvous (a ``TCPStore`` on a free port) and MPI tells the other ranks where: ``MASTER_ADDR`` if
set, 127.0.0.1 when every rank is on one host, else rank 0's IPv4 addresses, of which each rank
takes the first it can reach. Objects, metrics and the step's vote travel on a Gloo group of their
own (CPU tensors); the gradients on the default group.

Like the mpi engine (:mod:`.ring`), gradients are grouped into buckets of ``--torch-bucket-bytes``
bytes on the wire, and a bucket's ``all_reduce`` starts, asynchronously, from the gradient hook of
its last parameter, so the sums overlap the rest of backward; :meth:`synchronize` waits for them
(polling, with the stall deadline) and divides by N. The bucket's flat buffer is in the wire
format's dtype (the copy in is the cast). An engine only: wire formats and schedules are layers
(:mod:`.wire`, :mod:`.schedules`) over these primitives.
"""

from __future__ import annotations

import datetime
import os
import socket
from dataclasses import astuple
from typing import Any

import torch

from ..config import ExchangeConfig, TorchConfig
from ..errors import UserError
from .base import GradientExchange
from .bucketing import BucketedReduction, reverse_buckets
from .buffers import elements_in, flatten, views
from .mpi import abort, import_mpi, launched_as, poll, yield_when_idle
from .wire import FLOAT32, WireFormat


def _ipv4_addresses() -> list[str]:
    """This host's IPv4 addresses, loopback last (candidates for the other ranks to reach rank 0)."""
    import fcntl
    import struct

    found = []
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for _, name in socket.if_nameindex():
            try:  # SIOCGIFADDR
                packed = fcntl.ioctl(s.fileno(), 0x8915, struct.pack("256s", name[:15].encode()))
            except OSError:
                continue  # no IPv4 address on this interface
            found.append(socket.inet_ntoa(packed[20:24]))
    return sorted(found, key=lambda a: a.startswith("127."))


def _reachable(addresses: list[str], port: int) -> str:
    for addr in addresses:
        try:
            socket.create_connection((addr, port), timeout=2).close()
            return addr
        except OSError:
            continue
    raise UserError(
        f"--allreduce-engine torch: rank 0's rendezvous (port {port}) is not reachable at any of "
        f"{', '.join(addresses)}; set MASTER_ADDR to an address of rank 0's host that every rank reaches"
    )


def _backend(choice: str) -> str:
    if choice == "gloo" or not torch.cuda.is_available():
        if choice == "nccl":
            raise UserError("--torch-backend nccl: no CUDA device here; use --torch-backend gloo or auto")
        return "gloo"
    return "cpu:gloo,cuda:nccl"  # each tensor's device picks: CPU tensors Gloo, CUDA tensors NCCL


class TorchDistributed(GradientExchange):
    """``--strategy allreduce --allreduce-engine torch``: see the module docstring."""

    name = "allreduce"

    def __init__(self, x: ExchangeConfig, cfg: TorchConfig, wire: WireFormat = FLOAT32) -> None:
        """``wire``: the run's wire format, whose dtype the buckets are summed in."""
        import torch.distributed as dist

        self.cfg, self.torch_cfg, self.dist, self.wire, self.dtype = x, cfg, dist, wire, wire.dtype
        env = os.environ
        self.rank, self.size, self.local_rank, self.local_size = astuple(launched_as())
        self.timeout = x.stall_timeout  # 0: wait forever
        self.backend = _backend(cfg.backend)
        self._flats: list[torch.Tensor] = []  # each bucket's, in the wire's dtype
        self._works: list[Any] = []  # each bucket's all_reduce in flight
        self.world = None
        if self.size == 1:
            return  # one process: every collective returns its input, no group to form
        yield_when_idle()
        MPI = import_mpi()
        self.world = MPI.COMM_WORLD
        store = None
        if self.rank == 0:  # communication: the rendezvous, served by rank 0 on a free port
            store = dist.TCPStore(
                "0.0.0.0",
                0,
                self.size,
                is_master=True,
                wait_for_workers=False,
                timeout=datetime.timedelta(seconds=self.timeout or 3600),
            )
            one_host = self.local_size == self.size
            where = (
                [env["MASTER_ADDR"]] if env.get("MASTER_ADDR") else ["127.0.0.1"] if one_host else _ipv4_addresses(),
                store.port,
            )
        else:
            where = None
        addresses, port = self.world.bcast(where, root=0)  # communication: where rank 0 listens
        if store is None:
            store = dist.TCPStore(
                _reachable(addresses, port),
                port,
                self.size,
                is_master=False,
                timeout=datetime.timedelta(seconds=self.timeout or 3600),
            )
        timeout = datetime.timedelta(seconds=self.timeout or 365 * 86400)
        # communication: forms the process group, and a Gloo group for objects, metrics and the vote
        dist.init_process_group(self.backend, store=store, rank=self.rank, world_size=self.size, timeout=timeout)
        self.cpu_group = dist.new_group(backend="gloo", timeout=timeout)

    # ------------------------------------------------------------ set-up
    def describe(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "allreduce_engine": "torch",
            "torch_backend": self.backend,
            "torch_bucket_bytes": self.torch_cfg.bucket_bytes,
            "backward_passes_per_step": self.cfg.backward_passes_per_step,
            "reduce_op": self.cfg.reduce_op,
        }
        if self._flats:
            out["torch_buckets"] = len(self._flats)
        return out

    def prepare(
        self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, every_step: bool = True
    ) -> torch.optim.Optimizer:
        if self.size == 1:
            return optimizer  # the average over one worker is its own gradient: nothing to send
        self.broadcast_state(model, optimizer)  # communication: rank 0's model and optimizer state
        params: list[torch.Tensor] = [p for p in model.parameters() if p.requires_grad]
        sizes = [p.numel() for p in params]
        buckets = reverse_buckets(sizes, elements_in(self.torch_cfg.bucket_bytes, self.dtype))
        self._flats = [
            torch.zeros(sum(sizes[p] for p in m), dtype=self.dtype, device=params[m[0]].device) for m in buckets
        ]
        self._works = [None] * len(buckets)
        # hooks honour set_exchanging (a schedule's local steps send nothing)
        self.reduction = BucketedReduction(
            params, buckets, self.cfg.backward_passes_per_step, self._start, self._done, tracer=self.tracer
        )
        return optimizer

    def flat_buffers(self) -> list[torch.Tensor]:
        """Each bucket's flat buffer (Gloo's and NCCL's own scratch is out of sight)."""
        return list(self._flats)

    # ------------------------------------------------------------ one step
    def set_exchanging(self, on: bool) -> None:
        if self.reduction is not None:
            self.reduction.exchanging = on

    def _start(self, b: int) -> None:
        assert self.reduction is not None
        self.reduction.pack(b, self._flats[b])
        # communication: the bucket, summed over the workers (NCCL for CUDA tensors, Gloo on CPU)
        self._works[b] = self.dist.all_reduce(self._flats[b], async_op=True)

    def _done(self, b: int) -> None:
        assert self.reduction is not None
        self.reduction.unpack(b, self._flats[b], self.size)
        self._works[b] = None

    def synchronize(self) -> None:
        if self.reduction is None:  # one worker: nothing to exchange
            return
        self.reduction.complete(lambda: self._wait(self._works, "the allreduce of the gradients"))

    def _wait(self, works: list[Any], what: str) -> None:
        """Poll (sleeping) until every work is done: the stall deadline holds, and the watchdog runs."""
        poll(lambda: all(w.is_completed() for w in works), self.timeout, what)
        for w in works:
            w.wait()  # raises what the collective raised

    def apply(self, optimizer: torch.optim.Optimizer) -> None:
        optimizer.step()

    # ------------------------------------------------------------ collectives for the layers and the trainer
    def sum_tensors(self, tensors: list[torch.Tensor], name: str = "") -> list[torch.Tensor]:
        """One all_reduce of the tensors laid end to end, on their device (the grouped sum)."""
        flat = flatten([t.detach() for t in tensors])
        if self.size > 1:
            # communication: e.g. PowerSGD's factors, local SGD's parameters, DiLoCo's deltas
            self._wait([self.dist.all_reduce(flat, async_op=True)], f"the other workers ({name or 'a sum'})")
        return views(flat, tensors)

    def sum_over_workers(self, values: torch.Tensor) -> torch.Tensor:
        out = values.detach().cpu().clone()
        if self.size > 1:  # communication: a metric sum, on the Gloo group
            self._wait([self.dist.all_reduce(out, group=self.cpu_group, async_op=True)], "the other workers (metrics)")
        return out

    def start_vote(self, flags: torch.Tensor) -> None:
        self._vote = flags.detach().cpu().clone()
        # communication: the step's vote, started before the last backward, back with the gradients
        self._vote_work = (
            self.dist.all_reduce(self._vote, group=self.cpu_group, async_op=True) if self.size > 1 else None
        )

    def end_vote(self) -> torch.Tensor:
        if self._vote_work is not None:
            self._wait([self._vote_work], "the other workers (the step's vote)")
        return self._vote

    def broadcast_object(self, obj: Any, root: int = 0) -> Any:
        if self.size == 1:
            return obj
        box = [obj]
        self.dist.broadcast_object_list(box, src=root, group=self.cpu_group)  # communication
        return box[0]

    def allgather_object(self, obj: Any) -> list[Any]:
        if self.size == 1:
            return [obj]
        out: list[Any] = [None] * self.size
        self.dist.all_gather_object(out, obj, group=self.cpu_group)  # communication
        return out

    # ------------------------------------------------------------ shutdown
    def leave(self) -> None:
        if self.size > 1 and self.dist.is_initialized():
            self.dist.destroy_process_group()

    def abort(self, code: int) -> None:
        abort(code, self.world)  # MPI_Abort: mpirun ends every rank, none waits in a collective
