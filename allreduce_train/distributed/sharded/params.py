"""The parameters of the sharded concept: flat buffers per bucket, whole or (stage 3) gathered when used.

Every parameter becomes a view of its bucket's flat float32 buffer, so that one allgather of the buffer
gives every worker the updated parameters in place. Stages 1 and 2 keep the buffers whole; this worker's
shard of them is a view that its optimizer updates.

Stage 3 keeps only the shard (a float32 copy of its own) and frees each bucket's buffer when it is not
in use: its parameters then point at a NaN of their shape (no memory; a value read by mistake poisons the
loss, which the trainer's vote stops). A bucket is gathered (a new buffer, the shard copied in, an
allgather, the parameters pointed at it) before the forward pass of every module that holds one of its
parameters, and freed after it; in backward, the tensors autograd saved of a parameter (a weight a
matmul needs for its input's gradient) are packed as a reference to their bucket
(``torch.autograd.graph.saved_tensors_hooks``) and gathered again when backward unpacks them; a bucket
is freed again once its gradients have all been produced. Gradients flow to the parameters whatever
their storage (autograd accumulates into ``.grad`` by shape alone). :meth:`ShardedParams.make_whole`
gathers every bucket and keeps them whole until the next training forward pass (checkpoints,
evaluation, the end of a run).
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils.hooks import RemovableHandle

from .collectives import ShardCollectives
from .layout import ShardLayout

# What autograd keeps of a tensor saved for backward: an activation as is, a parameter (or a view of one) as
# (bucket, size, stride, storage offset), gathered again when backward needs it
Packed = torch.Tensor | tuple[int, torch.Size, tuple[int, ...], int | torch.SymInt]


class ShardedParams:
    """``params`` (float32, one device) as views of one flat buffer per bucket of ``layout``; ``stage`` 3:
    sharded (see the module docstring)."""

    def __init__(
        self, params: list[torch.Tensor], layout: ShardLayout, rank: int, coll: ShardCollectives, stage: int
    ) -> None:
        self.layout, self.coll, self.stage, self.params = layout, coll, stage, params
        device = params[0].device if params else torch.device("cpu")  # the model's (none: nothing to train)
        whole: list[torch.Tensor] = []
        with torch.no_grad():
            for b in range(len(layout.buckets)):
                flat = torch.empty(layout.numel(b), dtype=torch.float32, device=device)
                for p, view in self._views(b, flat):
                    view.copy_(p)
                    p.data = view
                whole.append(flat)
        self.mine = [layout.bounds[b][rank] for b in range(len(whole))]
        # this worker's shard of each bucket: what its optimizer updates (stage 3: the only copy it keeps)
        self.shard = [
            f[lo:hi].clone() if stage == 3 else f[lo:hi] for f, (lo, hi) in zip(whole, self.mine, strict=True)
        ]
        self.whole = True  # every bucket is gathered, and stays so until the next training forward pass
        self.resident = {f.data_ptr(): b for b, f in enumerate(whole)}  # a gathered buffer -> its bucket
        self.flat: list[torch.Tensor | None] = list(whole)  # stage 3: None while freed
        self.users = [0] * len(self.flat)  # modules in their forward pass that use each bucket
        self.nan = torch.full((), float("nan"), device=device)
        self._saving: torch.autograd.graph.saved_tensors_hooks | None = None

    def _views(self, b: int, flat: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Bucket ``b``'s parameters and their views of ``flat``."""
        lay = self.layout
        return [
            (self.params[p], flat[s : s + lay.sizes[p]].view_as(self.params[p]))
            for p, s in zip(lay.buckets[b], lay.starts[b], strict=False)  # starts: one more, the end
        ]

    # ------------------------------------------------------------ gathering
    def allgather(self, buckets: list[int]) -> None:
        """The buckets whole on every worker from each one's shard (collective: every worker, same order)."""
        handles = []
        for b in buckets:
            flat = self.flat[b]
            if flat is None:  # stage 3, freed: a new buffer, this worker's shard in it
                flat = self.flat[b] = torch.empty(self.layout.numel(b), dtype=torch.float32, device=self.nan.device)
                lo, hi = self.mine[b]
                flat[lo:hi].copy_(self.shard[b])
                for p, view in self._views(b, flat):
                    p.data = view
                self.resident[flat.data_ptr()] = b
            elif self.stage == 3:
                continue  # gathered already
            handles.append(self.coll.start_allgather(b, flat))  # communication
        self.coll.wait(handles, "the allgather of the parameters")

    def free(self, b: int) -> None:
        """Stage 3: give bucket ``b``'s buffer back (its parameters keep their shapes, not their values)."""
        flat = self.flat[b]
        if self.stage == 3 and flat is not None:
            del self.resident[flat.data_ptr()]
            for p, _ in self._views(b, flat):
                p.data = self.nan.expand(p.shape)
            self.flat[b] = None

    def release(self) -> None:
        """Stage 3, after an update: every bucket back to its shard (the buffers are stale)."""
        for b in range(len(self.flat)):
            self.free(b)
        self.whole = False

    def make_whole(self) -> None:
        if self.stage == 3 and not self.whole:
            self.allgather(list(range(len(self.flat))))  # communication
            self.whole = True

    # ------------------------------------------------------------ stage 3's hooks
    def attach(self, model: torch.nn.Module, params: list[torch.Tensor]) -> list[RemovableHandle]:
        """Stage 3: gather each module's buckets for its forward pass and its parameters for backward;
        returns the hook handles."""
        bucket_of = {id(params[p]): b for b, members in enumerate(self.layout.buckets) for p in members}
        hooks = [model.register_forward_pre_hook(self._enter), model.register_forward_hook(self._exit)]
        for module in model.modules():
            used = sorted({bucket_of[id(p)] for p in module.parameters(recurse=False) if id(p) in bucket_of})
            if used:
                hooks.append(module.register_forward_pre_hook(lambda _m, _i, used=used: self._use(used)))
                hooks.append(module.register_forward_hook(lambda _m, _i, _o, used=used: self._done(used)))
        return hooks

    def _enter(self, _module: torch.nn.Module, _inputs: tuple[Any, ...]) -> None:
        if not torch.is_grad_enabled():
            return
        if self.whole:  # a training step begins: from here on, buckets are gathered where used
            for b in range(len(self.flat)):
                self.free(b)
            self.whole = False
        self._saving = torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)
        self._saving.__enter__()

    def _exit(self, _module: torch.nn.Module, _inputs: tuple[Any, ...], _output: object) -> None:
        if self._saving is not None:
            self._saving.__exit__(None, None, None)
            self._saving = None

    def _use(self, used: list[int]) -> None:
        if self.whole:
            return
        for b in used:
            self.users[b] += 1
        self.allgather(used)  # communication: the module's parameters, for its forward pass

    def _done(self, used: list[int]) -> None:
        if self.whole:
            return
        for b in used:
            self.users[b] -= 1
            if self.users[b] == 0:
                self.free(b)

    def _pack(self, t: torch.Tensor) -> Packed:
        b = self.resident.get(t.untyped_storage().data_ptr()) if t.device == self.nan.device else None
        if b is None:
            return t  # an activation: kept as autograd keeps it
        return b, t.size(), t.stride(), t.storage_offset()  # a parameter (or a view of one): gathered again later

    def _unpack(self, packed: Packed) -> torch.Tensor:
        if isinstance(packed, torch.Tensor):
            return packed
        b, size, stride, offset = packed
        self.allgather([b])  # communication: the parameters backward needs
        flat = self.flat[b]
        assert flat is not None  # gathered just now
        return flat.as_strided(size, stride, offset)
