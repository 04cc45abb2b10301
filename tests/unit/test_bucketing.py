"""The bucket plan and the parameter servers' shards (pure computation, no MPI), and the hook-started reduction
on plain tensors (no engine)."""

import pytest
import torch

from allreduce_train.distributed.bucketing import plan
from models import MODELS

LENET = [p.numel() for p in MODELS["lenet5"].build().parameters()]


def owners(layout):
    """Per parameter: how many servers own each element, and which (from the chunks and from the
    message segments, which must agree)."""
    counts = [torch.zeros(n, dtype=torch.int64) for n in layout.sizes]
    by_chunk = [torch.full((n,), -1) for n in layout.sizes]
    for c in layout.chunks:
        counts[c.param][c.lo : c.hi] += 1
        by_chunk[c.param][c.lo : c.hi] = c.server
    by_segment = [torch.full((n,), -1) for n in layout.sizes]
    for (_, s), ranges in layout.segments.items():
        for p, lo, hi in ranges:
            assert (by_segment[p][lo:hi] == -1).all(), "an element travels twice"
            by_segment[p][lo:hi] = s
    return counts, by_chunk, by_segment


@pytest.mark.parametrize("sizes", [LENET, [1, 7, 1000, 3, 999, 50_000, 2], [5]])
@pytest.mark.parametrize("servers", [1, 2, 3, 5])
@pytest.mark.parametrize("split", [97, 4096, 1 << 30])
def test_every_element_has_exactly_one_server_and_loads_differ_by_at_most_one_chunk(sizes, servers, split):
    layout = plan(sizes, servers, split, bucket_elems=2048)
    counts, by_chunk, by_segment = owners(layout)
    for n, a, b in zip(counts, by_chunk, by_segment, strict=True):
        assert (n == 1).all()
        assert torch.equal(a, b)  # the messages carry exactly the elements each server owns
    biggest = max(c.numel for c in layout.chunks)
    assert biggest <= split
    load = layout.server_numel()
    assert sum(load) == sum(sizes)
    assert max(load) - min(load) <= biggest


def test_big_tensors_are_split_across_servers_small_ones_are_not():
    layout = plan([100_000, 10], 4, split_elems=16_384, bucket_elems=1 << 20)
    assert {c.server for c in layout.chunks if c.param == 0} == {0, 1, 2, 3}
    assert len([c for c in layout.chunks if c.param == 1]) == 1
    load = layout.server_numel()
    assert max(load) - min(load) <= 16_384


def test_buckets_follow_backward_order_and_respect_the_size():
    sizes = [100, 200, 300, 400, 50]
    layout = plan(sizes, 2, split_elems=10_000, bucket_elems=450)
    assert [p for b in layout.buckets for p in b] == [4, 3, 2, 1, 0]  # last layer's gradients first
    for b in layout.buckets:
        assert len(b) == 1 or sum(sizes[p] for p in b) <= 450
    assert plan([10_000], 1, 10_000, bucket_elems=1).buckets == [[0]]  # a tensor bigger than a bucket still goes


def test_plan_is_deterministic():
    a = plan(LENET, 3, 1000, 5000)
    b = plan(list(LENET), 3, 1000, 5000)
    assert a.chunks == b.chunks and a.segments == b.segments and a.buckets == b.buckets


def test_adjacent_chunks_of_one_server_travel_as_one_range():
    layout = plan([1000], 1, split_elems=100, bucket_elems=1 << 20)
    assert len(layout.chunks) == 10
    assert layout.segments == {(0, 0): [(0, 0, 1000)]}
