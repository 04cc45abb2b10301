"""What the GPU check runs: its ways (one rank), the two-rank jobs, their labels in the table, the
default models and busy batches; and the log line every part of it prints."""

from __future__ import annotations

import time

from models import MODELS

WAYS = ("trainer", "trainer-bf16-mixed", "trainer-16-mixed", "trainer-exchange", "horovod", "ddp")
# The trainer's rows with mixed-precision compute (--precision), beside its float32 "trainer" row
PRECISION = {"trainer-bf16-mixed": "bf16-mixed", "trainer-16-mixed": "16-mixed"}
# What a way needs of the device, and the row's line where it is missing (the trainer refuses it on the CPU)
NEEDS_CUDA = {
    "trainer-16-mixed": "needs CUDA: float16 autocast with a loss scaler (the trainer refuses --precision 16-mixed "
    "on the CPU)"
}
LABELS = {
    "trainer": "trainer, no exchange",
    "trainer-bf16-mixed": "trainer, no exchange, bf16-mixed",
    "trainer-16-mixed": "trainer, no exchange, 16-mixed",
    "trainer-exchange": "trainer, Horovod allreduce",
    "horovod": "bare Horovod",
    "ddp": "DDP",
    "ring-gloo": "trainer, Horovod Gloo, 2 ranks",
    "ring-mpi": "trainer, mpi4py ring, 2 ranks",
    "ps-sync-colocated": "trainer, colocated PS, 2 ranks",
}
# The two-rank jobs: ring-mpi and ps-sync-colocated are the lab's registry methods (lab/common/methods.py);
# ring-gloo is Horovod's ring started over Gloo without MPI (one GPU, NCCL refuses two ranks on it).
TWO_RANK_WAYS = ("ring-gloo", "ring-mpi", "ps-sync-colocated")
OLD_NAMES = {"ps": "ps-sync-colocated"}  # --two-ranks' older name
DEFAULT_MODELS = "lenet5,resnet18,ptb-lstm-small"
# A batch per model at which the GPU computes more than it waits on kernel launches (the models' own
# batches, 64/64/20, leave an H200 launch-bound: issue 24's figures).
DEFAULT_BUSY = "lenet5=1024,resnet18=256,ptb-lstm-small=256"


def log(msg: str) -> None:
    print(f"[gpucheck {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def batch_for(model: str, batch_size: int) -> int:
    return batch_size or int(MODELS[model].defaults.get("batch_size", 64))
