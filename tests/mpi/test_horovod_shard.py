"""The Horovod engine's collectives for ``--strategy sharded`` (distributed/horovod_shard.py) on their own,
at real ranks on Horovod's MPI and Gloo controllers (the rank program: tests/ranks/horovod_shard_rank.py)."""

import re

import pytest

from allreduce_train.distributed.horovod_shard import horovod_bounds

from helpers import RANKS, ROOT, check, launch


@pytest.mark.parametrize(
    "numel, size, expected",
    [
        (7, 3, [(0, 3), (3, 5), (5, 7)]),  # the first 7 % 3 ranks hold one more
        (6, 3, [(0, 2), (2, 4), (4, 6)]),
        (2, 3, [(0, 1), (1, 2), (2, 2)]),  # fewer elements than ranks: the last shard is empty
        (1, 4, [(0, 1), (1, 1), (1, 1), (1, 1)]),
        (5, 1, [(0, 5)]),
    ],
)
def test_horovod_bounds_give_the_first_ranks_the_remainder(numel, size, expected):
    assert horovod_bounds(numel, size) == expected


@pytest.mark.mpi
@pytest.mark.long  # ~15 s a job on this host: make test-long, .ci/run; the sharded trainer runs cover make test
@pytest.mark.parametrize("backend, np", [("mpi", 2), ("mpi", 3), ("gloo", 2), ("gloo", 3)])
def test_reduce_scatter_sums_each_ranks_shard_and_allgather_restores_every_bucket(backend, np):
    """The rank program asserts, on every rank, the exact sums of its own shard of buckets of odd sizes (some
    smaller than the number of ranks) in float32 and float16, then the whole buckets after the gather; and
    that a gather no other rank joins raises Stalled after the stall timeout instead of hanging."""
    proc = check(
        launch(np, [backend], module="horovod_shard_rank", env={"PYTHONPATH": f"{RANKS}:{ROOT}"}, oversubscribe=True)
    )
    # the ranks' lines may arrive interleaved on one line of mpirun's output
    ok = re.findall(rf"rank (\d) size {np} ok (float32|float16) buckets=10 elements=(\d+) shard=(\d+)", proc.stdout)
    assert sorted((int(r), d) for r, d, _, _ in ok) == [(r, d) for r in range(np) for d in ("float16", "float32")]
    whole = int(ok[0][2])
    shards = {int(r): int(s) for r, _, _, s in ok}
    assert sum(shards.values()) == whole and max(shards.values()) - min(shards.values()) < 10  # <= 1 per bucket
    assert f"rank 1 size {np} stalled: waiting for a bucket no other rank gathers" in proc.stdout, proc.stdout
