"""The trainer keeps the memory a step frees (allreduce_train/memory.py)."""

import os
import subprocess
import sys

import pytest

from allreduce_train.errors import UserError
from allreduce_train.memory import keep_freed_memory

from helpers import RANKS, check

PROBE = str(RANKS / "page_fault_probe.py")


def faults_per_step(mode: str) -> float:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MALLOC_", "ALLREDUCE_TRAIN_MALLOC"))}
    proc = check(
        subprocess.run(
            [sys.executable, PROBE, mode],
            capture_output=True,
            text=True,
            timeout=120,
            env={**env, "OMP_NUM_THREADS": "1"},
        )
    )
    return float(proc.stdout.split()[-1])


def test_training_steps_stop_faulting_memory_back_in():
    """With glibc's defaults a step's freed activations go back to the kernel and every step faults
    them in again (about 4100 pages per LeNet-5 step here, the probe holding glibc's thresholds at
    their defaults); with the trainer's settings a step after warm-up reuses its memory."""
    default, keep = faults_per_step("default"), faults_per_step("keep")
    assert default > 100, f"only {default} page faults per step with glibc's defaults: the probe shows nothing to keep"
    assert keep < 5, f"{keep} page faults per step with keep_freed_memory() (glibc's defaults: {default})"


def test_a_users_own_malloc_setting_wins():
    env = {"MALLOC_TRIM_THRESHOLD_": "1", "MALLOC_TOP_PAD_": "1", "MALLOC_MMAP_THRESHOLD_": "1"}
    assert keep_freed_memory(env) == {}
    assert set(keep_freed_memory({"MALLOC_TOP_PAD_": "1"})) == {"MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_"}
    assert keep_freed_memory({"ALLREDUCE_TRAIN_MALLOC": "glibc"}) == {}
    with pytest.raises(UserError, match="ALLREDUCE_TRAIN_MALLOC='kep': use keep"):
        keep_freed_memory({"ALLREDUCE_TRAIN_MALLOC": "kep"})
