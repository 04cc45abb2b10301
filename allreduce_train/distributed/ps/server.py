"""The server side of the parameter server, and the wire format both sides speak.

A :class:`Server` holds one server's shard: its parameter elements and SGD momentum per bucket
(:mod:`.sharding` says which). Dedicated server ranks run its :meth:`Server.progress` in a loop;
colocated ranks run it whenever their worker part waits (:mod:`.exchange`). A message is one
contiguous buffer: a 16-byte header (two float64) and the payload of a (bucket, server) segment.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from ..buffers import element_size, pack
from ..mpi import poll
from .sharding import Layout

HEADER_BYTES = 16  # two float64. Push: (lr, server version the gradient was computed from); reply: (version, staleness)
TAG_DONE = 32766  # worker -> server: this worker has finished
TAG_STATE = 32765  # worker -> server: send me your optimizer state (checkpoint); the reply uses the same tag
ELEM = 4  # bytes per float32 element: the servers' parameters and momentum (ps_server_bytes)


def message(numel: int, dtype: torch.dtype = torch.float32) -> tuple[np.ndarray, np.ndarray, torch.Tensor]:
    """One contiguous buffer for MPI: the raw bytes, the 2-float64 header, the payload (float32, or the
    16-bit wire dtype of ``--compression``)."""
    raw = np.zeros(HEADER_BYTES + element_size(dtype) * numel, dtype=np.uint8)
    return raw, raw[:HEADER_BYTES].view(np.float64), torch.from_numpy(raw[HEADER_BYTES:]).view(dtype)


class Server:
    """One server's shard: its parameter elements and momentum per bucket, and the message handling.

    Dedicated server ranks run :meth:`progress` in a loop; colocated ranks run it whenever their
    worker part waits. ``workers`` are global ranks; messages arrive on ``push`` and replies leave
    on ``pull`` (separate communicators, so a server can probe for any message on ``push`` without
    taking a reply meant for the worker part of the same rank).
    """

    def __init__(
        self,
        MPI,
        index: int,
        layout: Layout,
        payload: dict[str, Any],
        workers: list[int],
        sync: bool,
        push,
        pull,
        timeout: float,
        clip: float = 0.0,
        clip_comm=None,
        wire: torch.dtype = torch.float32,
    ) -> None:
        self.MPI, self.push, self.pull, self.timeout = MPI, push, pull, timeout
        self.workers, self.sync = workers, sync
        # Sync clipping: the averaged gradients of a step wait here until the servers have summed
        # their squared norms (clip_comm: the servers that own something).
        self.clip, self.clip_comm = clip, clip_comm
        self.averaged: dict[int, tuple[torch.Tensor, float]] = {}
        self.norm = np.zeros(1)
        self.norm_req = None
        self.hyper = payload["hyper"]
        self.buckets = [b for b in range(len(layout.buckets)) if (b, index) in layout.segments]
        self.segments = {b: layout.segments[(b, index)] for b in self.buckets}
        flat = [p.reshape(-1) for p in payload["params"]]
        momentum = payload["momentum"]

        def gather(tensors):
            return {
                b: torch.cat([tensors[p][lo:hi] for p, lo, hi in segs]).float().clone()
                for b, segs in self.segments.items()
            }

        self.param = gather(flat)
        # A resumed run brings momentum buffers; SGD's first step otherwise creates them. A missing
        # buffer next to present ones (never the case with the trainer) is zero, which with
        # dampening 0 gives the same update as SGD creating it.
        self.momentum: dict[int, torch.Tensor | None] = (
            gather([momentum[i].reshape(-1) if i in momentum else torch.zeros_like(f) for i, f in enumerate(flat)])
            if momentum
            else dict.fromkeys(self.buckets)
        )
        self.version = dict.fromkeys(self.buckets, 0)  # updates applied to each bucket
        # Pushes and pulls travel in the wire dtype (16-bit with --compression); the parameters and
        # momentum here stay float32 (master weights), and so does the checkpoint's state message.
        self.inbox = {(b, w): message(len(self.param[b]), wire) for b in self.buckets for w in workers}
        self.arrived: dict[int, set[int]] = {b: set() for b in self.buckets}
        self.outbox = (
            {b: message(len(self.param[b]), wire) for b in self.buckets}
            if sync
            else {(b, w): message(len(self.param[b]), wire) for b in self.buckets for w in workers}
        )
        self.out_reqs: dict[Any, list] = {}  # outbox key -> its sends in flight
        self.state_out = message(2 * sum(len(p) for p in self.param.values()))  # momentum, then parameters
        self.receiving: list[tuple[Any, int, int]] = []
        self.done: set[int] = set()
        self.status = MPI.Status()
        self.empty = np.zeros(0, dtype=np.uint8)

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
                msg.Recv([self.empty, MPI.BYTE])
                self._send_state(src)
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
        lr = float(head[0])
        if self.sync:
            self.arrived[b].add(src)
            if len(self.arrived[b]) < len(self.workers):
                return
            self.arrived[b].clear()
            # Sum in worker order, not arrival order: the result does not depend on timing. In float32:
            # 16-bit pushes are widened here (a copy; float32 ones are summed in the first inbox).
            total = self.inbox[(b, self.workers[0])][2].float()
            for w in self.workers[1:]:
                total.add_(self.inbox[(b, w)][2])
            total.div_(len(self.workers))
            if self.clip:
                self.averaged[b] = (total, lr)
                if len(self.averaged) == len(self.buckets):
                    self.norm[0] = sum(float(g.double().pow(2).sum()) for g, _ in self.averaged.values())
                    # communication: the global norm of the averaged gradient, over the servers
                    self.norm_req = self.clip_comm.Iallreduce(self.MPI.IN_PLACE, self.norm, op=self.MPI.SUM)
                return
            self._sgd(b, total, lr)
            self._reply(b, b, self.workers, staleness=0)
        else:
            staleness = self.version[b] - int(head[1])  # updates this gradient did not see
            self._sgd(b, grad.float().div_(len(self.workers)), lr)
            self._reply(b, (b, src), [src], staleness)

    def _clipped_step(self) -> None:
        """torch.nn.utils.clip_grad_norm_ on the averaged gradient, then the update, every bucket."""
        coef = self.clip / (float(np.sqrt(self.norm[0])) + 1e-6)
        for b, (grad, lr) in sorted(self.averaged.items()):
            if coef < 1.0:
                grad.mul_(coef)
            self._sgd(b, grad, lr)
            self._reply(b, b, self.workers, staleness=0)
        self.averaged.clear()

    def _sgd(self, b: int, grad: torch.Tensor, lr: float) -> None:
        """torch.optim.SGD's update, element for element (``grad`` is scratch and may be changed)."""
        h, p = self.hyper, self.param[b]
        if h["maximize"]:
            grad.neg_()
        if h["weight_decay"]:
            grad = grad.add(p, alpha=h["weight_decay"])
        if h["momentum"]:
            buf = self.momentum[b]
            if buf is None:
                buf = self.momentum[b] = grad.clone()
            else:
                buf.mul_(h["momentum"]).add_(grad, alpha=1 - h["dampening"])
            grad = grad.add(buf, alpha=h["momentum"]) if h["nesterov"] else buf
        p.add_(grad, alpha=-lr)
        self.version[b] += 1

    def _wait_sends(self, key) -> None:
        reqs = self.out_reqs.pop(key, [])
        poll(lambda: self.MPI.Request.Testall(reqs), self.timeout, "a worker to take its parameters")

    def _reply(self, b: int, key, dests: list[int], staleness: int) -> None:
        self._wait_sends(key)  # the buffer is ours again once its previous sends completed
        raw, head, data = self.outbox[key]
        head[0], head[1] = self.version[b], staleness
        data.copy_(self.param[b])
        self.out_reqs[key] = [self.pull.Isend([raw, self.MPI.BYTE], dest=w, tag=b) for w in dests]

    def _send_state(self, dest: int) -> None:
        self._wait_sends("state")
        raw, head, data = self.state_out
        half, sizes = len(data) // 2, [len(self.param[b]) for b in self.buckets]
        pack([self.momentum[b] for b in self.buckets], data[:half], sizes)  # no momentum yet: zeros
        pack([self.param[b] for b in self.buckets], data[half:])
        head[0] = float(any(self.momentum[b] is not None for b in self.buckets))
        self.out_reqs["state"] = [self.pull.Isend([raw, self.MPI.BYTE], dest=dest, tag=TAG_STATE)]

    def flush(self) -> None:
        for key in list(self.out_reqs):
            self._wait_sends(key)
