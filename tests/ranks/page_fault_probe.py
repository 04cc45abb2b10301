"""Minor page faults per LeNet-5 training step (the quietest of 4 windows of 10 steps):
``python page_fault_probe.py keep|default``.

Both modes first hold glibc's default thresholds (mmap and trim at 128 kB) with ``mallopt()``, which
turns off glibc's adaptation of them: left adaptive, the default's faults vary from run to run with
the heap's layout (0 to ~1700 per step measured here: a freed block of a few MB can raise the trim
threshold above what a step frees), so a run of the default could not show what the settings change.
``keep`` then calls the trainer's ``keep_freed_memory()`` (which sets its own values over these);
``default`` leaves glibc at its defaults. Prints one line: ``faults_per_step X``.
"""

import ctypes
import resource
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root

import torch
import torch.nn.functional as F

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # malloc.h
mallopt = ctypes.CDLL(None).mallopt
assert mallopt(M_MMAP_THRESHOLD, 128 << 10) == 1 and mallopt(M_TRIM_THRESHOLD, 128 << 10) == 1

if sys.argv[1] == "keep":
    from allreduce_train.memory import keep_freed_memory

    assert keep_freed_memory(), "nothing was set"

from allreduce_train.data.images import ShardedBatches, synthetic  # noqa: E402
from models import MODELS  # noqa: E402

torch.set_num_threads(1)
train_set, _eval_set = synthetic((1, 28, 28), 10, 6400, 42)
batches = ShardedBatches(train_set, 64, 0, 1, 42).batches(0)  # a fresh batch every step, as in the trainer
model = MODELS["lenet5"].build()
opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)


def step() -> None:
    x, y = next(batches)
    opt.zero_grad()
    F.cross_entropy(model(x), y).backward()
    opt.step()


for _ in range(10):  # warm-up: the heap reaches its working size
    step()
# The quietest of 4 windows of 10 steps: a busy machine (reclaim, other jobs) can add faults to one
# window, while glibc's defaults fault ~4100 pages back in on every step of every window.
windows = []
for _ in range(4):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(10):
        step()
    windows.append((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 10)
print(f"faults_per_step {min(windows):.2f}")
