"""--device auto|cpu|cuda and the local rank -> the device a rank trains on (allreduce_train/devices.py).

Nothing here depends on the host having a GPU or not. The no-GPU paths run against the real
torch.cuda made to see no GPU (fixture ``no_gpu``); the GPU mapping (one rank per GPU, local rank
modulo the count) runs against a small stand-in for torch.cuda that records which device was set;
and pick_device's default, the real torch.cuda, is checked both ways by patching its calls. make
check-gpu-build runs the real CUDA build without a GPU.
"""

import io

import pytest
import torch

from allreduce_train.devices import pick_device
from allreduce_train.errors import ConfigError


class Gpus:
    """torch.cuda's four calls on a host with ``count`` GPUs."""

    def __init__(self, count: int) -> None:
        self.count = count
        self.current: int | None = None  # no set_device yet

    def is_available(self) -> bool:
        return self.count > 0

    def device_count(self) -> int:
        return self.count

    def set_device(self, index: int) -> None:
        assert 0 <= index < self.count
        self.current = index

    def current_device(self) -> int | None:
        return self.current


def see(gpus: Gpus, monkeypatch) -> None:
    """Make the real torch.cuda answer as ``gpus`` does, on any host."""
    for call in ("is_available", "device_count", "set_device", "current_device"):
        monkeypatch.setattr(torch.cuda, call, getattr(gpus, call))


@pytest.fixture
def no_gpu(monkeypatch):
    """The real torch.cuda, made to see no GPU whether or not the host has one."""
    see(Gpus(0), monkeypatch)
    return torch.cuda


def test_by_default_the_choice_follows_torch_cuda(monkeypatch):
    """Without ``cuda=``, pick_device asks torch.cuda itself: no GPU visible, auto trains on the CPU;
    two visible, local rank 3 takes GPU 1."""
    see(Gpus(0), monkeypatch)
    assert pick_device("auto", 3, out=io.StringIO()) == torch.device("cpu")
    gpus = Gpus(2)
    see(gpus, monkeypatch)
    assert pick_device("auto", 3) == torch.device("cuda", 1) and gpus.current == 1


def test_auto_without_gpu_trains_on_cpu_and_a_cuda_build_says_so_once(no_gpu):
    out = io.StringIO()
    assert pick_device("auto", 0, cuda=no_gpu, cuda_build="13.0", out=out) == torch.device("cpu")
    lines = out.getvalue().splitlines()
    assert len(lines) == 1 and "no GPU found" in lines[0] and "CUDA 13.0" in lines[0] and "CPU" in lines[0]
    quiet = io.StringIO()  # ranks other than 0 keep quiet: a job prints the line once
    assert pick_device("auto", 1, announce=False, cuda=no_gpu, cuda_build="13.0", out=quiet) == torch.device("cpu")
    assert quiet.getvalue() == ""


def test_auto_with_cpu_torch_is_silent(no_gpu):
    out = io.StringIO()
    assert pick_device("auto", 0, cuda=no_gpu, cuda_build=None, out=out) == torch.device("cpu")
    assert out.getvalue() == ""


@pytest.mark.parametrize("cuda_build,why", [(None, "CPU build"), ("13.0", "finds no GPU or driver")])
def test_cuda_without_gpu_is_one_clear_error(cuda_build, why, no_gpu):
    with pytest.raises(ConfigError) as e:
        pick_device("cuda", 0, cuda=no_gpu, cuda_build=cuda_build)
    assert "--device cuda" in str(e.value) and why in str(e.value) and "--device auto or cpu" in str(e.value)


def test_bad_value_is_refused():
    with pytest.raises(ConfigError, match="use auto, cpu or cuda"):
        pick_device("gpu", 0)


@pytest.mark.parametrize("want", ["auto", "cuda"])
def test_one_rank_per_gpu(want):
    # 4 GPUs: local ranks 0..3 take GPUs 0..3; a 5th rank on the host wraps around to GPU 0.
    for local_rank, index in ((0, 0), (1, 1), (3, 3), (4, 0)):
        gpus = Gpus(4)
        assert pick_device(want, local_rank, cuda=gpus) == torch.device("cuda", index)
        assert gpus.current == index


def test_cpu_wins_over_a_gpu():
    gpus = Gpus(2)
    assert pick_device("cpu", 1, cuda=gpus) == torch.device("cpu")
    assert gpus.current is None
