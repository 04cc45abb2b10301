"""Ring allreduce through Horovod (MPI or Gloo on CPU, NCCL on GPU)."""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Mapping, MutableMapping
from types import ModuleType
from typing import Any

import torch

from .. import watchdog
from ..config import ExchangeConfig, HorovodConfig
from ..errors import UserError
from .base import GradientExchange
from .horovod_shard import HorovodShardCollectives
from .mpi import abort, launched_as, yield_when_idle
from .wire import FLOAT32, WireFormat

POLL_S = 1e-4  # sleep between polls of an in-flight allreduce: ~1 % of a LeNet-5 step
ONE_HOST_CYCLE_MS = "0.25"  # HOROVOD_CYCLE_TIME when every rank is on this host (measured: docs/performance.md)
ONE_HOST_FUSION_BYTES = str(4 << 20)  # HOROVOD_FUSION_THRESHOLD likewise


def _import_horovod() -> ModuleType:
    try:
        import horovod.torch as hvd
    except ImportError as e:
        raise UserError(
            f"horovod.torch cannot be imported ({e}); run `make install` (it builds the patched Horovod wheel)"
        ) from None
    return hvd


def check_horovod_env(environ: Mapping[str, str]) -> None:
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
        raise UserError(
            "HOROVOD_CPU_OPERATIONS=gloo with Horovod's MPI controller crashes Horovod 0.28.1 "
            "(segmentation fault in the first allreduce); unset HOROVOD_CPU_OPERATIONS, or use Gloo "
            "for both through `horovodrun --gloo`"
        )
    if controller == "gloo" and ops != "gloo":
        raise UserError(
            "HOROVOD_CONTROLLER=gloo with MPI CPU operations aborts with MPI_ERR_COMM; unset "
            "HOROVOD_CONTROLLER, or use Gloo for both through `horovodrun --gloo`"
        )
    if controller == "gloo" and "HOROVOD_GLOO_RENDEZVOUS_ADDR" not in environ:
        raise UserError(
            "HOROVOD_CONTROLLER=gloo without horovodrun's rendezvous: every rank would train alone "
            "(world size 1, no exchange); unset HOROVOD_CONTROLLER and HOROVOD_CPU_OPERATIONS under "
            "mpirun, or launch with `horovodrun --gloo`"
        )


def one_host(environ: Mapping[str, str]) -> bool:
    """Whether every rank of the mpirun job runs on this host (True outside mpirun: a world of one)."""
    return environ.get("OMPI_COMM_WORLD_LOCAL_SIZE", "1") == environ.get("OMPI_COMM_WORLD_SIZE", "1")


def gloo_under_mpirun(environ: MutableMapping[str, str]) -> Any:
    """Let Horovod run Gloo for control and data under mpirun on one host, as ``horovodrun --gloo`` does.

    Gloo ranks find each other through an HTTP rendezvous that horovodrun normally serves: rank 0
    serves it here on the loopback interface, MPI tells the others its port, and each rank gets the
    variables horovodrun would have set. Returns rank 0's server (None elsewhere).
    """
    from horovod.runner.common.util.hosts import SlotInfo
    from horovod.runner.http.http_server import RendezvousHandler, RendezvousHTTPServer
    from mpi4py import MPI

    place = launched_as(environ)
    rank, size = place.rank, place.size
    host, server, port = socket.gethostname(), None, None
    if rank == 0:
        server = RendezvousHTTPServer(("127.0.0.1", 0), RendezvousHandler, 0)
        port = server.server_address[1]
        server.init(
            [
                SlotInfo(hostname=host, rank=r, local_rank=r, cross_rank=0, size=size, local_size=size, cross_size=1)
                for r in range(size)
            ]
        )
        threading.Thread(target=server.serve_forever, daemon=True, name="gloo-rendezvous").start()
    port = MPI.COMM_WORLD.bcast(port, root=0)  # communication: the rendezvous port, from rank 0
    environ.update(
        {
            "HOROVOD_CONTROLLER": "gloo",
            "HOROVOD_CPU_OPERATIONS": "gloo",
            "HOROVOD_GLOO_IFACE": "lo",
            "HOROVOD_GLOO_RENDEZVOUS_ADDR": "127.0.0.1",
            "HOROVOD_GLOO_RENDEZVOUS_PORT": str(port),
            "HOROVOD_HOSTNAME": host,
            "HOROVOD_RANK": str(rank),
            "HOROVOD_SIZE": str(size),
            "HOROVOD_LOCAL_RANK": str(rank),
            "HOROVOD_LOCAL_SIZE": str(size),
            "HOROVOD_CROSS_RANK": "0",
            "HOROVOD_CROSS_SIZE": "1",
        }
    )
    return server


def wants_gloo(cfg: HorovodConfig, environ: Mapping[str, str]) -> bool:
    """Whether to start Gloo under mpirun (``--horovod-backend gloo``, every rank on this host).

    Horovod's own variables (HOROVOD_CONTROLLER, HOROVOD_CPU_OPERATIONS) and a rendezvous that
    horovodrun already set up take precedence; outside mpirun Horovod forms a world of one.
    """
    if "OMPI_COMM_WORLD_SIZE" not in environ or any(
        v in environ for v in ("HOROVOD_CONTROLLER", "HOROVOD_CPU_OPERATIONS", "HOROVOD_GLOO_RENDEZVOUS_ADDR")
    ):
        return False
    if cfg.backend == "gloo" and not one_host(environ):
        raise UserError(
            "--horovod-backend gloo under mpirun needs every rank on one host (its rendezvous listens on "
            "127.0.0.1); use --horovod-backend mpi, or launch with `horovodrun --gloo`"
        )
    return cfg.backend == "gloo"


def wants_connect_first(environ: Mapping[str, str], gloo: bool) -> bool:
    """Whether to exchange once through mpi4py before ``hvd.init()``: under mpirun, ranks on more than
    one host, Horovod on MPI; ``ALLREDUCE_TRAIN_CONNECT_FIRST=0`` turns it off, ``=1`` forces it on one host."""
    choice = environ.get("ALLREDUCE_TRAIN_CONNECT_FIRST", "auto")
    if choice not in ("auto", "0", "1"):
        raise UserError(f"ALLREDUCE_TRAIN_CONNECT_FIRST={choice!r}: use 1, 0 or auto (the default: 1 across hosts)")
    size = environ.get("OMPI_COMM_WORLD_SIZE", "1")
    if choice == "0" or gloo or size == "1" or environ.get("HOROVOD_CONTROLLER", "mpi") != "mpi":
        return False
    return choice == "1" or not one_host(environ)


def connect_first() -> None:
    """One small MPI_Allreduce over every rank from this thread, before Horovod's background thread
    initialises MPI's use: the ranks' first MPI traffic then does not come from that thread.

    Why: on 2 emulated hosts at 100 Mbit/s, Horovod's allreduce of the LSTM's 18.6 MB took 1.5x the
    alpha-beta model when Horovod's thread was the first to talk to the other rank, 1.06-1.09x (like
    mpi4py's own) after this exchange; the LSTM's step went from 2.72 to 1.71 s (medians of 6 jobs;
    docs/emulated_cluster.md). MPI is then initialised by mpi4py (MPI_THREAD_MULTIPLE, as Horovod
    asks) and finalised by it at exit; Horovod finds it initialised and leaves both to mpi4py.
    """
    import numpy as np
    from mpi4py import MPI

    ones = np.ones(256, dtype=np.float32)
    MPI.COMM_WORLD.Allreduce(ones, np.empty_like(ones), op=MPI.SUM)  # communication: the first between the ranks


def exchange_at_one_rank(environ: Mapping[str, str]) -> bool:
    """``ALLREDUCE_TRAIN_EXCHANGE_AT_ONE_RANK=1``, for checks (tools/gpu_check.sh): a job of one rank
    still sends every gradient through Horovod's allreduce (NCCL for CUDA tensors), which it otherwise
    skips, so its step can be compared with a bare Horovod or DDP loop of one rank."""
    choice = environ.get("ALLREDUCE_TRAIN_EXCHANGE_AT_ONE_RANK", "0")
    if choice not in ("0", "1"):
        raise UserError(f"ALLREDUCE_TRAIN_EXCHANGE_AT_ONE_RANK={choice!r}: use 1 (for checks) or 0 (the default)")
    return choice == "1"


def _cycle_ms(environ: Mapping[str, str]) -> float | None:
    """The HOROVOD_CYCLE_TIME Horovod runs with (its default: 1 ms); None if it is not a number."""
    try:
        return float(environ.get("HOROVOD_CYCLE_TIME", 1.0))
    except ValueError:
        return None


def _power_of_2(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def check_adasum(hvd: ModuleType) -> None:
    """Refuse, in one line, a job where Horovod 0.28.1 cannot run ``--reduce-op adasum`` (its Adasum
    needs MPI: the Adasum operations exist only under the MPI controller, operations.cc; and on CPU a
    power-of-2 number of ranks, which mpi_ops.py checks only inside the first backward hook). Its GPU
    conditions (NCCL within a host, MPI across: the same ranks on every host, a power-of-2 number of
    hosts) it raises itself, from that hook, on every rank alike."""
    if not hvd.mpi_enabled():
        raise UserError(
            "--reduce-op adasum: Horovod runs Adasum over MPI only, and this job runs Horovod on Gloo; "
            "use --horovod-backend mpi under mpirun (not horovodrun --gloo), or --reduce-op average"
        )
    if not _power_of_2(hvd.size()):
        raise UserError(
            f"--reduce-op adasum: Horovod's Adasum needs a power-of-2 number of ranks (this job has "
            f"{hvd.size()}); use -np 2, 4, 8, ... or --reduce-op average"
        )


class HorovodAllreduce(GradientExchange):
    """Every worker holds all parameters; gradients are averaged with Horovod's ring allreduce.

    Horovod starts the allreduce of each gradient from a backward hook as soon as it is ready,
    fusing small tensors (HOROVOD_FUSION_THRESHOLD), so communication overlaps the rest of the
    backward pass; :meth:`synchronize` waits for whatever is still in flight.
    """

    name = "allreduce"

    def __init__(self, cfg: ExchangeConfig, horovod: HorovodConfig, wire: WireFormat = FLOAT32) -> None:
        """``wire``: the run's wire format, whose dtype gradients are summed in (float32 or float16, which
        Horovod's Compression.fp16 sends; config's table refuses bfloat16, which 0.28.1 cannot sum)."""
        self.cfg, self.wire = cfg, wire
        self.hvd = hvd = _import_horovod()
        self._rendezvous = gloo_under_mpirun(os.environ) if wants_gloo(horovod, os.environ) else None
        check_horovod_env(os.environ)
        wait = os.environ.get("ALLREDUCE_TRAIN_WAIT", "sleep")
        if wait not in ("sleep", "horovod"):
            raise UserError(f"ALLREDUCE_TRAIN_WAIT={wait!r}: use sleep (the default) or horovod")
        self._sleep_wait = wait == "sleep"
        yield_when_idle()  # with MPI: a rank waiting in a collective yields its core
        # The background thread looks for ready gradients every HOROVOD_CYCLE_TIME ms; the last ones
        # of a step wait for the next cycle. With the cycle-phase patch an idle cycle costs little,
        # so on one host a short cycle wins (LeNet-5, 2 ranks: 0.25 ms ~10 % faster than Horovod's
        # 1 ms, 3 ms ~20 % slower; docs/performance.md). Across hosts every cycle is a network
        # round trip: Horovod's default stays.
        # One process exchanges nothing (prepare() skips Horovod): a slow cycle keeps the idle
        # thread's CPU (~11 % of a core at 0.25 ms) for training.
        # (HOROVOD_SIZE: a job that horovodrun --gloo or tools/gpu_check.sh started without mpirun.)
        world = os.environ.get("OMPI_COMM_WORLD_SIZE", os.environ.get("HOROVOD_SIZE", "1"))
        self._exchange_alone = exchange_at_one_rank(os.environ)
        if world == "1" and not self._exchange_alone:
            os.environ.setdefault("HOROVOD_CYCLE_TIME", "5")
        elif one_host(os.environ):
            os.environ.setdefault("HOROVOD_CYCLE_TIME", ONE_HOST_CYCLE_MS)
            # Fused buffers of 4 MB instead of 128 MB leave during backward instead of after it: the
            # LSTM's 18.6 MB of gradients ~4 % faster at 2 ranks, LeNet-5 and ResNet-18 unchanged.
            os.environ.setdefault("HOROVOD_FUSION_THRESHOLD", ONE_HOST_FUSION_BYTES)
        if cfg.stall_timeout:
            # Horovod's stall inspector names the tensors (and ranks) it waits for while the
            # coordinator still cycles; its shutdown is a backstop behind the trainer's own watchdog.
            check = max(1, int(cfg.stall_timeout / 2))
            os.environ.setdefault("HOROVOD_STALL_CHECK_TIME_SECONDS", str(check))
            os.environ.setdefault("HOROVOD_STALL_SHUTDOWN_TIME_SECONDS", str(int(cfg.stall_timeout) + check))
        self._connected_first = wants_connect_first(os.environ, gloo=self._rendezvous is not None)
        if self._connected_first:
            connect_first()
        hvd.init()  # communication: forms the process group (MPI_Init under mpirun, or Gloo's rendezvous)
        self.rank, self.size = hvd.rank(), hvd.size()
        self.local_rank, self.local_size = hvd.local_rank(), hvd.local_size()
        if cfg.reduce_op == "adasum":
            check_adasum(hvd)
        self._adasum = False  # Horovod's Adasum optimizer wraps the model's (prepare())
        self._optimizer = None
        self._local_params: list[torch.Tensor] | None = None  # every_step=False: the gradients synchronize() sums
        self._exchanging = True
        self._bucket_of: dict[Any, int] = {}  # --trace-steps: each parameter's index, its bucket in the trace

    def describe(self) -> dict[str, Any]:
        return {
            "allreduce_engine": "horovod",
            "backward_passes_per_step": self.cfg.backward_passes_per_step,
            "reduce_op": self.cfg.reduce_op,
            "horovod_controller": "mpi" if self.hvd.mpi_enabled() else "gloo",
            "horovod_cycle_time_ms": _cycle_ms(os.environ),
            "horovod_fusion_threshold": os.environ.get("HOROVOD_FUSION_THRESHOLD", "default"),
            "horovod_connect_first": self._connected_first,
            "horovod_exchange_at_one_rank": self._exchange_alone,
        }

    def prepare(
        self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, every_step: bool = True
    ) -> torch.optim.Optimizer:
        if self.size == 1 and not self._exchange_alone:
            # The average over one worker is its own gradient: skip Horovod's hooks, copies and
            # background-thread round trips altogether (no fp16 round trip either: nothing is sent).
            return optimizer
        hvd = self.hvd
        compression = hvd.Compression.fp16 if self.wire.dtype == torch.float16 else hvd.Compression.none
        op = hvd.Adasum if self.cfg.reduce_op == "adasum" else hvd.Average
        if not every_step:
            # A schedule that skips steps (local SGD, DiLoCo) or a wire format that sums after backward
            # (PowerSGD): no DistributedOptimizer, whose backward hooks would send every step's
            # gradients; synchronize() averages an exchanging step's in one grouped allreduce.
            # communication: rank 0's optimizer state (resumed runs only, as below), then its parameters
            if hvd.broadcast_object(bool(optimizer.state_dict()["state"]), root_rank=0, name="has_optimizer_state"):
                hvd.broadcast_optimizer_state(optimizer, root_rank=0)
            hvd.broadcast_parameters(model.state_dict(), root_rank=0)
            self._local_params = [p for p in model.parameters() if p.requires_grad]
            self._compression = compression
            return optimizer
        # Horovod 0.28.1 wraps with its Adasum optimizer only at more than one rank (DistributedOptimizer)
        self._adasum = op is hvd.Adasum and self.size > 1
        # communication: wraps step() so gradients are allreduced from backward hooks (with Adasum: each
        # parameter's update, computed in its hook).
        wrapped = hvd.DistributedOptimizer(
            optimizer,
            named_parameters=model.named_parameters(),
            compression=compression,
            backward_passes_per_step=self.cfg.backward_passes_per_step,
            op=op,
        )
        if self.size == 1:
            # Exchange at one rank (for checks): Horovod registers its backward hooks only at size > 1
            # (0.28.1, DistributedOptimizer.__init__); without them synchronize() would send every
            # gradient after backward instead of as each is ready, unlike a real job.
            wrapped._register_hooks()
        # The wrapper is a new optimizer over the same parameters with empty state: carry over
        # what was loaded from a checkpoint (momentum buffers), or a resumed run would diverge.
        wrapped.load_state_dict(optimizer.state_dict())
        # communication: rank 0's optimizer state, only when it has one (a resumed run). Horovod
        # fills an empty state by one step() with zero gradients, which with weight decay would
        # decay the parameters before training; a fresh run has identical (empty) state anyway.
        if hvd.broadcast_object(bool(wrapped.state_dict()["state"]), root_rank=0, name="has_optimizer_state"):
            hvd.broadcast_optimizer_state(wrapped, root_rank=0)
        # communication: rank 0's parameters to all, after the state: the zero-gradient step above
        # may have touched the other ranks' parameters.
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        self._optimizer = wrapped
        if self.tracer.active:
            self._trace_buckets(wrapped)
        return wrapped

    def _trace_buckets(self, wrapped: Any) -> None:  # Any: Horovod's DistributedOptimizer, no type information
        """--trace-steps: each parameter's allreduce_async_ (Horovod's hook starts it) is a bucket of the trace,
        from that call to the moment :meth:`synchronize` sees its handle done (Horovod's timeline has a row
        per tensor too). Only here is Horovod's method wrapped, on this run's optimizer."""
        params = [p for group in wrapped.param_groups for p in group["params"]]
        self._bucket_of = {p: i for i, p in enumerate(params)}
        send = wrapped._allreduce_grad_async

        def traced(p: torch.Tensor) -> Any:
            self.tracer.bucket_start(self._bucket_of[p])
            return send(p)

        wrapped._allreduce_grad_async = traced

    def shard_collectives(self) -> HorovodShardCollectives:
        """Reduce-scatter and allgather of buckets through this engine's Horovod, for ``--strategy sharded``."""
        return HorovodShardCollectives(self.hvd, self.cfg.stall_timeout, exchange_alone=self._exchange_alone)

    def set_exchanging(self, on: bool) -> None:
        self._exchanging = on

    def synchronize(self) -> None:
        if self._local_params is not None:
            if self._exchanging:
                self._average_local_grads()
            return
        if self._optimizer is None:  # one worker: nothing to exchange
            return
        # Horovod's own wait spins on sched_yield; on a host without a spare core the spinning thread
        # takes CPU from the background thread that does the allreduce and from the other ranks'
        # backward pass. Sleep until every handle is done, so the wait below returns at once.
        # ALLREDUCE_TRAIN_WAIT=horovod keeps Horovod's wait (for comparison: docs/performance.md).
        # (_handles: {param: (handle, ctx)} in Horovod 0.28; None/callable handles are not in flight.)
        if self._sleep_wait:
            with watchdog.waiting():
                for p, (handle, _) in list(getattr(self._optimizer, "_handles", {}).items()):
                    if handle is None or callable(handle):
                        continue
                    while not self.hvd.poll(handle):
                        time.sleep(POLL_S)
                    self.tracer.bucket_done(self._bucket_of.get(p, -1))
        self._optimizer.synchronize()  # communication: wait for the in-flight allreduces
        if self.tracer.on:  # ALLREDUCE_TRAIN_WAIT=horovod: each seen done only now
            for i in self._bucket_of.values():
                self.tracer.bucket_done(i)

    def _average_local_grads(self) -> None:
        """An exchanging step without the DistributedOptimizer: every gradient averaged, as it would."""
        assert self._local_params is not None  # synchronize() calls this only when prepare() kept them
        grads = []
        for p in self._local_params:
            if p.grad is None:  # outside this step's loss: zeros, as Horovod sends for it
                p.grad = torch.zeros_like(p)
            grads.append(p.grad)
        wire = [self._compression.compress(g) for g in grads]
        # communication: the step's gradients, one grouped (fused) allreduce
        handle = self.hvd.grouped_allreduce_async([t for t, _ in wire], op=self.hvd.Average, name="grads")
        self.tracer.bucket_start(0)  # the whole group: the trace's one bucket
        for g, out, (_, ctx) in zip(grads, self._wait(handle), wire, strict=True):
            self.tracer.bucket_done(0)
            g.copy_(self._compression.decompress(out, ctx))

    def sum_tensors(self, tensors: list[torch.Tensor], name: str = "") -> list[torch.Tensor]:
        """The grouped sum as Horovod does it: one grouped (fused) allreduce, on the tensors' device (not
        the base's flatten -> :meth:`sum_over_workers` -> unflatten on the CPU)."""
        if self.size == 1 and not self._exchange_alone:
            return [t.clone() for t in tensors]  # nothing to add (callers divide the result in place)
        # communication: e.g. PowerSGD's factors, local SGD's parameters, DiLoCo's deltas
        return self._wait(self.hvd.grouped_allreduce_async(tensors, op=self.hvd.Sum, name=name or "sum_tensors"))

    def apply(self, optimizer: torch.optim.Optimizer) -> None:
        if self._optimizer is None or self._adasum:
            # Adasum: Horovod's optimizer already stepped each parameter in its backward hook and sent the
            # update; step() waits for the combined updates and applies them (it has no skip_synchronize:
            # there is no gradient sum to skip).
            optimizer.step()
            return
        with optimizer.skip_synchronize():
            optimizer.step()

    def _wait(self, handle: Any) -> Any:
        """Horovod's result for ``handle`` (an int; the vote's sits in the base's tensor-typed ``_vote``),
        waiting in Python (see synchronize) so that the stall watchdog's thread keeps running while this
        rank waits for a peer."""
        with watchdog.waiting():
            while not self.hvd.poll(handle):
                time.sleep(POLL_S)
        return self.hvd.synchronize(handle)

    def sum_over_workers(self, values: torch.Tensor) -> torch.Tensor:
        if self.size == 1:  # nothing to add: no round trip through the background thread
            return values
        return self._wait(self.hvd.allreduce_async(values, op=self.hvd.Sum, name="metrics"))  # communication

    def start_vote(self, flags: torch.Tensor) -> None:
        # communication: enqueued right after backward, so Horovod negotiates (and fuses) it with
        # the step's last gradients instead of costing a cycle of its own
        self._vote = flags if self.size == 1 else self.hvd.allreduce_async(flags, op=self.hvd.Sum, name="vote")

    def end_vote(self) -> torch.Tensor:
        return self._vote if self.size == 1 else self._wait(self._vote)

    def broadcast_object(self, obj: Any, root: int = 0) -> Any:
        if self.size == 1:
            return obj
        # communication. A fixed name: Horovod's default is the object's type name, which differs
        # where only the root has a value (None elsewhere) and would leave the ranks waiting apart.
        return self.hvd.broadcast_object(obj, root_rank=root, name="broadcast_object")

    def allgather_object(self, obj: Any) -> list[Any]:
        if self.size == 1:
            return [obj]
        return self.hvd.allgather_object(obj, name="allgather_object")  # communication

    def leave(self) -> None:
        self.hvd.shutdown()
        if self._rendezvous is not None:
            self._rendezvous.shutdown()

    def abort(self, code: int) -> None:
        if self.size == 1:
            abort(code)
        from mpi4py import MPI  # Horovod formed the group under mpirun: MPI is there

        abort(code, MPI.COMM_WORLD)
