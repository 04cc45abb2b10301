"""The mpi engine's pieces that need no MPI: ring chunks and the configurations it refuses."""

from itertools import pairwise

import pytest

from allreduce_train.distributed.ring import chunk_bounds
from allreduce_train.errors import ConfigError

from helpers import parse


@pytest.mark.parametrize("numel, n", [(10, 3), (1000, 4), (2, 4), (0, 2), (7, 7)])
def test_ring_chunks_cover_the_bucket_in_sizes_one_apart(numel, n):
    cut = chunk_bounds(numel, n)
    sizes = [hi - lo for lo, hi in pairwise(cut)]
    assert cut[0] == 0 and cut[-1] == numel and len(sizes) == n
    assert min(sizes) >= 0 and max(sizes) - min(sizes) <= 1


def test_engine_flags_default_to_horovod_and_parse():
    assert parse([]).exchange.allreduce_engine == "horovod"
    cfg = parse(["--allreduce-engine", "mpi", "--mpi-algorithm", "iallreduce", "--mpi-bucket-bytes", "4096"])
    assert (cfg.exchange.allreduce_engine, cfg.mpi.algorithm, cfg.mpi.bucket_bytes) == ("mpi", "iallreduce", 4096)


@pytest.mark.parametrize(
    "engine, argv, needle",
    [
        ("mpi", ["--reduce-op", "adasum"], "--reduce-op adasum is Horovod's; --allreduce-engine mpi averages"),
        ("mpi", ["--compression", "fp16", "--mpi-algorithm", "iallreduce"], "--mpi-algorithm ring"),
        ("torch", ["--reduce-op", "adasum"], "--reduce-op adasum is Horovod's; --allreduce-engine torch averages"),
    ],
)
def test_what_the_mpi_and_torch_engines_refuse_is_named_when_the_flags_are_read(engine, argv, needle):
    with pytest.raises(ConfigError, match=needle):
        parse(["--allreduce-engine", engine, *argv])
