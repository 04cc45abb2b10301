"""The trainer keeps the memory a step frees, counts what each rank holds and refuses a run that cannot fit
(allreduce_train/memory.py)."""

import os
import subprocess
import sys

import pytest
import torch

from allreduce_train.distributed.buffers import held_bytes
from allreduce_train.distributed.local import LocalExchange
from allreduce_train.errors import UserError
from allreduce_train.memory import keep_freed_memory, state_bytes_per_param
from lab.memory.model import parameters

from helpers import RANKS, ROOT, check

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


@pytest.mark.heavy
def test_training_steps_stop_faulting_memory_back_in():
    """With glibc's defaults a step's freed activations go back to the kernel and every step faults
    them in again (about 4100 pages per LeNet-5 step here, the probe holding glibc's thresholds at
    their defaults); with the trainer's settings a step after warm-up reuses its memory."""
    default, keep = faults_per_step("default"), faults_per_step("keep")
    assert default > 100, f"only {default} page faults per step with glibc's defaults: the probe shows nothing to keep"
    assert keep < 5, f"{keep} page faults per step with keep_freed_memory() (glibc's defaults: {default})"


def test_threads_share_an_arena_instead_of_reserving_64_mb_each():
    """RLIMIT_AS counts address space reserved and never touched: glibc's default gives each of 8 threads an
    arena of its own (64 MB reserved each); under keep_freed_memory() and a limit they share one beside the
    main one."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MALLOC_", "ALLREDUCE_TRAIN_MALLOC"))}

    def growth(mode: str) -> float:
        cmd = [sys.executable, str(RANKS / "arena_probe.py"), mode]
        return float(check(subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=env)).stdout.split()[-1])

    default, keep = growth("default"), growth("keep")
    assert default >= keep + 6 * 64, f"8 threads grew VmSize {default} MiB by default, {keep} MiB with the setting"


def test_a_users_own_malloc_setting_wins():
    env = {
        "MALLOC_TRIM_THRESHOLD_": "1",
        "MALLOC_TOP_PAD_": "1",
        "MALLOC_MMAP_THRESHOLD_": "1",
        "MALLOC_ARENA_MAX": "8",
    }
    assert keep_freed_memory(env, limited=True) == {}
    assert set(keep_freed_memory({"MALLOC_TOP_PAD_": "1"}, limited=True)) == {
        "MALLOC_MMAP_THRESHOLD_",
        "MALLOC_TRIM_THRESHOLD_",
        "MALLOC_ARENA_MAX",
    }
    assert keep_freed_memory({"ALLREDUCE_TRAIN_MALLOC": "glibc"}) == {}
    with pytest.raises(UserError, match="ALLREDUCE_TRAIN_MALLOC='kep': use keep"):
        keep_freed_memory({"ALLREDUCE_TRAIN_MALLOC": "kep"})


def test_the_arenas_are_capped_only_under_an_address_space_limit():
    """Capped arenas make threads take turns at malloc's locks: only worth it where RLIMIT_AS counts what
    each arena reserves."""
    assert "MALLOC_ARENA_MAX" not in keep_freed_memory({}, limited=False)
    script = (
        "import resource\n"
        "from allreduce_train.memory import address_space_limited, keep_freed_memory\n"
        "resource.setrlimit(resource.RLIMIT_AS, (64 << 30, resource.RLIM_INFINITY))\n"
        "print(address_space_limited(), 'MALLOC_ARENA_MAX' in keep_freed_memory({}))\n"
    )
    out = check(subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, cwd=ROOT))
    assert out.stdout.split() == ["True", "True"]


def test_each_storage_counts_once_under_the_first_kind_that_holds_it():
    flat = torch.zeros(100)
    got = held_bytes(
        {
            "params": [flat[:60], flat[60:], flat],  # views of one buffer: its 400 bytes once
            "grads": [flat[:10], torch.zeros(3)],  # the buffer again adds nothing; a tensor of its own does
            "buffers": [torch.zeros(0)],
        }
    )
    assert got == {"params": 400, "grads": 12, "buffers": 0}


def test_a_rank_holds_adamws_two_moments_after_its_first_step():
    """The base count in one process (--strategy none's exchange): AdamW's state is exactly twice the
    parameters' bytes plus a 4-byte step count per tensor; nothing before its first step."""
    model = torch.nn.Sequential(torch.nn.Linear(7, 5), torch.nn.ReLU(), torch.nn.Linear(5, 1, bias=False))
    opt = torch.optim.AdamW(model.parameters())
    ex = LocalExchange()
    n = sum(p.numel() for p in model.parameters())
    assert ex.memory(model, opt) == {"params": 4 * n, "grads": 0, "optimizer": 0, "buffers": 0}
    model(torch.ones(2, 7)).sum().backward()
    opt.step()
    assert ex.memory(model, opt) == {"params": 4 * n, "grads": 4 * n, "optimizer": 8 * n + 4 * 3, "buffers": 0}


def test_the_state_per_parameter_comes_from_one_step_of_the_optimizers_class():
    params = [torch.nn.Parameter(torch.zeros(3))]
    assert state_bytes_per_param(torch.optim.AdamW(params)) == 8
    assert state_bytes_per_param(torch.optim.SGD(params, lr=0.1, momentum=0.9)) == 4
    assert state_bytes_per_param(torch.optim.SGD(params, lr=0.1)) == 0


@pytest.mark.heavy
def test_a_run_over_its_memory_limit_is_refused_in_one_line(tmp_path):
    """Under ``prlimit --as`` (RLIMIT_AS: a rank has about 1 GiB of virtual memory before its model), a
    model of 37M parameters with AdamW needs 0.41 GiB more by the ZeRO formula than the 0.3 GiB left:
    exit 2 and one line naming the need and the limit, before any step allocates it."""
    args = ["--model", "lab.memory.model:build", "--model-arg", "width=4096", "--model-arg", "depth=3"]
    args += ["--dataset", "lab.memory.model:data", "--optimizer", "adamw", "--steps", "1", "--no-progress"]
    args += ["--allreduce-engine", "mpi", "--run-dir", str(tmp_path)]
    # 0.45 GiB above what this build maps before any model (torch's CUDA wheels map more than its CPU one)
    probe = "import allreduce_train.trainer, torch, mpi4py.MPI; print(open('/proc/self/status').read())"
    status = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True)
    vm_kib = int(next(ln for ln in status.stdout.splitlines() if ln.startswith("VmPeak:")).split()[1])
    limit = round(vm_kib / (1 << 20) + 0.45, 2)
    cmd = ["prlimit", f"--as={int(limit * (1 << 30))}", sys.executable, "-m", "allreduce_train", "train", *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 2, proc.stderr[-3000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("allreduce_train: error: memory: --strategy allreduce needs"), lines
    assert f"{parameters(4096, 3):,} parameters, 8 bytes of AdamW state each" in lines[0]
    assert f"under RLIMIT_AS {limit:.2f} GiB" in lines[0]
    assert "no sharded stage fits at 1 worker(s)" in lines[0]  # one worker: sharding divides by 1
    assert not list(tmp_path.iterdir())  # no run directory left behind
