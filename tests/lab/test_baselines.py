"""The bare loops that bench and gpucheck both time (lab/common/baselines.py), in this process: the DDP loop
over gloo in a world of one (the Horovod loop and more ranks: test_bench.py, test_gpucheck.py)."""

import math

import pytest
import torch

from lab.common.baselines import setup_ddp, time_steps, workload
from lab.common.jobs import free_port
from lab.common.workloads import loss_of


@pytest.mark.heavy
def test_the_ddp_loop_trains_and_the_timing_loop_keeps_the_first_warm_up_loss_and_the_last_timed_one(monkeypatch):
    for var in ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"):
        monkeypatch.delenv(var, raising=False)  # a world of one, as outside mpirun
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "lo")
    cpu = torch.device("cpu")
    model, x, y = workload("lenet5", 4, 64, 42, 0, 1, cpu)
    again, x2, y2 = workload("lenet5", 4, 64, 42, 0, 1, cpu)
    # the seed, then the build: the same initial parameters and batch every time (the trainer's)
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), again.state_dict().values(), strict=True))
    assert torch.equal(x, x2) and torch.equal(y, y2)
    before = loss_of(again, x, y).item()

    step, total, close = setup_ddp(model, 0.01, free_port())
    try:
        timed = time_steps(step, x, y, warmup_steps=2, steps=3)
        assert timed.loss_first == pytest.approx(before, rel=1e-6)  # the first warm-up step's loss
        assert timed.loss_last < timed.loss_first  # five SGD steps on one batch: the update reached the model
        assert total(torch.tensor([2.5])).item() == 2.5  # the sum over a world of one
    finally:
        close()

    no_warm_up = time_steps(lambda x, y: torch.tensor(1.5), x, y, warmup_steps=0, steps=2)
    assert math.isnan(no_warm_up.loss_first) and no_warm_up.loss_last == 1.5
