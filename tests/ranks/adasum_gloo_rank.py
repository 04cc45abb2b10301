"""A rank of Horovod on Gloo, as ``horovodrun --gloo`` runs it (the rendezvous the trainer's
``--horovod-backend gloo`` serves): ``python -m adasum_gloo_rank``.

Prints the Horovod engine's refusal of ``--reduce-op adasum`` there, then what Horovod itself does with an
Adasum allreduce on Gloo (the reason for the refusal)."""

import os

import horovod.torch as hvd
import torch

from allreduce_train.distributed.horovod import check_adasum, gloo_under_mpirun
from allreduce_train.errors import UserError

server = gloo_under_mpirun(os.environ)
hvd.init()
try:
    check_adasum(hvd)
    print(f"rank {hvd.rank()} accepted", flush=True)
except UserError as e:
    print(f"rank {hvd.rank()} refused: {e}", flush=True)
try:
    hvd.allreduce(torch.ones(4), op=hvd.Adasum, name="adasum")
    print(f"rank {hvd.rank()} horovod: adasum ran", flush=True)
except RuntimeError as e:
    print(f"rank {hvd.rank()} horovod: {str(e).splitlines()[0]}", flush=True)
hvd.shutdown()
