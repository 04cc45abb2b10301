"""The parameter-server strategy on MPI point-to-point messages (mpi4py).

Servers hold the parameters and run the user's optimizer on them (any ``torch.optim.Optimizer``:
SGD, AdamW with a group without weight decay, a class of one's own), so its state lives sharded on
the servers; workers compute gradients, push them to the servers that own them and pull the
updated parameters back. Two placements, after the two designs the seed paper compared:

* ``dedicated`` (TensorFlow-style, centralized): the first K ranks only serve; the others train.
* ``colocated`` (MXNet-style, decentralized): every rank trains and also serves 1/N of the
  parameters. A rank's server part runs whenever its worker part waits on the exchange (in the
  gradient hooks and while waiting for replies), so no second thread competes for the GIL.

And two modes: ``sync`` (a server waits for every worker's gradient of a bucket, averages, steps
the optimizer once and sends the same parameters to all: the mathematics of allreduce + the
optimizer) and ``async`` (a server steps on each worker's gradient on arrival, scaled by 1/workers
so that one gradient per worker moves SGD's parameters as far as one synchronous step, and answers
that worker alone; Adam normalises the scale away, so there each push is a whole step, and
``step`` counts pushes).

Each server steps its own slice of the parameters, so an optimizer whose update of an element
depends only on that element and its own state (SGD, Adam, AdamW, RMSprop, Adagrad, ...) computes
exactly what it computes on the whole model. One whose update reads other elements of the same
tensor (Adafactor's factored moments, Shampoo's preconditioners, LAMB's or LARS's per-tensor trust
ratio) sees only a server's chunk of a tensor that ``--ps-split-bytes`` splits: raise
``--ps-split-bytes`` above the largest tensor's bytes to keep every tensor whole on one server.

Engineering that a fair comparison needs (BytePS, OSDI'20, traced the slowness of the parameter
servers of that era to its absence): gradients are fused into one message per (bucket, server)
instead of one per tensor; a bucket is pushed from a gradient hook as soon as backward has
produced it, so the transfer overlaps the rest of backward; big tensors are split across servers
so no server is a hot spot (see :mod:`..bucketing`); all transfers are non-blocking and receive
buffers are posted before the message that they answer is sent.

Failure is bounded: every wait polls with a deadline (``--stall-timeout`` seconds without progress)
and then raises :class:`~allreduce_train.errors.Stalled`, which the command line turns into the
stall watchdog's report and exit 69 (the watchdog thread ends a wait that never returns to Python
the same way); a rank that dies makes mpirun end the job by itself.

As an engine, the PS is one whose sum happens on the servers, and the sum is not all they do: they
also step the optimizer and answer with parameters. So a wire format cannot be a layer over it the
way it is over an allreduce engine: with 16 bits the pushes are rounded gradients, but the pulls are
rounded *parameters*, and the servers must keep float32 master parameters and state (a 16-bit master
would lose every update smaller than its rounding). The PS therefore takes the wire dtype as its
message dtype (``wire.dtype``) and owns both casts; PowerSGD, local SGD and DiLoCo, which need the
workers to hold the parameters, are refused by config's table.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from ...config import ExchangeConfig, PSConfig
from ...errors import ConfigError, UserError
from ..base import GradientExchange
from ..bucketing import BucketedReduction, plan
from ..buffers import elements_in, pack, unpack
from ..mpi import (
    MAX_BUCKETS,
    abort,
    allgather_pickle,
    bcast_pickle,
    end_sum,
    import_mpi,
    node_rank,
    poll,
    start_sum,
    sum_now,
)
from ..shardstate import assemble
from ..wire import FLOAT32, WireFormat
from .optimizer import describe, server_side

if TYPE_CHECKING:  # imported when the engine starts (import_mpi)
    from mpi4py.MPI import Comm
from .server import ELEM, STATE_BYTES, STATE_FULL, TAG_DONE, TAG_STATE, Server, message, push_slots


class ParameterServer(GradientExchange):
    """``--strategy ps``: see the module docstring."""

    name = "ps"

    def __init__(self, x: ExchangeConfig, ps: PSConfig, grad_clip: float = 0.0, wire: WireFormat = FLOAT32) -> None:
        """``grad_clip``: ``--grad-clip``, which the servers apply (sync) or each worker before it pushes
        (async); ``wire``: the run's wire format, whose dtype pushes and pulls travel in (the module
        docstring says why it is the engine's)."""
        self.xcfg, self.pcfg = x, ps
        self.MPI = MPI = import_mpi()
        world = self.world = MPI.COMM_WORLD
        self.rank, self.size = world.Get_rank(), world.Get_size()
        n = self.size
        if ps.placement == "dedicated":
            k = ps.servers or 1
            if k >= n:
                raise ConfigError(
                    f"--ps-servers {k} with {n} ranks leaves no worker: dedicated servers are the first "
                    f"--ps-servers ranks; launch more ranks (-np {k + 1} or more) or use fewer servers"
                )
            self.server_ranks, self.worker_ranks = list(range(k)), list(range(k, n))
        else:
            if ps.servers not in (0, n):
                raise ConfigError(
                    f"--ps-servers {ps.servers}: --ps-placement colocated puts one server on every "
                    f"rank ({n}); leave --ps-servers at 0 or use --ps-placement dedicated"
                )
            self.server_ranks = self.worker_ranks = list(range(n))
        self.main_rank = self.worker_ranks[0]
        # communication: collectives over every rank, in the same order everywhere
        self.local_rank, self.local_size = node_rank(world, MPI)
        self.workers_comm = world.Split(0 if self.is_worker else MPI.UNDEFINED, self.rank)
        self.push, self.pull = world.Dup(), world.Dup()
        self._server: Server | None = None
        self._started = False
        self._stale_sum = self._stale_n = 0
        self._stale_max = 0
        # Clipping: sync clips the averaged gradient on the servers (see server.Server); async clips each
        # worker's own gradient, which needs its whole norm first, so all pushes wait for synchronize().
        self.clip = grad_clip
        self.wire, self.dtype = wire, wire.dtype  # pushes and pulls (compression.py says where the casts go)
        self._clip_local = grad_clip if ps.mode == "async" else 0.0
        self._window = [0, 0, 0, 0]  # since the last stats(): steps, staleness sum, count, max

    # ------------------------------------------------------------ roles
    @property
    def is_main(self) -> bool:
        """The first *worker* writes logs, metrics and checkpoints: with dedicated servers, rank 0
        serves and never runs the training loop."""
        return self.rank == self.main_rank

    @property
    def is_worker(self) -> bool:
        return self.rank in self.worker_ranks

    @property
    def num_workers(self) -> int:
        return len(self.worker_ranks)

    @property
    def worker_index(self) -> int:
        return self.worker_ranks.index(self.rank) if self.is_worker else 0

    @property
    def _server_index(self) -> int | None:
        return self.server_ranks.index(self.rank) if self.rank in self.server_ranks else None

    @property
    def _idle(self) -> Callable[[], bool] | None:
        return self._server.progress if self._server is not None else None

    def _poll(self, test: Callable[[], bool], what: str) -> None:
        poll(test, self.xcfg.stall_timeout, what, self._idle)

    # ------------------------------------------------------------ set-up
    def _start(self, payload: dict[str, Any]) -> None:
        x, ps = self.xcfg, self.pcfg
        sizes = [p.numel() for p in payload["params"]]
        # bytes on the wire, as every engine counts them: with 16-bit pushes a bucket holds twice the elements
        self.layout = plan(
            sizes,
            len(self.server_ranks),
            elements_in(ps.split_bytes, self.dtype),
            elements_in(ps.bucket_bytes, self.dtype),
        )
        if len(self.layout.buckets) > MAX_BUCKETS:
            raise UserError(f"{len(self.layout.buckets)} buckets are too many message tags; raise --ps-bucket-bytes")
        sync_clip = self.clip if ps.mode == "sync" else 0.0
        clip_comm = None
        if sync_clip:
            # communication: every rank takes part; the servers that own elements form the group
            owns = self._server_index is not None and any(s == self._server_index for _, s in self.layout.segments)
            clip_comm = self.world.Split(0 if owns else self.MPI.UNDEFINED, self.rank)
        if self._server_index is not None:
            self._server = Server(
                self.MPI,
                self._server_index,
                self.layout,
                payload,
                self.worker_ranks,
                ps.mode == "sync",
                self.push,
                self.pull,
                x.stall_timeout,
                sync_clip,
                clip_comm,
                self.dtype,
            )
        self._started = True

    def serve(self) -> None:
        # communication: the main worker's parameters and optimizer state (from prepare()).
        self._start(self._bcast(self.world, None, self.main_rank, "the main worker's parameters"))
        server = self._server
        assert server is not None  # _start() makes it on a server rank, which is what calls serve()
        poll(lambda: server.finished, self.xcfg.stall_timeout, "pushes from the workers", server.progress)
        server.flush()

    def prepare(
        self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, every_step: bool = True
    ) -> torch.optim.Optimizer:
        """Start the servers with the main worker's parameters and optimizer, and hook the pushes.

        ``optimizer``: any ``torch.optim.Optimizer`` over the model's parameters, any number of
        groups. The main worker sends its class (pickled by reference: every rank imports the same
        code), each group's hyperparameters, the group of each parameter and its state (fresh, or
        loaded from a checkpoint); each server builds the class over its segments of each bucket
        (:class:`.server.Server`). Returns the workers' optimizer: an instance of a subclass of the
        user's class (see :func:`.optimizer.server_side`) whose ``param_groups[g]["lr"]`` travels with every
        push; the other hyperparameters are the servers' from here on (a schedule of weight decay
        or momentum set on the worker does not reach them).
        """
        params: list[torch.Tensor] = list(model.parameters())
        for p in params:
            if p.dtype != torch.float32 or not p.is_contiguous():
                raise UserError(f"--strategy ps moves contiguous float32 parameters; got {p.dtype} {tuple(p.shape)}")
        described = describe(optimizer, params)  # checked on every worker alike
        payload = None
        if self.is_main:  # fresh, or as loaded from a checkpoint
            payload = {
                "params": [p.detach().cpu() for p in params],
                "buffers": {n: b.detach().cpu() for n, b in model.named_buffers()},
                "optimizer": described,
            }
        # communication: to every rank, dedicated servers included (they receive it in serve()).
        payload = self._bcast(self.world, payload, self.main_rank, "the main worker's parameters")
        self._start(payload)
        with torch.no_grad():  # every worker starts from the main worker's model, as with allreduce
            for p, src in zip(params, payload["params"], strict=True):
                p.copy_(src)
            for name, b in model.named_buffers():
                b.copy_(payload["buffers"][name])
            if self.dtype != torch.float32:
                # Workers compute on the parameters as a pull delivers them (rounded to 16 bits), from
                # the first step on, fresh or resumed: a resumed run then continues bit-exactly.
                for p in params:
                    p.copy_(p.to(self.dtype))
        self.params = params
        self._flat = [p.data.view(-1) for p in params]
        lay = self.layout
        slots = push_slots(len(optimizer.param_groups))
        self._out = {key: message(lay.segment_numel(*key), self.dtype, slots) for key in lay.segments}
        self._in = {key: message(lay.segment_numel(*key), self.dtype) for key in lay.segments}
        self._version = dict.fromkeys(lay.segments, 0)
        self._step_bytes = (sum(m[0].nbytes for m in self._out.values()), sum(m[0].nbytes for m in self._in.values()))
        self._reqs: list[Any] = []
        # a bucket is pushed as soon as it is whole, in any order (its messages are tagged with its index),
        # and the server part serves between layers of backward; async clipping holds every push back
        self.reduction = BucketedReduction(
            params,
            lay.buckets,
            self.xcfg.backward_passes_per_step,
            self._push,
            self._pulled,
            ordered=False,
            progress=self._idle,
            from_hooks=not self._clip_local,
            tracer=self.tracer,
        )
        self._optimizer = server_side(optimizer, params, self.fetch_state)
        return self._optimizer

    # ------------------------------------------------------------ one step
    def _push(self, b: int) -> None:
        MPI, lay, reduction = self.MPI, self.layout, self.reduction
        assert reduction is not None
        lrs = [float(g["lr"]) for g in self._optimizer.param_groups]  # as the trainer or a scheduler set them
        for s in lay.servers_of(b):
            raw, head, data = self._out[(b, s)]
            head[0], head[1 : 1 + len(lrs)] = self._version[(b, s)], lrs
            # a parameter outside this step's loss pushes zeros, as Horovod allreduces zeros for it
            segments = [reduction.grad(p)[lo:hi] for p, lo, hi in lay.segments[(b, s)]]
            if self.dtype == torch.float32 and segments[0].device.type == "cpu":
                torch.cat(segments, out=data)
            else:  # 16 bits: packing is the cast; a GPU's gradients: the copy to the host
                pack(segments, data)
            dest = self.server_ranks[s]
            # communication: the reply's receive is posted before the push that causes it
            self._reqs.append(self.pull.Irecv([self._in[(b, s)][0], MPI.BYTE], source=dest, tag=b))
            self._reqs.append(self.push.Isend([raw, MPI.BYTE], dest=dest, tag=b))

    def _pulled(self, b: int) -> None:
        """Bucket ``b``'s parameters as the servers sent them back (by :meth:`apply`: the step's update)."""
        with torch.no_grad():
            for s in self.layout.servers_of(b):
                unpack(self._in[(b, s)][2], [self._flat[p][lo:hi] for p, lo, hi in self.layout.segments[(b, s)]])

    def synchronize(self) -> None:
        assert self.reduction is not None
        if self._clip_local:  # async: each worker's own gradient, clipped before it leaves
            torch.nn.utils.clip_grad_norm_(self.params, self._clip_local)
        self.reduction.start_late()
        reqs = self._reqs
        self._poll(lambda: self.MPI.Request.Testall(reqs), "the servers' replies")  # communication
        for b in range(len(self.layout.buckets)):
            self.tracer.bucket_done(b)  # every server's reply to it is in (one wait for all)
        self._reqs = []
        stale = [int(m[1][1]) for m in self._in.values()]
        for key, m in self._in.items():
            self._version[key] = int(m[1][0])
        self._stale_sum += sum(stale)
        self._stale_n += len(stale)
        self._stale_max = max(self._stale_max, max(stale))
        w = self._window
        w[0] += 1
        w[1] += sum(stale)
        w[2] += len(stale)
        w[3] = max(w[3], max(stale))

    def apply(self, optimizer: torch.optim.Optimizer) -> None:
        assert self.reduction is not None
        self.reduction.finish_all()

    def fetch_state(self) -> list[dict[str, Any]]:
        """Every server's optimizer state, assembled per parameter (in ``model.parameters()`` order; {}
        where none: no step yet, or not in the optimizer), on the parameters' devices."""
        return self._fetch_state()[0]

    def model_state_dict(self, model: torch.nn.Module) -> dict[str, torch.Tensor]:
        """With 16-bit pulls the workers hold rounded parameters: the checkpoint takes the servers'
        float32 master parameters instead (they start a resumed run's servers)."""
        sd = model.state_dict()
        if self.dtype == torch.float32 or not self._started:
            return sd
        _, master = self._fetch_state()
        names = {id(p): n for n, p in model.named_parameters()}
        for p, m in zip(self.params, master, strict=True):
            sd[names[id(p)]] = m.view_as(p).to(p.device)
        return sd

    def _ask_servers(self, what: bytes) -> list[Any]:
        """Every server's pickled answer to a ``TAG_STATE`` request, by server index."""
        MPI = self.MPI
        request = np.frombuffer(what, dtype=np.uint8).copy()
        # communication: one request to each server; each answers with one message of a size it picks
        sends = [self.push.Isend([request, MPI.BYTE], dest=dest, tag=TAG_STATE) for dest in self.server_ranks]
        recvs: list[Any] = [None] * len(self.server_ranks)
        bufs: list[np.ndarray] = [request] * len(self.server_ranks)
        status = MPI.Status()

        def arrived() -> bool:
            for s, src in enumerate(self.server_ranks):
                if recvs[s] is None:
                    msg = self.pull.improbe(src, TAG_STATE, status)
                    if msg is not None:
                        bufs[s] = np.empty(status.Get_count(MPI.BYTE), dtype=np.uint8)
                        recvs[s] = msg.Irecv([bufs[s], MPI.BYTE])
            return all(r is not None for r in recvs) and MPI.Request.Testall(recvs + sends)

        self._poll(arrived, "the servers' optimizer state")
        return [pickle.loads(buf.tobytes()) for buf in bufs]

    def _fetch_state(self) -> tuple[list[dict[str, Any]], list[torch.Tensor]]:
        """Every server's optimizer state (see :meth:`fetch_state`) and master parameters (flat, CPU), by parameter."""
        return assemble(self.layout, self.params, self._ask_servers(STATE_FULL))

    def _server_bytes(self) -> list[dict[str, Any]]:
        """What each server holds (:meth:`.server.Server.held_bytes`) and its rank's peak RSS, by server index."""
        return self._ask_servers(STATE_BYTES)

    def flat_buffers(self) -> list[torch.Tensor]:
        """This worker's push and reply messages, one per (bucket, server)."""
        return [torch.from_numpy(m[0]) for m in (*self._out.values(), *self._in.values())] if self._started else []

    def memory(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, int]:
        """A worker holds its parameters, gradients and messages, and no optimizer state (it lives on
        the servers); a colocated rank adds its server's: the float32 master shard, its optimizer
        state and the server's message buffers."""
        out = super().memory(model, optimizer)
        if self._server is not None:
            for kind, n in self._server.held_bytes().items():
                out[kind] += n
        return out

    def server_memory(self) -> list[dict[str, Any]]:
        """The dedicated servers' rows, asked by the main worker (colocated servers report with their workers)."""
        if not (self.is_main and self._started) or self.pcfg.placement != "dedicated":
            return []
        # communication: one request to each server, answered from its serving loop
        answers = self._server_bytes()
        rows = [{"rank": r, "role": "server", **held} for r, held in zip(self.server_ranks, answers, strict=True)]
        for row in rows:
            row["total"] = row["params"] + row["grads"] + row["optimizer"] + row["buffers"]
        return rows

    # ------------------------------------------------------------ collectives for the trainer
    def sum_over_workers(self, values: torch.Tensor) -> torch.Tensor:
        # communication: non-blocking, so that a colocated rank keeps serving while it waits
        return sum_now(self.workers_comm, self.MPI, values, self._poll, "the other workers (metrics)")

    def start_vote(self, flags: torch.Tensor) -> None:
        # communication: non-blocking, in flight while the step's pushes are answered
        self._vote_sum = start_sum(self.workers_comm, self.MPI, flags)

    def end_vote(self) -> torch.Tensor:
        return end_sum(self._vote_sum, self._poll, "the other workers (the step's vote)")

    def broadcast_object(self, obj: Any, root: int = 0) -> Any:
        """``root`` is a worker index (0 = the main worker). Before the servers start, every rank
        takes part (the command line agrees on the run directory); afterwards only workers do."""
        if self._started:
            return self._bcast(self.workers_comm, obj, root, "the other workers")
        return self._bcast(self.world, obj, self.worker_ranks[root], "every rank's set-up")

    def allgather_object(self, obj: Any) -> list[Any]:
        return self._allgather(self.world, obj)

    def gather_from_workers(self, obj: Any) -> list[Any]:
        return self._allgather(self.workers_comm, obj)

    def _allgather(self, comm: Comm, obj: Any) -> list[Any]:
        return allgather_pickle(comm, self.MPI, obj, self._poll, "every rank's set-up")

    def _bcast(self, comm: Comm, obj: Any, root: int, what: str) -> Any:
        return bcast_pickle(comm, self.MPI, obj, root, self._poll, what)

    # ------------------------------------------------------------ reporting and shutdown
    def describe(self) -> dict[str, Any]:
        ps = self.pcfg
        out: dict[str, Any] = {
            "ps_servers": len(self.server_ranks),
            "ps_placement": ps.placement,
            "ps_mode": ps.mode,
            "ps_bucket_bytes": ps.bucket_bytes,
            "ps_split_bytes": ps.split_bytes,
        }
        if self._started:
            out["ps_buckets"] = len(self.layout.buckets)
            out["ps_server_bytes"] = [ELEM * n for n in self.layout.server_numel()]
        if self._started and self.is_main and not self._closed:
            # communication: each server's figure (the state an optimizer creates at its first step)
            out["ps_server_state_bytes"] = [held["optimizer"] for held in self._server_bytes()]
        if self._started and self.is_worker:
            out["bytes_pushed_per_step"], out["bytes_pulled_per_step"] = self._step_bytes
            out["staleness_mean"] = self._stale_sum / max(1, self._stale_n)
            out["staleness_max"] = self._stale_max
        return out

    def stats(self) -> dict[str, float]:
        """This worker's figures since the last call: bytes per step and how stale its gradients were."""
        steps, total, count, worst = self._window
        self._window = [0, 0, 0, 0]
        if not steps:
            return {}
        return {
            "bytes_pushed_per_step": float(self._step_bytes[0]),
            "bytes_pulled_per_step": float(self._step_bytes[1]),
            "staleness_mean": total / max(1, count),
            "staleness_max": float(worst),
        }

    def leave(self) -> None:
        if not self._started:
            return  # set-up failed before any server started: nothing to shut down
        MPI = self.MPI
        if self.is_worker:
            # communication: tell every server that this worker has finished
            reqs = [self.push.Isend([np.zeros(0, np.uint8), MPI.BYTE], dest=r, tag=TAG_DONE) for r in self.server_ranks]
            self._poll(lambda: MPI.Request.Testall(reqs), "the servers to take the end-of-run message")
            if self._server is not None:  # colocated: keep serving until every worker has finished
                server = self._server
                self._poll(lambda: server.finished, "the other workers to finish")
                server.flush()

    def abort(self, code: int) -> None:
        abort(code, self.world)  # servers waiting for this worker, workers for this server: all end
