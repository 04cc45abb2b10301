"""Flat buffers: many tensors laid end to end in one, and back. Every engine and wire format packs
gradients (or parameters, or factors) this way before a collective and unpacks after it; the
offsets are the cumulative element counts, and a copy between dtypes is the cast (16 bits on the
wire: packing narrows, unpacking widens). One element-size rule goes with them: bucket sizes
(``--mpi-bucket-bytes``, ``--ps-bucket-bytes``, ``--torch-bucket-bytes``) count bytes on the wire, at
the wire dtype's size in :mod:`.wirecost`'s table.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from itertools import pairwise

import torch

from .wirecost import DTYPE_BYTES


def element_size(dtype: torch.dtype) -> int:
    """Bytes per element of a wire dtype (4 for float32, 2 for float16 and bfloat16: wirecost's table)."""
    return DTYPE_BYTES[str(dtype).removeprefix("torch.")]


def elements_in(nbytes: int, dtype: torch.dtype) -> int:
    """How many elements of ``dtype`` a bucket of ``nbytes`` bytes on the wire holds (at least one)."""
    return max(1, nbytes // element_size(dtype))


def offsets(sizes: Iterable[int]) -> list[int]:
    """Where each of tensors of ``sizes`` elements starts in the flat buffer, and its end: len + 1 entries."""
    out = [0]
    for n in sizes:
        out.append(out[-1] + n)
    return out


def pack(tensors: Sequence[torch.Tensor | None], out: torch.Tensor, sizes: Sequence[int] | None = None) -> torch.Tensor:
    """Copy ``tensors`` end to end into the flat ``out`` (cast to its dtype); a None (a parameter
    outside this step's loss) packs ``sizes[i]`` zeros, as Horovod sends for it. Returns ``out``."""
    off = 0
    for i, t in enumerate(tensors):
        n = sizes[i] if t is None else t.numel()  # type: ignore[index]
        if t is None:
            out[off : off + n].zero_()
        else:
            out[off : off + n].copy_(t.reshape(-1))
        off += n
    return out


def flatten(
    tensors: Sequence[torch.Tensor], dtype: torch.dtype | None = None, device: torch.device | str | None = None
) -> torch.Tensor:
    """A new flat buffer holding ``tensors`` end to end (in ``dtype``, on ``device``; by default the first's)."""
    first = tensors[0]
    out = torch.empty(sum(t.numel() for t in tensors), dtype=dtype or first.dtype, device=device or first.device)
    return pack(tensors, out)


def views(flat: torch.Tensor, like: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """The segments of ``flat`` shaped as ``like``'s tensors (views: no copy)."""
    cut = offsets(t.numel() for t in like)
    return [flat[lo:hi].view_as(t) for t, (lo, hi) in zip(like, pairwise(cut), strict=True)]


def unpack(flat: torch.Tensor, tensors: Sequence[torch.Tensor]) -> None:
    """Copy the segments of ``flat`` back into ``tensors`` (widened or narrowed to their dtype)."""
    off = 0
    for t in tensors:
        n = t.numel()
        t.view(-1).copy_(flat[off : off + n])
        off += n


def held_bytes(kinds: dict[str, Iterable[torch.Tensor]]) -> dict[str, int]:
    """Bytes of memory behind each kind's tensors, every storage counted once: a view (a parameter
    of a flat buffer, a tied weight) adds nothing once its storage is counted, under the first kind
    that holds it, and a storage counts whole even where only a slice of it is in use."""
    seen: set[tuple[str, int]] = set()
    out = {}
    for kind, tensors in kinds.items():
        total = 0
        for t in tensors:
            local = getattr(t, "to_local", None)  # a DTensor (FSDP2's sharded parameter): this rank's shard
            storage = (local() if local is not None else t).untyped_storage()
            key = (t.device.type, storage.data_ptr())
            if key not in seen and storage.nbytes():
                seen.add(key)
                total += storage.nbytes()
        out[kind] = total
    return out
