"""A rank of the Horovod engine's sharded collectives (distributed/horovod_shard.py):
``python -m horovod_shard_rank mpi|gloo`` under mpirun (Horovod's controller: ``--horovod-backend``).

Buckets of odd sizes (some with fewer elements than ranks) hold integer-valued floats that every rank
can recompute for every other rank from a seed, so the sums are exact in float32 and float16. All
buckets are started at once (Horovod fuses what is ready together), then: after the reduce-scatter this
rank's ``flat[lo:hi]`` must be the sum over the ranks of that range, and after the allgather of the
summed shards every rank's whole bucket must be the whole sum, though the rest of it was NaN before.
Last, rank 1 gathers a bucket that no other rank starts: its wait must raise Stalled after the stall
timeout, not hang. Each rank prints one line per check::

    rank R size N ok float32 buckets=B elements=E shard=S
    rank R size N stalled: <the message>
"""

import sys
import time

import torch

from allreduce_train.config import ExchangeConfig, HorovodConfig
from allreduce_train.distributed.horovod import HorovodAllreduce
from allreduce_train.errors import Stalled

SIZES = [1, 2, 3, 5, 7, 64, 1001, 4099, 300_007, 1_300_001]  # the last two beyond one 4 MB fusion buffer together
STALL_S = 2.0


def values(rank: int, numel: int, key: int, dtype: torch.dtype) -> torch.Tensor:
    """Rank ``rank``'s bucket ``key``: integers small enough that any sum over 4 ranks is exact in float16."""
    g = torch.Generator().manual_seed(1000 * key + rank)
    return torch.randint(-200, 201, (numel,), generator=g).to(dtype)


def check(coll, dtype: torch.dtype) -> str:
    rank, size = coll.rank, coll.size
    sums = [torch.stack([values(r, n, key, torch.float32) for r in range(size)]).sum(0) for key, n in enumerate(SIZES)]
    bounds = [coll.bounds(n) for n in SIZES]
    for n, b in zip(SIZES, bounds, strict=True):  # the shards tile the bucket in rank order
        assert b[0][0] == 0 and b[-1][1] == n and all(b[i][1] == b[i + 1][0] for i in range(size - 1)), (n, b)
    flats = [values(rank, n, key, dtype) for key, n in enumerate(SIZES)]
    coll.wait([coll.start_reduce_scatter(key, f) for key, f in enumerate(flats)], "reduce-scatter")
    for key, (f, s, b) in enumerate(zip(flats, sums, bounds, strict=True)):
        lo, hi = b[rank]
        assert torch.equal(f[lo:hi].float(), s[lo:hi]), f"reduce-scatter of bucket {key} ({SIZES[key]} elements)"
        f[:lo] = float("nan")  # what the gather must overwrite: everything but this rank's shard
        f[hi:] = float("nan")
    coll.wait([coll.start_allgather(key, f) for key, f in enumerate(flats)], "allgather")
    for key, (f, s) in enumerate(zip(flats, sums, strict=True)):
        assert torch.equal(f.float(), s), f"allgather of bucket {key} ({SIZES[key]} elements)"
    shard = sum(b[rank][1] - b[rank][0] for b in bounds)
    return f"ok {str(dtype).removeprefix('torch.')} buckets={len(SIZES)} elements={sum(SIZES)} shard={shard}"


def main() -> None:
    ex = HorovodAllreduce(ExchangeConfig(stall_timeout=STALL_S), HorovodConfig(backend=sys.argv[1]))
    coll = ex.shard_collectives()
    tag = f"rank {coll.rank} size {coll.size}"
    for dtype in (torch.float32, torch.float16):
        print(f"{tag} {check(coll, dtype)}", flush=True)
    if coll.rank == 1:
        try:
            coll.wait([coll.start_allgather(31999, torch.zeros(5))], "a bucket no other rank gathers")
            print(f"{tag} not stalled", flush=True)
        except Stalled as e:
            print(f"{tag} stalled: {e}", flush=True)
    else:
        time.sleep(2 * STALL_S)  # still up while rank 1 waits: its wait sees no progress, not a shutdown
    ex.close()


if __name__ == "__main__":
    main()
