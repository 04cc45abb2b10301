"""16-bit on the wire: which dtype each ``--compression`` sends, and what that costs.

``fp16`` and ``bf16`` halve every gradient (and, with the parameter server, every parameter)
message: the sender rounds float32 to 16 bits, the receiver widens back. The rounding and the
widening are the extra compute; where they happen depends on the engine (docs/concepts.md):

* Horovod (fp16 only): its ``Compression.fp16`` casts each gradient before the allreduce and back
  after it on the worker; the ring sums float16. Horovod 0.28.1's PyTorch binding has no bfloat16
  allreduce, so ``bf16`` is refused there with one line.
* ``--allreduce-engine mpi`` and ``torch``: the bucket's flat buffer is 16-bit (:mod:`.buffers`);
  copying the gradients in is the cast, the ring (or Gloo/NCCL) adds 16-bit floats, copying the
  average out widens it.
* parameter server: the worker casts its gradients into the push message; the server widens each
  worker's push to float32, averages and updates float32 master parameters and momentum, and casts
  the parameters into the pull reply; the worker widens them into its model. The conversions of
  all workers' messages land on the servers.

The wire format itself, made once from ``--compression`` and given to the engine and the schedule,
is :class:`.wire.WireFormat`; element sizes and the 16-bit names are one table in :mod:`.wirecost`,
and so are the bytes per step, the cost model's and the trainer's alike.
"""

from __future__ import annotations

import torch

from .wirecost import WIRE_DTYPES, allreduce_bytes_per_step, ps_bytes_per_step

__all__ = ["allreduce_bytes_per_step", "ps_bytes_per_step", "wire_dtype"]


def wire_dtype(compression: str) -> torch.dtype:
    """The dtype gradients travel in under ``--compression`` (wirecost's table: float32, or the 16-bit
    formats' float16 and bfloat16)."""
    return getattr(torch, WIRE_DTYPES[compression])
