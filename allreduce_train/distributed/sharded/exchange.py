"""``ShardedExchange``: ZeRO stages 1 and 2 over any engine's :class:`.collectives.ShardCollectives`.

Every worker computes the whole model's gradients on its own batch, as with the ring; what differs is
where they go and what is kept (:mod:`.layout` says who owns what):

* the gradients leave bucket by bucket from backward's hooks, as the ring's do, in a *reduce-scatter*:
  each worker ends with the sum of its own shard of every bucket (the ring's first phase alone);
* each worker updates only its shard, with the user's optimizer class over views of it
  (:func:`..shardstate.shard_optimizer`): the optimizer state is 1/N per worker (stage 1 and up);
* an *allgather* of the updated shards (the ring's second phase) gives every worker the whole model.

Stage 1 keeps the full-size gradient buckets from one step to the next; stage 2 frees each parameter's
gradient as soon as it is in its bucket and each bucket once its reduce-scatter is done, keeping only
this worker's shard (float32) to the update, and frees that after it (between steps a worker holds no
gradients); at most :data:`IN_FLIGHT` (by stage) full-size buckets are in their reduce-scatter at once (a bucket's
start waits for the oldest beyond them), so a step's transient gradients are a few buckets, not the
model. Both move the ring's bytes. ``--grad-clip`` is applied here, over the shards (the global norm
from every worker's sum of its shard's squares, as the parameter servers clip), since no worker holds
the whole gradient; the trainer then finds no ``.grad`` to clip. Everything a run needs besides the
shards (metrics, votes, broadcast, BatchNorm's buffers, abort) is the engine's (``engine``, a
:class:`..base.GradientExchange`).
"""

from __future__ import annotations

import math
from typing import Any

import torch

from ...config import ExchangeConfig
from ...errors import UserError
from ..base import GradientExchange
from ..bucketing import BucketedReduction
from ..buffers import elements_in, held_bytes
from ..shardstate import PLACE_KEYS, assemble, leaves, per_element, pieces, shard_optimizer
from ..wire import WireFormat
from .collectives import ShardCollectives
from .layout import make_layout
from .optimizer import sharded_optimizer
from .params import ShardedParams

WHERE = "--strategy sharded builds it over each worker's shard"
# Stages 2 and 3: full-size gradient buckets in their reduce-scatter at once (another is being filled), by
# stage. Each one more costs a bucket (--mpi-bucket-bytes) at the step's peak; with all of them in flight a
# step held the whole model's gradients again (0.32 GiB for the 87M-parameter model of docs/performance.md's
# fit run, beside stage 3's 0.65 GiB per rank at 2 ranks). Stage 3, chosen where memory is short: one (that
# run's peak virtual memory came within 13 MiB of tests/mpi/test_memory_limit.py's limit with two, 70 MiB
# with one); stage 2, which should keep the ring's speed: two (one was up to a fifth slower a step there).
IN_FLIGHT = {2: 2, 3: 1}


class ShardedExchange(GradientExchange):
    """``--strategy sharded``: see the module docstring. ``bucket_bytes``: the gradients' bucket size on the
    wire (the engine's, e.g. ``--mpi-bucket-bytes``); ``wire``: the run's wire format (the engine's), whose
    dtype they are reduce-scattered in."""

    name = "sharded"

    def __init__(
        self,
        x: ExchangeConfig,
        engine: GradientExchange,
        coll: ShardCollectives,
        *,
        grad_clip: float,
        wire: WireFormat,
        bucket_bytes: int,
    ) -> None:
        self.engine, self.coll = engine, coll
        self.rank, self.size = engine.rank, engine.size
        self.local_rank, self.local_size = engine.local_rank, engine.local_size
        self.stage, self.k, self.clip = x.shard_stage, x.backward_passes_per_step, grad_clip
        self.wire, self.dtype = wire, wire.dtype
        self.bucket_elems = elements_in(bucket_bytes, self.dtype)
        self.params: list[torch.Tensor] = []
        self._hooks: list[Any] = []

    def describe(self) -> dict[str, Any]:
        out = {**self.engine.describe(), "shard_stage": self.stage}
        if self.params:
            out["shard_buckets"] = len(self.layout.buckets)
        return out

    # ------------------------------------------------------------ set-up
    def prepare(
        self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, every_step: bool = True
    ) -> torch.optim.Optimizer:
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise UserError(
                f"--strategy sharded runs a torch.optim.Optimizer per shard; got a {type(optimizer).__name__}"
            )
        self.engine.broadcast_state(model, optimizer)  # communication: rank 0's model and optimizer state
        self._model_params = list(model.parameters())
        params: list[torch.Tensor] = [p for p in self._model_params if p.requires_grad]
        for p in params:
            if p.dtype != torch.float32:
                raise UserError(f"--strategy sharded shards float32 parameters; got {p.dtype} {tuple(p.shape)}")
        self.params = params
        sizes = [p.numel() for p in params]
        self.layout = lay = make_layout(sizes, self.bucket_elems, self.coll.bounds, self.size)
        n = len(lay.buckets)
        # each parameter a view of its bucket's flat buffer (stage 3: gathered where used)
        self.store = ShardedParams(params, lay, self.rank, self.coll, self.stage)
        self.mine = self.store.mine
        self.segs = [lay.segments.get((b, self.rank), []) for b in range(n)]
        self.leaves = [leaves(shard, self.segs[b], params) for b, shard in enumerate(self.store.shard)]
        self.user = optimizer
        self.reshard(optimizer.state)
        optimizer.state.clear()  # the whole state is in the shards now: 1/N of it here
        # stage 1: the full-size gradient buckets, kept; stage 2: made per step, freed after their reduce-scatter
        self.gflat: list[torch.Tensor | None] = [
            torch.empty(lay.numel(b), dtype=self.dtype) if self.stage == 1 else None for b in range(n)
        ]
        # this worker's averaged gradient shard of each bucket, float32 on the parameters' device, kept from step
        # to step (stage 1 with a float32 wire on CPU: a view of its bucket, averaged in place as the ring does)
        # (stages 2 and 3: made when the bucket's reduce-scatter is done, freed after the update, so that
        # between steps a worker holds no gradients; the memory report counts them as held during the step)
        device = self.store.nan.device
        self._in_bucket = [g is not None and self.dtype == torch.float32 and device.type == "cpu" for g in self.gflat]
        self.gshard: list[torch.Tensor | None] = [
            g[lo:hi] if inplace and g is not None else None if self.stage >= 2 else torch.empty(hi - lo, device=device)
            for g, inplace, (lo, hi) in zip(self.gflat, self._in_bucket, self.mine, strict=True)
        ]
        self._averaged = False  # whether gshard holds this step's average (synchronize() ran, step() did not yet)
        self._handles: list[Any] = [None] * n
        self._pending = [False] * n  # whether a bucket's reduce-scatter started and was not yet finished
        self._flying: list[int] = []  # stages 2 and 3: the buckets started and not yet finished, oldest first
        # an engine without a thread of its own moves its messages on between layers of backward
        progress = getattr(self.coll, "progress", None)
        self.reduction = BucketedReduction(
            params, lay.buckets, self.k, self._start, self._done, progress=progress, tracer=self.tracer
        )
        if self.stage == 3:
            self._hooks += self.store.attach(model, params)
        self.optimizer = sharded_optimizer(optimizer, self)
        return self.optimizer

    def _described(self, state: Any) -> dict[str, Any]:
        """What :func:`..shardstate.shard_optimizer` builds from: the user's class, groups, each
        parameter's group and its state (from ``state``, keyed by parameter)."""
        opt = self.user
        index = {id(p): i for i, p in enumerate(self.params)}
        of_model = {id(p) for p in self._model_params}  # a frozen one is left as it is
        group_of: list[int | None] = [None] * len(self.params)
        for g, group in enumerate(opt.param_groups):
            for p in group["params"]:
                if id(p) in index:
                    group_of[index[id(p)]] = g
                elif id(p) not in of_model:
                    raise UserError(
                        f"--strategy sharded: the optimizer's group {g} holds a {tuple(p.shape)} tensor that is not "
                        "one of the model's parameters; build the optimizer over model.parameters()"
                    )
        return {
            "cls": type(opt),
            "groups": [{k: v for k, v in g.items() if k != "params"} for g in opt.param_groups],
            "group_of": group_of,
            "state": {i: dict(state[p]) for i, p in enumerate(self.params) if state.get(p)},
        }

    def reshard(self, state: Any) -> None:
        """Build this worker's shard optimizers, each segment with its slice of ``state`` (the user's
        optimizer's, keyed by parameter: fresh, or a whole checkpoint's of any worker count)."""
        described = self._described(state)
        self.shards = [
            shard_optimizer(described, self.segs[b], self.leaves[b], self.params, WHERE)
            for b in range(len(self.layout.buckets))
        ]

    # ------------------------------------------------------------ one step
    def _start(self, b: int) -> None:
        assert self.reduction is not None
        flat = self.gflat[b]
        if flat is None:
            flat = self.gflat[b] = torch.empty(self.layout.numel(b), dtype=self.dtype)
        self.reduction.pack(b, flat)
        if self.stage >= 2:
            for p in self.reduction.members(b):
                p.grad = None  # in the bucket now: the full gradient is not kept
        self._handles[b] = self.coll.start_reduce_scatter(b, flat)  # communication
        self._pending[b] = True
        self.store.free(b)  # stage 3: no more of backward needs these parameters
        if self.stage >= 2:
            self._flying.append(b)
            while len(self._flying) > IN_FLIGHT[self.stage]:
                self._finish(self._flying.pop(0))  # communication: the oldest, done before another bucket exists

    def _finish(self, b: int) -> None:
        """Wait for bucket ``b``'s reduce-scatter and keep this worker's averaged shard of it (stages 2 and 3:
        the full-size bucket is freed)."""
        handle, self._handles[b], self._pending[b] = self._handles[b], None, False
        if handle is not None:  # (None: one rank, whose shard is its bucket)
            self.coll.wait([handle], "the reduce-scatter of the gradients")  # communication
        self.tracer.bucket_done(b)
        flat = self.gflat[b]
        assert flat is not None
        lo, hi = self.mine[b]
        shard = self.gshard[b]
        if shard is None:  # stages 2 and 3: this step's, freed after the update
            shard = self.gshard[b] = torch.empty(hi - lo, device=self.store.nan.device)
        if not self._in_bucket[b]:
            shard.copy_(flat[lo:hi])  # widened to float32 (exactly), on the parameters' device
        shard.div_(self.size)  # the average: the ring's division, element for element
        if self.stage >= 2:
            self.gflat[b] = None

    def _done(self, b: int) -> None:
        """The end of the step for bucket ``b`` (the shared machinery's, in index order): its reduce-scatter
        finished here unless a later bucket's start finished it already (stages 2 and 3)."""
        if self._pending[b]:
            self._finish(b)  # communication

    def synchronize(self) -> None:
        assert self.reduction is not None
        # communication: each bucket's reduce-scatter waited for in _done, in index order
        self.reduction.complete(lambda: None)
        self._flying = []  # stages 2 and 3: all finished by now
        for p in self.params:
            p.grad = None  # the whole gradients are not the averaged ones: nothing above reads them
        for b in range(len(self.layout.buckets)):
            self.store.free(b)  # stage 3: what backward gathered of a parameter outside the loss
        self._handles = [None] * len(self._handles)
        self._averaged = True

    def apply(self, optimizer: torch.optim.Optimizer) -> None:
        optimizer.step()

    def step(self) -> None:
        """Clip over the shards, update this worker's shard, allgather the parameters."""
        if not self._averaged:
            raise RuntimeError("--strategy sharded: step() without this step's gradients (synchronize() first)")
        self._averaged = False
        if self.clip > 0:
            self._clip()
        for b, built in enumerate(self.shards):
            shard = self.gshard[b]
            assert shard is not None  # synchronize() averaged it
            if built is not None:
                opt, order = built
                for group, g in zip(opt.param_groups, order, strict=True):
                    mine = self.optimizer.param_groups[g]  # as the trainer or a scheduler set it this step
                    group.update({k: v for k, v in mine.items() if k != "params" and k not in PLACE_KEYS})
                for leaf, piece in zip(self.leaves[b], pieces(shard, self.segs[b]), strict=True):
                    leaf.grad = piece.view_as(leaf)
                opt.step()
                for leaf in self.leaves[b]:
                    leaf.grad = None
            if self.stage >= 2:
                self.gshard[b] = None  # used: the next step's reduce-scatter makes it again
        if self.stage == 3:
            self.store.release()  # gathered where the next forward pass uses them
            return
        self.store.allgather(list(range(len(self.layout.buckets))))  # communication: every worker's shard

    def whole_parameters(self, model: torch.nn.Module) -> None:
        self.store.make_whole()  # communication (stage 3)

    def _clip(self) -> None:
        """torch.nn.utils.clip_grad_norm_ of the averaged gradient, from the shards (as the PS's servers)."""
        shards = [g for g in self.gshard if g is not None]  # all of them, within a step
        mine = sum(float(g.double().pow(2).sum()) for g in shards)
        total = self.engine.sum_over_workers(torch.tensor([mine], dtype=torch.float64))  # communication
        # A non-finite norm makes the update non-finite on every worker: the next step's loss vote stops the
        # run (the trainer's Diverged), and the parameters' check keeps it from a checkpoint.
        coef = self.clip / (math.sqrt(float(total[0])) + 1e-6)
        if coef < 1.0 or not math.isfinite(coef):
            for g in shards:
                g.mul_(coef)

    def memory(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, int]:
        """What this worker holds: the parameters (stage 3: its shards and the buckets gathered now), the
        gradients (stage 1: the full-size buckets; every stage: its averaged shard, which stages 2 and 3 hold
        during a step alone and which counts here whether or not the step is on, as the ZeRO formula counts it),
        its shards' optimizer state, and the engine's own buffers."""
        params = [*model.parameters(), *self.store.shard, *(f for f in self.store.flat if f is not None)]
        grads = [
            *(p.grad for p in model.parameters() if p.grad is not None),
            *(g for g in self.gshard if g is not None),
        ]
        grads += [g for g in self.gflat if g is not None]
        state = [
            v
            for built in self.shards
            if built is not None
            for st in built[0].state.values()
            for v in st.values()
            if isinstance(v, torch.Tensor)
        ]
        out = held_bytes({"params": params, "grads": grads, "optimizer": state, "buffers": self.engine.flat_buffers()})
        if self.stage >= 2:  # those not made yet this step (between steps: all), as a step holds them
            out["grads"] += sum(4 * (hi - lo) for g, (lo, hi) in zip(self.gshard, self.mine, strict=True) if g is None)
        return out

    # ------------------------------------------------------------ checkpoints
    def gather_state(self, root: int = 0) -> list[dict[str, Any]]:
        """Every parameter's optimizer state in the user's class's format, whole, on rank ``root`` ({} for
        each elsewhere): a collective over the workers.

        Streamed a bucket and a state key at a time: this worker's pieces of, say, ``exp_avg`` go into a
        bucket-sized buffer, one allgather of the parameters' collectives fills it, and ``root`` copies
        each parameter's whole tensor out of it; every worker holds one bucket's buffer on top of its
        shard, and only ``root`` the whole state (not every worker every worker's pickled pieces). A
        bucket whose segments differ in their state's keys or dtypes (a parameter outside the optimizer, a
        class with per-element state that is not float32) goes pickled, its pieces to every worker."""
        n = len(self.layout.buckets)
        mine: dict[int, list[dict[str, Any]]] = {}  # bucket -> per segment: a key's dtype, or its small value
        for b, built in enumerate(self.shards):
            states = [built[0].state.get(leaf, {}) if built else {} for leaf in self.leaves[b]]
            mine[b] = [
                {k: str(v.dtype) if per_element(v, leaf.shape) else v for k, v in st.items()}
                for leaf, st in zip(self.leaves[b], states, strict=True)
            ]
        described = self.engine.allgather_object(mine)  # communication: keys, dtypes and steps (small)
        out: list[dict[str, Any]] = [{} for _ in self.params]
        at_root = self.rank == root
        for b in range(n):
            owners = [  # every worker's segments of the bucket, each with its description
                (seg, d)
                for r, of in enumerate(described)
                for seg, d in zip(self.layout.segments.get((b, r), []), of[b], strict=True)
            ]
            keysets = {tuple(sorted((k, v) for k, v in d.items() if isinstance(v, str))) for _, d in owners}
            if len(keysets) != 1 or any(v != "torch.float32" for _, v in next(iter(keysets))):
                self._gather_pickled(b, out, at_root)  # communication
                continue
            flat_keys = [k for k, _ in next(iter(keysets))]
            if at_root:  # the rest (AdamW's step) from the segment holding each parameter's first element
                for (p, lo, _), d in owners:
                    if lo == 0:
                        out[p].update({k: v for k, v in d.items() if not isinstance(v, str)})
            for key in flat_keys:
                flat = torch.empty(self.layout.numel(b), dtype=torch.float32, device=self.store.nan.device)
                built, (off, _) = self.shards[b], self.mine[b]
                for leaf in self.leaves[b]:  # none where this worker's shard of the bucket is empty
                    assert built is not None  # its segments have the bucket's keys
                    piece = built[0].state[leaf][key].reshape(-1)
                    flat[off : off + piece.numel()].copy_(piece)
                    off += piece.numel()
                self.coll.wait([self.coll.start_allgather(b, flat)], "the optimizer state for a checkpoint")
                if at_root:
                    for p, s in zip(self.layout.buckets[b], self.layout.starts[b], strict=False):
                        size = self.layout.sizes[p]
                        out[p][key] = flat[s : s + size].clone().view_as(self.params[p])
                del flat
        return out

    def _gather_pickled(self, b: int, out: list[dict[str, Any]], at_root: bool) -> None:
        """Bucket ``b``'s state to every worker as pickles, joined on the root (:func:`..shardstate.assemble`)."""
        built = self.shards[b]
        states = [dict(built[0].state.get(leaf, {})) if built else {} for leaf in self.leaves[b]]
        mine = {b: (self.store.shard[b].cpu(), states)} if self.segs[b] else {}
        answers = self.engine.allgather_object(mine)  # communication
        if at_root:
            joined = assemble(self.layout, self.params, answers)[0]
            for p in self.layout.buckets[b]:
                out[p] = joined[p]

    def optimizer_shard(self, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
        """This worker's shard of the optimizer state, for a checkpoint of one file per shard (no gather, no
        communication): per parameter, by its index in the class's ``state_dict``, the segments this worker
        owns, each ``{"lo", "hi", "shape", "flat", "state"}`` with its per-element tensors (``flat`` names
        them) flattened. :func:`...checkpoint.join_shards` makes the whole state from every worker's file,
        whatever the worker count of the run that reads it."""
        order = [p for group in optimizer.param_groups for p in group["params"]]
        index = {id(p): i for i, p in enumerate(order)}
        out: dict[int, list[dict[str, Any]]] = {}
        for b, built in enumerate(self.shards):
            for (p, lo, hi), leaf in zip(self.segs[b], self.leaves[b], strict=True):
                i = index.get(id(self.params[p]))
                if i is None:
                    continue  # not in the optimizer: no state to keep
                st = built[0].state.get(leaf, {}) if built else {}
                flat = [k for k, v in st.items() if per_element(v, leaf.shape)]
                out.setdefault(i, []).append(
                    {
                        "lo": lo,
                        "hi": hi,
                        "shape": list(self.params[p].shape),
                        "flat": flat,
                        "state": {k: v.reshape(-1) if k in flat else v for k, v in st.items()},
                    }
                )
        return {"workers": self.size, "rank": self.rank, "pieces": out}

    def optimizer_groups(self, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
        """The optimizer's ``state_dict`` without its state (its parameter groups): a sharded checkpoint's
        manifest holds it beside the names of the shard files."""
        groups: dict[str, Any] = optimizer.groups_state_dict()  # type: ignore[attr-defined]  # prepare()'s _Sharded
        return groups

    def optimizer_state_dict(self, optimizer: torch.optim.Optimizer) -> dict[str, Any] | None:
        state = optimizer.state_dict()  # communication: every worker's shard
        return state if self.is_main else None

    # ------------------------------------------------------------ the engine's collectives
    def sum_over_workers(self, values: torch.Tensor) -> torch.Tensor:
        return self.engine.sum_over_workers(values)

    def sum_tensors(self, tensors: list[torch.Tensor], name: str = "") -> list[torch.Tensor]:
        return self.engine.sum_tensors(tensors, name)

    def start_vote(self, flags: torch.Tensor) -> None:
        self.engine.start_vote(flags)

    def end_vote(self) -> torch.Tensor:
        return self.engine.end_vote()

    def broadcast_object(self, obj: Any, root: int = 0) -> Any:
        return self.engine.broadcast_object(obj, root)

    def allgather_object(self, obj: Any) -> list[Any]:
        return self.engine.allgather_object(obj)

    def stats(self) -> dict[str, float]:
        return self.engine.stats()

    def leave(self) -> None:
        for h in self._hooks:
            h.remove()  # stage 3's
        self.engine.close()

    def abort(self, code: int) -> None:
        self.engine.abort(code)
