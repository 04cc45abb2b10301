"""The user's optimizer over shards of the parameters: what the parameter server's servers and the
sharded concept's workers (:mod:`.sharded`) both run.

A *segment* is a range ``(p, lo, hi)`` of flattened parameter ``p``; an owner (a server, a worker)
holds a flat float32 buffer of its segments of a bucket and runs an instance of the user's optimizer
class over views of it (:func:`shard_optimizer`), so that the state it keeps (SGD's momentum, Adam's
two moments) is its shard's only. :func:`assemble` joins every owner's slices back into each
parameter's state in the class's own format, so that a checkpoint is whole whatever the sharding.
"""

from __future__ import annotations

import copy
from typing import Any, Protocol

import torch

from ..errors import UserError

Range = tuple[int, int, int]  # (param index, lo, hi) within the flattened parameter
Pieces = list[tuple[tuple[int, int], torch.Size, dict[str, Any]]]  # a parameter's segments: (lo, hi), shape, state
# How a step runs, not what it computes: an owner's shard is a CPU or device view, whatever the user chose.
PLACE_KEYS = {"foreach": None, "fused": None, "capturable": False}


class Segmented(Protocol):
    """A sharding: elements per parameter, and (bucket, owner) -> the ranges that owner holds of that bucket."""

    sizes: list[int]
    segments: dict[tuple[int, int], list[Range]]


def whole(r: Range, sizes: list[int]) -> bool:
    """Whether a segment is its parameter entire (it then keeps the parameter's shape)."""
    p, lo, hi = r
    return lo == 0 and hi == sizes[p]


def per_element(value: Any, shape: torch.Size) -> bool:
    """Whether a piece of optimizer state has one entry per element of its parameter (Adam's
    moments, SGD's momentum: sliced and reassembled by segment) rather than being one value for the
    whole tensor (``step``: copied to every segment)."""
    return isinstance(value, torch.Tensor) and value.shape == shape


def build(cls: type, groups: list[dict[str, Any]], where: str = "--strategy ps builds it on the servers") -> Any:
    """``cls`` over parameter groups (``params`` and every hyperparameter), as Horovod's
    DistributedOptimizer builds its subclass: from the groups alone, with :data:`PLACE_KEYS` at
    their defaults. A constructor that needs more is refused with one line naming ``where`` it is built."""
    try:
        return cls([{**g, **{k: v for k, v in PLACE_KEYS.items() if k in g}} for g in groups])
    except TypeError as e:
        raise UserError(
            f"{cls.__qualname__}: {where} from its parameter groups alone ({cls.__qualname__}(param_groups)), "
            f"which failed: {e}; give its constructor's other arguments defaults"
        ) from None


def pieces(flat: torch.Tensor, segments: list[Range]) -> list[torch.Tensor]:
    """``segments`` as consecutive 1-D views of ``flat`` (an owner's parameters or gradients of a bucket)."""
    out, off = [], 0
    for _, lo, hi in segments:
        out.append(flat[off : off + hi - lo])
        off += hi - lo
    return out


def leaves(flat: torch.Tensor, segments: list[Range], params: list[torch.Tensor]) -> list[torch.Tensor]:
    """The optimizer's tensors over ``flat``: each segment a view, in its parameter's shape where it is whole
    (so that ``step()`` updates ``flat`` itself, no copy either way)."""
    sizes = [p.numel() for p in params]
    return [
        piece.view(params[p].shape) if whole((p, lo, hi), sizes) else piece
        for (p, lo, hi), piece in zip(segments, pieces(flat, segments), strict=True)
    ]


def shard_optimizer(
    opt: dict[str, Any],
    segments: list[Range],
    held: list[torch.Tensor],
    params: list[torch.Tensor],
    where: str = "--strategy ps builds it on the servers",
) -> tuple[torch.optim.Optimizer, list[int]] | None:
    """The user's optimizer class over one bucket's ``segments`` (``held``: their :func:`leaves`), with the
    groups of their parameters, each segment's slice of its parameter's state, and the user's group index
    of each of its groups (None: no segment is in the optimizer). ``opt``: ``cls``, ``groups`` (without
    ``params``), ``group_of`` (each parameter's group, None: not optimized) and ``state`` by parameter index."""
    cls, groups, group_of, state = opt["cls"], opt["groups"], opt["group_of"], opt["state"]
    sizes = [p.numel() for p in params]
    members: dict[int, list[torch.Tensor]] = {}
    for (p, _, _), leaf in zip(segments, held, strict=True):
        if group_of[p] is not None:  # a parameter the optimizer does not hold stays as it is
            members.setdefault(group_of[p], []).append(leaf)
    if not members:
        return None
    order = sorted(members)
    optimizer = build(cls, [{**groups[g], "params": members[g]} for g in order], where)
    for (p, lo, hi), leaf in zip(segments, held, strict=True):
        if p in state and group_of[p] is not None:  # fresh or loaded from a checkpoint: this segment's slice
            full = whole((p, lo, hi), sizes)
            optimizer.state[leaf] = {
                k: (v.clone() if full else v.reshape(-1)[lo:hi].clone()).to(leaf.device)
                if per_element(v, params[p].shape)
                else copy.deepcopy(v)  # one for each segment: step() increments it in place
                for k, v in state[p].items()
            }
    return optimizer, order


def assemble(
    layout: Segmented, params: list[torch.Tensor], answers: list[dict[int, tuple[torch.Tensor, list[dict[str, Any]]]]]
) -> tuple[list[dict[str, Any]], list[torch.Tensor]]:
    """Every owner's answer (per bucket: its flat parameters and each segment's optimizer state, by owner
    index) as each parameter's optimizer state ({} where none: no step yet, or not in the optimizer; on
    the parameter's device) and parameters (flat, CPU)."""
    sizes = layout.sizes
    master = [torch.zeros(n) for n in sizes]
    parts: list[Pieces] = [[] for _ in sizes]
    for s, answer in enumerate(answers):
        for b, (flat, states) in answer.items():
            off = 0
            for (p, lo, hi), st in zip(layout.segments[(b, s)], states, strict=True):
                master[p][lo:hi] = flat[off : off + hi - lo]
                off += hi - lo
                shape = params[p].shape if whole((p, lo, hi), sizes) else torch.Size([hi - lo])
                parts[p].append(((lo, hi), shape, st))
    return [_joined(p, sorted(pieces, key=lambda x: x[0])) for p, pieces in zip(params, parts, strict=True)], master


def _joined(p: torch.Tensor, pieces: Pieces) -> dict[str, Any]:
    """Parameter ``p``'s state from its segments' (sorted by position): per-element tensors joined in
    the parameter's shape, the rest (``step``) from the first segment."""
    if not pieces or not pieces[0][2] or any(set(st) != set(pieces[0][2]) for _, _, st in pieces):
        return {}  # none yet (an asynchronous fetch can fall between two servers' first steps)
    out: dict[str, Any] = {}
    for key, first in pieces[0][2].items():
        if per_element(first, pieces[0][1]):
            full = torch.empty(p.numel(), dtype=first.dtype)
            for (lo, hi), _, st in pieces:
                full[lo:hi] = st[key].reshape(-1)
            out[key] = full.view_as(p).to(p.device)
        else:
            out[key] = first
    return out
