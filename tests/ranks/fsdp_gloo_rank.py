"""A rank of the torch engine's process group (Gloo on this CPU) asking what PyTorch's own sharding runs on
it: ``python -m launch -np 2 --module fsdp_gloo_rank`` (PYTHONPATH=tests/ranks:.).

Prints one line per probe -- ``rank R NAME ok VALUE`` or ``rank R NAME failed: ERROR`` -- for the collectives
ZeRO needs (``reduce_scatter_tensor``, ``all_gather_into_tensor``, in float32 and bfloat16), FSDP2's
``fully_shard`` training with ``reshard_after_forward`` False (stage 2) and True (stage 3) and under a bf16
``MixedPrecisionPolicy``, and ``ZeroRedundancyOptimizer`` (stage 1). Every probe's VALUE is the same on every
rank where the ranks really communicated (a sum, or the parameters after 3 AdamW steps on each rank's own
samples)."""

import torch
import torch.distributed as dist
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.optim import ZeroRedundancyOptimizer

from allreduce_train.config import ExchangeConfig, TorchConfig
from allreduce_train.distributed.c10d import TorchDistributed

ex = TorchDistributed(ExchangeConfig(stall_timeout=60), TorchConfig())  # the engine's own set-up
rank, size = ex.rank, ex.size


def probe(name, run):
    try:
        print(f"rank {rank} {name} ok {run()}", flush=True)
    except Exception as e:  # a collective Gloo lacks raises one of several types
        print(f"rank {rank} {name} failed: {type(e).__name__}: {str(e).splitlines()[0]}", flush=True)


def reduce_scatter(dtype):
    whole = torch.arange(2.0 * size, dtype=dtype) * (rank + 1)  # the sum is arange * size*(size+1)/2
    mine = torch.empty(2, dtype=dtype)
    dist.reduce_scatter_tensor(mine, whole)  # communication
    total = torch.empty(2 * size, dtype=dtype)
    dist.all_gather_into_tensor(total, mine)  # communication
    return total.float().tolist()


def net():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.ReLU(), torch.nn.Linear(7, 3))


def steps(model, optimizer):
    torch.manual_seed(1 + rank)  # each rank its own samples: equal results need the gradients' sum
    for _ in range(3):
        model(torch.randn(4, 5)).float().square().mean().backward()
        optimizer.step()
        optimizer.zero_grad()


def fsdp(reshard, policy=None):
    model = net()
    for layer in (model[0], model[2]):
        fully_shard(layer, reshard_after_forward=reshard, mp_policy=policy or MixedPrecisionPolicy())
    fully_shard(model, reshard_after_forward=reshard, mp_policy=policy or MixedPrecisionPolicy())
    steps(model, torch.optim.AdamW(model.parameters(), lr=0.01))
    shard = tuple(model[0].weight.to_local().shape)  # this rank's rows of the 7 x 5 matrix
    return f"shard {shard} sum {float(model[0].weight.full_tensor().sum()):.6f}"


def zero():
    model = net()
    optimizer = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.AdamW, lr=0.01)
    torch.manual_seed(1 + rank)
    for _ in range(3):
        model(torch.randn(4, 5)).square().mean().backward()
        for p in model.parameters():
            dist.all_reduce(p.grad)  # communication: the ring's sum, as the torch engine's buckets
            p.grad /= size
        optimizer.step()  # communication: each owner broadcasts its parameters
        optimizer.zero_grad()
    return f"sum {float(model[0].weight.detach().sum()):.6f}"


probe("reduce_scatter_tensor+all_gather_into_tensor float32", lambda: reduce_scatter(torch.float32))
probe("reduce_scatter_tensor+all_gather_into_tensor bfloat16", lambda: reduce_scatter(torch.bfloat16))
probe("fully_shard reshard_after_forward=False", lambda: fsdp(False))
probe("fully_shard reshard_after_forward=True", lambda: fsdp(True))
probe(
    "fully_shard MixedPrecisionPolicy bf16",
    lambda: fsdp(True, MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.bfloat16)),
)
probe("ZeroRedundancyOptimizer", zero)
ex.close()
