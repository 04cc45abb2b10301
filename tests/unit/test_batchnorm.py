"""BatchNorm over workers without mpirun: workers as threads of this process that sum through a barrier,
so the maths of the averaged buffers and of the global batch's statistics is checked in seconds (the real
ranks: tests/mpi/test_batchnorm.py); the conversion; the refusals."""

import threading

import pytest
import torch

from allreduce_train.distributed.batchnorm import GlobalBatchNorm, average_buffers, sync_batchnorm
from allreduce_train.errors import ConfigError

from helpers import parse


class Workers:
    """N workers as threads: ``sum_tensors`` returns, on each, the sum of every worker's tensors, added in
    worker order (the same result everywhere, as an engine's)."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.slots: list[list[torch.Tensor]] = [[] for _ in range(n)]  # each worker's tensors of the sum
        self.barrier = threading.Barrier(n)

    def worker(self, index: int):
        workers = self

        class Exchange:  # what average_buffers and GlobalBatchNorm use of an engine
            num_workers, worker_index, one_model = workers.n, index, True

            @staticmethod
            def sum_tensors(tensors, name=""):
                workers.slots[index] = [t.detach().clone() for t in tensors]
                workers.barrier.wait()
                out = [sum(ts[1:], ts[0].clone()) for ts in zip(*workers.slots, strict=True)]
                workers.barrier.wait()  # every worker has read the slots before any writes again
                return out

        return Exchange()

    def run(self, fn) -> list:
        """``fn(index, exchange)`` on every worker at once; their results by index."""
        out: list = [None] * self.n
        errors: list = []

        def body(i: int) -> None:
            try:
                out[i] = fn(i, self.worker(i))
            except BaseException as e:  # re-raised in the test's thread
                errors.append(e)
                self.barrier.abort()

        threads = [threading.Thread(target=body, args=(i,)) for i in range(self.n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        if errors:
            raise errors[0]
        return out


def bn_net(track=True, affine=True, momentum=0.1):
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Conv2d(2, 3, 3),
        torch.nn.BatchNorm2d(3, affine=affine, track_running_stats=track, momentum=momentum),
        torch.nn.Flatten(),
        torch.nn.Linear(3 * 4 * 4, 5),
        torch.nn.BatchNorm1d(5, affine=affine, track_running_stats=track, momentum=momentum),
    )


@pytest.mark.heavy
@pytest.mark.parametrize("track, affine, momentum", [(True, True, 0.1), (False, True, 0.1), (True, False, None)])
def test_two_workers_sync_batchnorm_is_one_batchnorm_over_their_joint_batch(track, affine, momentum):
    """Outputs, the gradients of every parameter (the sum of the workers' for a loss that is their sum)
    and of the input, and the running statistics: those of one network on the concatenated batch."""
    x = torch.randn(2, 6, 2, 6, 6)  # (worker, B, C, H, W)
    r = torch.randn(2, 6, 5)  # the loss: a random weighting of each output
    ref = bn_net(track, affine, momentum)
    xr = x.reshape(12, 2, 6, 6).requires_grad_()
    for _ in range(2):  # twice: the second step's running statistics start from the first's
        ref.zero_grad()
        out_ref = ref(xr)
        (out_ref * r.reshape(12, 5)).sum().backward()

    nets = [bn_net(track, affine, momentum) for _ in range(2)]  # here: the threads would share the seeded RNG

    def worker(i, ex):
        net = nets[i]
        _, swapped = sync_batchnorm(net, "horovod", ex, torch.device("cpu"))
        assert swapped == 2 and all(isinstance(net[k], GlobalBatchNorm) for k in (1, 4))
        xi = x[i].clone().requires_grad_()
        for _ in range(2):
            net.zero_grad()
            out = net(xi)
            (out * r[i]).sum().backward()
        return net, out.detach(), xi.grad

    (net0, out0, g0), (net1, out1, g1) = Workers(2).run(worker)
    torch.testing.assert_close(torch.cat([out0, out1]), out_ref.detach(), rtol=1e-5, atol=1e-5)
    assert xr.grad is not None
    torch.testing.assert_close(torch.cat([g0, g1]), xr.grad.reshape(12, 2, 6, 6), rtol=1e-4, atol=1e-5)
    scale = max(float(p.grad.abs().max()) for p in ref.parameters())  # a bias before a BatchNorm: 0 + rounding
    for (name, p), p0, p1 in zip(ref.named_parameters(), net0.parameters(), net1.parameters(), strict=True):
        torch.testing.assert_close(p0.grad + p1.grad, p.grad, rtol=1e-4, atol=1e-5 * scale, msg=name)
    for (name, b), b0, b1 in zip(ref.named_buffers(), net0.buffers(), net1.buffers(), strict=True):
        assert torch.equal(b0, b1), name  # every worker tracks the same global statistics
        torch.testing.assert_close(b0, b, rtol=1e-5, atol=1e-6, msg=name)
    net0.eval()  # evaluation: the running statistics, no communication (a lone worker would hang otherwise)
    ref.eval()
    torch.testing.assert_close(net0(x[0]), ref(x[0]), rtol=1e-5, atol=1e-5)


def test_averaged_buffers_are_the_workers_mean_and_shared_ones_come_back_bit_for_bit():
    n = 3
    table = torch.linspace(0, 1, 101)  # equal everywhere, e.g. a fixed embedding
    assert not torch.equal((table + table + table) / n, table)  # a plain mean would change it (rounding)

    def worker(i, ex):
        bn = torch.nn.BatchNorm1d(4)
        assert bn.running_mean is not None and bn.running_var is not None and bn.num_batches_tracked is not None
        bn.running_mean.copy_(torch.arange(4.0) * (i + 1))  # drifted apart: each worker's own
        bn.running_var.fill_(0.1 * (i + 1))
        bn.num_batches_tracked.fill_(5)
        m = torch.nn.Module()
        m.bn = bn
        m.register_buffer("table", table.clone())
        m.register_buffer("h16", torch.tensor([0.1, 1.0], dtype=torch.float16) * (i + 1))
        m.register_buffer("f64", torch.tensor([1 / 3], dtype=torch.float64) * (i + 1))
        average_buffers(m, ex)
        return m

    ms = Workers(n).run(worker)
    for m in ms:
        assert torch.equal(m.table, table)  # bit for bit
        torch.testing.assert_close(m.bn.running_mean, torch.arange(4.0) * 2, rtol=1e-6, atol=0)
        torch.testing.assert_close(m.bn.running_var, torch.full((4,), 0.2), rtol=1e-6, atol=0)
        assert m.h16.dtype == torch.float16 and m.f64.dtype == torch.float64
        torch.testing.assert_close(m.h16, torch.tensor([0.1, 1.0], dtype=torch.float16) * 2)
        torch.testing.assert_close(m.f64, torch.tensor([2 / 3], dtype=torch.float64), rtol=1e-15, atol=0)
        assert int(m.bn.num_batches_tracked) == 5
        for b, b0 in zip(m.buffers(), ms[0].buffers(), strict=True):
            assert torch.equal(b, b0)  # the same on every worker


def test_strategy_none_keeps_each_ranks_own_buffers():
    def worker(i, ex):
        ex.one_model = False  # --strategy none's exchange
        bn = torch.nn.BatchNorm1d(2)
        assert bn.running_mean is not None
        bn.running_mean.fill_(i)
        average_buffers(bn, ex)
        return bn.running_mean

    assert [float(m[0]) for m in Workers(2).run(worker)] == [0.0, 1.0]


def test_conversion_keeps_the_parameters_and_buffers_and_counts_the_layers():
    net = bn_net()
    before = {**dict(net.named_parameters()), **dict(net.named_buffers())}
    ex = Workers(1).worker(0)
    net, swapped = sync_batchnorm(net, "horovod", ex, torch.device("cpu"))
    assert swapped == 2
    after = {**dict(net.named_parameters()), **dict(net.named_buffers())}
    assert after.keys() == before.keys() and all(after[k] is before[k] for k in before)  # the same tensors
    lone, swapped = sync_batchnorm(torch.nn.BatchNorm1d(3), "horovod", ex, torch.device("cpu"))
    assert swapped == 1 and isinstance(lone, GlobalBatchNorm)  # a model that is one BatchNorm layer
    assert sync_batchnorm(torch.nn.Linear(2, 2), "horovod", ex, torch.device("cpu"))[1] == 0


@pytest.mark.parametrize(
    "argv, needle",
    [
        (
            ["--allreduce-engine", "mpi"],
            "--sync-batchnorm: the mpi engine has no SyncBatchNorm; use --allreduce-engine",
        ),
        (["--strategy", "ps"], "--sync-batchnorm: the parameter servers sum gradients only; use --strategy allreduce"),
        (["--strategy", "none"], "--sync-batchnorm: --strategy none exchanges nothing; use --strategy allreduce"),
    ],
)
def test_engines_without_sync_batchnorm_refuse_it_when_the_flags_are_read(argv, needle):
    with pytest.raises(ConfigError, match=needle):
        parse(["--sync-batchnorm", *argv])


def test_the_torch_engine_refuses_sync_batchnorm_on_cpu():
    cfg = parse(["--sync-batchnorm", "--allreduce-engine", "torch"])  # the device is known only at build
    with pytest.raises(ConfigError, match=r"--sync-batchnorm with --allreduce-engine torch needs CUDA"):
        sync_batchnorm(bn_net(), cfg.exchange.engine, Workers(1).worker(0), torch.device("cpu"))


@pytest.mark.parametrize("engine", ["horovod", "torch"])
def test_on_cuda_the_layers_become_the_engines_own_sync_batchnorm(engine):
    """The classes only (no GPU here to run them): Horovod's SyncBatchNorm and torch's, holding the layers'
    own tensors; a layer without running statistics stays ours under Horovod (Horovod's would synchronise
    in evaluation too, where the workers' passes differ in number)."""
    import horovod.torch as hvd

    net = bn_net()
    net[4] = torch.nn.BatchNorm1d(5, track_running_stats=False)
    weight = net[1].weight
    converted, swapped = sync_batchnorm(net, engine, Workers(1).worker(0), torch.device("cuda"))
    assert isinstance(converted, torch.nn.Sequential)  # the container kept, its layers swapped
    net = converted
    want = hvd.SyncBatchNorm if engine == "horovod" else torch.nn.SyncBatchNorm
    assert swapped == 2 and type(net[1]) is want and net[1].weight is weight
    assert type(net[4]) is (GlobalBatchNorm if engine == "horovod" else torch.nn.SyncBatchNorm)
