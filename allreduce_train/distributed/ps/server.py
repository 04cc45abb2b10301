"""The server side of the parameter server, and the wire format both sides speak.

A :class:`Server` holds one server's shard: its parameter elements per bucket (:mod:`..bucketing`
says which) as float32 master copies, and per bucket an instance of the user's optimizer class
over them, whose state (SGD's momentum, Adam's two moments) therefore lives here, sharded.
Dedicated server ranks run its :meth:`Server.progress` in a loop; colocated ranks run it whenever
their worker part waits (:mod:`.exchange`). A gradient or parameter message is one contiguous
buffer: a header of float64 slots and the payload of a (bucket, server) segment.
"""

from __future__ import annotations

import pickle
from types import ModuleType
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from ...memory import peak_rss_mib
from ..bucketing import Layout
from ..buffers import element_size, held_bytes
from ..mpi import poll
from ..shardstate import leaves, pieces, shard_optimizer

if TYPE_CHECKING:  # imported when the engine starts (import_mpi)
    from mpi4py.MPI import Comm, Request

SLOT = 8  # bytes per header slot (a float64)
HEADER_BYTES = 2 * SLOT  # a reply's header: (server version, staleness)
TAG_DONE = 32766  # worker -> server: this worker has finished
# worker -> server: send me your state (one byte: STATE_FULL or STATE_BYTES); the pickled reply uses the same tag
TAG_STATE = 32765
# every bucket's optimizer state and master parameters; only their sizes (held_bytes) and the peak RSS
STATE_FULL, STATE_BYTES = b"S", b"B"
ELEM = 4  # bytes per float32 element: the servers' master parameters (ps_server_bytes)

# An outgoing buffer's key: its bucket (sync: one reply to every worker), (bucket, worker) (async), or
# ("state", worker) for a state answer
OutKey = int | tuple[int, int] | tuple[str, int]


def push_slots(groups: int) -> int:
    """A push's header: the server version the gradient was computed from, then each parameter
    group's LR of the step (the trainer's or a torch LR scheduler's, set on the worker)."""
    return max(2, 1 + groups)


def message(
    numel: int, dtype: torch.dtype = torch.float32, slots: int = 2
) -> tuple[np.ndarray, np.ndarray, torch.Tensor]:
    """One contiguous buffer for MPI: the raw bytes, the header (``slots`` float64), the payload
    (float32, or the 16-bit wire dtype of ``--compression``)."""
    head = slots * SLOT
    raw = np.zeros(head + element_size(dtype) * numel, dtype=np.uint8)
    return raw, raw[:head].view(np.float64), torch.from_numpy(raw[head:]).view(dtype)


class Server:
    """One server's shard: its parameter elements and an optimizer per bucket, and the message handling.

    Dedicated server ranks run :meth:`progress` in a loop; colocated ranks run it whenever their
    worker part waits. ``workers`` are global ranks; messages arrive on ``push`` and replies leave
    on ``pull`` (separate communicators, so a server can probe for any message on ``push`` without
    taking a reply meant for the worker part of the same rank). ``payload``: the main worker's
    parameters and optimizer (:meth:`.exchange.ParameterServer.prepare` says what it holds).
    """

    def __init__(
        self,
        MPI: ModuleType,
        index: int,
        layout: Layout,
        payload: dict[str, Any],
        workers: list[int],
        sync: bool,
        push: Comm,
        pull: Comm,
        timeout: float,
        clip: float = 0.0,
        clip_comm: Comm | None = None,
        wire: torch.dtype = torch.float32,
    ) -> None:
        self.MPI, self.push, self.pull, self.timeout = MPI, push, pull, timeout
        self.workers, self.sync = workers, sync
        # Sync clipping: the averaged gradients of a step wait here until the servers have summed
        # their squared norms (clip_comm: the servers that own something).
        self.clip, self.clip_comm = clip, clip_comm
        self.averaged: dict[int, tuple[torch.Tensor, list[float]]] = {}
        self.norm = np.zeros(1)
        self.norm_req: Request | None = None
        self.buckets = [b for b in range(len(layout.buckets)) if (b, index) in layout.segments]
        self.segments = {b: layout.segments[(b, index)] for b in self.buckets}
        params = payload["params"]
        self.param = {
            b: torch.cat([params[p].reshape(-1)[lo:hi] for p, lo, hi in segs]).float().clone()
            for b, segs in self.segments.items()
        }
        # Each segment as a tensor of its own for the optimizer: a view of the bucket's flat master
        # copy, so that step() updates what the replies send (no copy either way).
        self.leaves = {b: leaves(self.param[b], self.segments[b], params) for b in self.buckets}
        opt = payload["optimizer"]
        self.groups = len(opt["groups"])
        self.optimizers = {b: shard_optimizer(opt, self.segments[b], self.leaves[b], params) for b in self.buckets}
        self.version = dict.fromkeys(self.buckets, 0)  # updates applied to each bucket
        # Pushes and pulls travel in the wire dtype (16-bit with --compression); the parameters and
        # optimizer state here stay float32 (master weights), and so does the checkpoint's state message.
        slots = push_slots(self.groups)
        self.inbox = {(b, w): message(len(self.param[b]), wire, slots) for b in self.buckets for w in workers}
        self.arrived: dict[int, set[int]] = {b: set() for b in self.buckets}
        self.outbox: dict[OutKey, tuple[np.ndarray, np.ndarray, torch.Tensor]] = (
            {b: message(len(self.param[b]), wire) for b in self.buckets}
            if sync
            else {(b, w): message(len(self.param[b]), wire) for b in self.buckets for w in workers}
        )
        self.out_reqs: dict[OutKey, list[Request]] = {}  # outbox key -> its sends in flight
        self.state_out: dict[int, np.ndarray] = {}  # worker -> the pickled state being sent to it
        self.receiving: list[tuple[Request, int, int]] = []
        self.done: set[int] = set()
        self.status = MPI.Status()
        self.empty = np.zeros(0, dtype=np.uint8)
        self.request = np.zeros(1, dtype=np.uint8)

    @property
    def finished(self) -> bool:
        return len(self.done) == len(self.workers)

    def progress(self) -> bool:
        """Take what has arrived, handle complete messages; True if anything happened."""
        MPI, did = self.MPI, False
        while True:
            msg = self.push.improbe(MPI.ANY_SOURCE, MPI.ANY_TAG, self.status)
            if msg is None:
                break
            did = True
            src, tag = self.status.Get_source(), self.status.Get_tag()
            if tag == TAG_DONE:
                msg.Recv([self.empty, MPI.BYTE])
                self.done.add(src)
            elif tag == TAG_STATE:
                msg.Recv([self.request, MPI.BYTE])
                self._send_state(src, self.request.tobytes())
            else:
                raw = self.inbox[(tag, src)][0]
                if self.status.Get_count(MPI.BYTE) != raw.nbytes:
                    raise RuntimeError(
                        f"rank {src} pushed {self.status.Get_count(MPI.BYTE)} bytes for bucket "
                        f"{tag}, expected {raw.nbytes}: the ranks disagree about the model"
                    )
                self.receiving.append((msg.Irecv([raw, MPI.BYTE]), tag, src))
        if self.norm_req is not None and self.norm_req.Test():
            self.norm_req = None
            self._clipped_step()
            did = True
        if self.receiving:
            waiting = []
            for req, b, src in self.receiving:
                if req.Test():
                    self._on_push(b, src)
                    did = True
                else:
                    waiting.append((req, b, src))
            self.receiving = waiting
        return did

    def _on_push(self, b: int, src: int) -> None:
        _, head, grad = self.inbox[(b, src)]
        if self.sync:
            self.arrived[b].add(src)
            if len(self.arrived[b]) < len(self.workers):
                return
            self.arrived[b].clear()
            lrs = self._lrs(self.inbox[(b, self.workers[0])][1])  # every worker sends the same
            # Sum in worker order, not arrival order: the result does not depend on timing. In float32:
            # 16-bit pushes are widened here (a copy; float32 ones are summed in the first inbox).
            total = self.inbox[(b, self.workers[0])][2].float()
            for w in self.workers[1:]:
                total.add_(self.inbox[(b, w)][2])
            total.div_(len(self.workers))
            if self.clip:
                self.averaged[b] = (total, lrs)
                if len(self.averaged) == len(self.buckets):
                    self.norm[0] = sum(float(g.double().pow(2).sum()) for g, _ in self.averaged.values())
                    # communication: the global norm of the averaged gradient, over the servers
                    assert self.clip_comm is not None  # clipping servers own something: the exchange made it
                    self.norm_req = self.clip_comm.Iallreduce(self.MPI.IN_PLACE, self.norm, op=self.MPI.SUM)
                return
            self._step(b, total, lrs)
            self._reply(b, b, self.workers, staleness=0)
        else:
            staleness = self.version[b] - int(head[0])  # updates this gradient did not see
            self._step(b, grad.float().div_(len(self.workers)), self._lrs(head))
            self._reply(b, (b, src), [src], staleness)

    def _lrs(self, head: np.ndarray) -> list[float]:
        return [float(lr) for lr in head[1 : 1 + self.groups]]

    def _clipped_step(self) -> None:
        """torch.nn.utils.clip_grad_norm_ on the averaged gradient, then the update, every bucket."""
        coef = self.clip / (float(np.sqrt(self.norm[0])) + 1e-6)
        for b, (grad, lrs) in sorted(self.averaged.items()):
            if coef < 1.0:
                grad.mul_(coef)
            self._step(b, grad, lrs)
            self._reply(b, b, self.workers, staleness=0)
        self.averaged.clear()

    def _step(self, b: int, grad: torch.Tensor, lrs: list[float]) -> None:
        """The optimizer's step on bucket ``b``'s segments, with this push's LR for each group
        (``grad``: the bucket's flat gradient, which the segments' ``.grad`` view)."""
        built = self.optimizers[b]
        if built is not None:
            optimizer, order = built
            for group, g in zip(optimizer.param_groups, order, strict=True):
                group["lr"] = lrs[g]
            for leaf, piece in zip(self.leaves[b], pieces(grad, self.segments[b]), strict=True):
                leaf.grad = piece.view_as(leaf)
            optimizer.step()
            for leaf in self.leaves[b]:
                leaf.grad = None  # scratch: kept to the next step, a widened 16-bit one would be a float32 bucket more
        self.version[b] += 1

    def _wait_sends(self, key: OutKey) -> None:
        reqs = self.out_reqs.pop(key, [])
        poll(lambda: self.MPI.Request.Testall(reqs), self.timeout, "a worker to take its parameters")

    def _reply(self, b: int, key: OutKey, dests: list[int], staleness: int) -> None:
        self._wait_sends(key)  # the buffer is ours again once its previous sends completed
        raw, head, data = self.outbox[key]
        head[0], head[1] = self.version[b], staleness
        data.copy_(self.param[b])
        self.out_reqs[key] = [self.pull.Isend([raw, self.MPI.BYTE], dest=w, tag=b) for w in dests]

    def state(self) -> dict[int, tuple[torch.Tensor, list[dict[str, Any]]]]:
        """Per bucket: the master parameters (flat) and each segment's optimizer state, in the order
        of the layout's segments ({} for a segment without any: no step yet, or not optimized)."""
        out = {}
        for b in self.buckets:
            built = self.optimizers[b]
            states = [dict(built[0].state.get(leaf, {})) if built else {} for leaf in self.leaves[b]]
            out[b] = (self.param[b], states)
        return out

    def held_bytes(self) -> dict[str, int]:
        """Bytes this server holds (:meth:`GradientExchange.memory`'s kinds): its float32 master copy
        (``params``), every tensor of its optimizers' state (``optimizer``) and its message buffers
        (``buffers``: a push's inbox per worker and bucket, the replies' outbox). ``grads``: none kept
        between steps (the averaged gradient is summed in the first inbox)."""
        state = [
            v
            for built in self.optimizers.values()
            if built is not None
            for st in built[0].state.values()
            for v in st.values()
            if isinstance(v, torch.Tensor)
        ]
        raws = [torch.from_numpy(m[0]) for m in (*self.inbox.values(), *self.outbox.values())]
        return held_bytes({"params": list(self.param.values()), "grads": [], "optimizer": state, "buffers": raws})

    def _send_state(self, dest: int, what: bytes) -> None:
        key = ("state", dest)
        self._wait_sends(key)  # the previous answer to this worker has left
        answer = self.state() if what == STATE_FULL else {**self.held_bytes(), "peak_rss_mib": peak_rss_mib()}
        data = self.state_out[dest] = np.frombuffer(pickle.dumps(answer), dtype=np.uint8).copy()
        self.out_reqs[key] = [self.pull.Isend([data, self.MPI.BYTE], dest=dest, tag=TAG_STATE)]

    def flush(self) -> None:
        for key in list(self.out_reqs):
            self._wait_sends(key)
