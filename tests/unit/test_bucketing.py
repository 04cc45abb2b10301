"""The bucket plan and the parameter servers' shards (pure computation, no MPI), and the hook-started reduction
on plain tensors (no engine)."""

import pytest
import torch

from allreduce_train.distributed.bucketing import BucketedReduction, plan, reverse_buckets
from allreduce_train.distributed.mpi import Place, launched_as
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


def grad(p: torch.Tensor) -> torch.Tensor:
    assert p.grad is not None
    return p.grad


def reduction_over_two_fake_workers(model, ordered):
    """A :class:`BucketedReduction` over ``model``'s parameters, one bucket each, whose "collective" doubles
    the packed bucket (the sum over two workers holding the same gradient); the starts and ends it saw."""
    params = list(model.parameters())
    buckets = reverse_buckets([p.numel() for p in params], 1)  # bucket_elems 1: every tensor alone
    flats = [torch.zeros(params[m[0]].numel()) for m in buckets]
    seen: dict[str, list[int]] = {"started": [], "done": []}

    def start(b):
        seen["started"].append(b)
        reduction.pack(b, flats[b]).mul_(2)

    def done(b):
        seen["done"].append(b)
        reduction.unpack(b, flats[b], 2)

    reduction = BucketedReduction(params, buckets, 2, start, done, ordered=ordered)
    return reduction, seen


@pytest.mark.parametrize("ordered", [True, False])
def test_buckets_start_once_every_pass_produced_them_the_rest_late_with_zeros_and_come_back_averaged(ordered):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2), torch.nn.Linear(2, 2))
    reduction, seen = reduction_over_two_fake_workers(model, ordered)
    x = torch.randn(5, 3)
    model[1](model[0](x)).sum().backward()  # the last layer is outside the loss: its gradients stay None
    assert seen["started"] == []  # one of --backward-passes-per-step 2: no bucket is whole yet
    model[1](model[0](x)).sum().backward()
    # buckets 0 and 1 (the unused layer's, reverse order) come first: in order, nothing may start before them
    assert seen["started"] == ([] if ordered else [2, 3, 4, 5])
    grads = [grad(p).clone() for p in list(model.parameters())[:4]]
    reduction.complete(lambda: None)
    assert sorted(seen["started"]) == list(range(6)) and seen["done"] == list(range(6))
    params = list(model.parameters())
    for p, g in zip(params[:4], grads, strict=True):
        assert torch.equal(grad(p), g)  # the sum over two equal workers, averaged: the gradient itself
    assert all(torch.equal(grad(p), torch.zeros_like(p)) for p in params[4:])  # made, as zeros
    seen["started"].clear()
    reduction.exchanging = False  # a schedule's local step: nothing leaves, each keeps its own gradient
    model[1](model[0](x)).sum().backward()
    reduction.complete(lambda: None)
    assert seen["started"] == [] and torch.equal(grad(params[0]), 1.5 * grads[0])  # its two passes and this one
    reduction.remove()


def test_the_launchers_environment_gives_this_processs_place_in_the_job():
    assert launched_as({}) == Place(0, 1, 0, 1)  # outside any launcher
    ompi = {"OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_LOCAL_RANK": "1"}
    assert launched_as({**ompi, "OMPI_COMM_WORLD_LOCAL_SIZE": "2", "HOROVOD_RANK": "9"}) == Place(3, 4, 1, 2)
    assert launched_as({"PMIX_RANK": "5"}) == Place(5, 1, 0, 1)  # a rank only
    assert launched_as({"HOROVOD_RANK": "1", "HOROVOD_SIZE": "2"}) == Place(1, 2, 0, 1)
