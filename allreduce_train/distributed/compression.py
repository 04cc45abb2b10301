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

Bytes per step are the cost model's and the trainer's alike (:mod:`.wirecost`).
"""

from __future__ import annotations

import torch

from .wirecost import allreduce_bytes_per_step, element_bytes, ps_bytes_per_step

__all__ = [
    "SIXTEEN_BIT",
    "WIRE_DTYPES",
    "allreduce_bytes_per_step",
    "bytes_per_element",
    "ps_bytes_per_step",
    "wire_dtype",
]

# powersgd sends float32 factors (powersgd.py)
WIRE_DTYPES = {"none": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16, "powersgd": torch.float32}
SIXTEEN_BIT = ("fp16", "bf16")


def wire_dtype(compression: str) -> torch.dtype:
    """The dtype gradients travel in under ``--compression`` (none, fp16, bf16)."""
    return WIRE_DTYPES[compression]


def bytes_per_element(compression: str) -> int:
    """Bytes one gradient element takes on the wire: 4, or 2 for the 16-bit formats (:mod:`.wirecost`)."""
    return element_bytes(compression)
