"""Bytes on the wire per step: the one model of what each concept sends, and the one table of
the wire formats' element sizes, without torch.

The trainer's layers (:mod:`.compression`, :mod:`.powersgd`, :mod:`.schedules`) and the lab's cost
model (lab/common/costmodel.py) both import these formulas, so a test of one is a test of the
other. Shapes are plain tuples of ints (a ``torch.Size`` is one). Pure Python: importing this
module loads neither torch nor MPI (config.py reads the table too, before torch is loaded).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

# The wire formats of --compression (its choices, in this order): the dtype one gradient element
# travels in, by torch's name (PowerSGD's factors are float32), and each such dtype's bytes. The one
# table: config.py's choices and checks, the wire format's dtype (compression.wire_dtype), the
# engines' buffer sizes (buffers.element_size) and the formulas below all read it.
WIRE_DTYPES = {"none": "float32", "fp16": "float16", "bf16": "bfloat16", "powersgd": "float32"}
DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}
SIXTEEN_BIT = tuple(c for c, dtype in WIRE_DTYPES.items() if DTYPE_BYTES[dtype] == 2)  # fp16, bf16


def element_bytes(compression: str) -> int:
    """Bytes one gradient element takes on the wire: 4, or 2 for the 16-bit formats. Every engine's
    bucket size (``--mpi-bucket-bytes``, ``--ps-bucket-bytes``, ``--torch-bucket-bytes``) counts these."""
    return DTYPE_BYTES[WIRE_DTYPES[compression]]


def ring_bytes(numel: float, workers: int, elem: int = 4) -> float:
    """Bytes each worker sends in one ring allreduce of ``numel`` elements of ``elem`` bytes:
    2(N-1)/N of them (reduce-scatter + allgather); nothing at one worker."""
    if workers <= 1:
        return 0.0
    return 2 * (workers - 1) / workers * numel * elem


def allreduce_bytes_per_step(numel: int, workers: int, compression: str = "none") -> float:
    """Bytes each worker sends per step in a ring allreduce of ``numel`` gradient elements at the
    wire's element size."""
    return ring_bytes(numel, workers, element_bytes(compression))


def ps_bytes_per_step(numel: int, compression: str = "none") -> tuple[int, int]:
    """Payload bytes one worker pushes and pulls per step with the parameter server (headers apart):
    every gradient element out, every parameter element back, both at the wire's element size."""
    n = numel * element_bytes(compression)
    return n, n


def dims(shape: Sequence[int]) -> tuple[int, int]:
    """A gradient as PowerSGD sees it: a ``(shape[0], rest)`` matrix."""
    n = int(shape[0]) if len(shape) else 1
    return n, int(math.prod(shape[1:])) if len(shape) > 1 else 1


def compressible(shape: Sequence[int], rank: int) -> bool:
    """Whether PowerSGD sends a gradient of ``shape`` as rank-``rank`` factors: (n + m) r under half
    of n m (torch's DDP hook's rule, compression rate 2)."""
    n, m = dims(shape)
    return (n + m) * min(n, m, rank) * 2 < n * m


def powersgd_elements(shapes: Iterable[Sequence[int]], rank: int) -> int:
    """Elements PowerSGD sends per step: (n + m) r per compressed matrix, every element of the rest."""
    total = 0
    for s in shapes:
        n, m = dims(s)
        total += (n + m) * min(n, m, rank) if compressible(s, rank) else n * m
    return total


def powersgd_bytes_per_step(shapes: Iterable[Sequence[int]], rank: int, workers: int, elem: int = 4) -> float:
    """Bytes each worker sends per step in ring allreduces of the Ps, Qs and uncompressed tensors."""
    return ring_bytes(powersgd_elements(shapes, rank), workers, elem)


def localsgd_bytes_per_step(numel: int, workers: int, every: int, grad_elem: int = 4) -> float:
    """Local SGD (``--average-every H``), averaged over a period: one ring allreduce of the gradients
    (``grad_elem`` bytes each) and one of the float32 parameters per H steps (the vote's 16 bytes
    apart); H = 1 sends the gradients only."""
    ring = ring_bytes(numel, workers, 1)
    return ring * grad_elem if every == 1 else ring * (grad_elem + 4) / every


def diloco_bytes_per_step(numel: int, workers: int, every: int) -> float:
    """DiLoCo (``--diloco-every H``): no gradient travels; one ring allreduce of the float32
    parameter delta per H steps, averaged over the period."""
    return ring_bytes(numel, workers) / every


def sharded_bytes_per_step(numel: int, workers: int, stage: int, compression: str = "none") -> float:
    """Bytes each worker sends per step under ``--strategy sharded --shard-stage S``: the gradients'
    reduce-scatter at the wire's element size ((N-1)/N of them, half a ring allreduce) and the float32
    parameters' all-gather (the other half). Stages 1 and 2 gather once, after the update: the ring's
    volume at float32; stage 3 gathers twice (each module's parameters for forward, again for backward),
    1.5x the ring's. Nothing at one worker."""
    if stage not in (1, 2, 3):
        raise ValueError(f"shard stage must be 1, 2 or 3 (got {stage!r})")
    gathers = 2 if stage == 3 else 1
    half = ring_bytes(numel, workers, 1) / 2  # (N-1)/N elements: one reduce-scatter or one all-gather
    return half * (element_bytes(compression) + 4 * gathers)
