import gzip

import numpy as np
import pytest
import torch

from allreduce_train.data.images import ShardedBatches, TensorDataset, eval_shard, load_fashion_mnist, read_idx
from allreduce_train.errors import DataError

from helpers import FASHION_MNIST_DIR, idx_bytes, needs_fashion_mnist, write_split


@pytest.mark.parametrize("gz", [True, False])
def test_reads_generated_idx(tmp_path, gz):
    imgs, lbls = write_split(tmp_path, "train", 12, gz=gz)
    x, y = load_fashion_mnist(str(tmp_path), "train")
    assert np.array_equal(x, imgs) and np.array_equal(y, lbls)


@pytest.mark.parametrize(
    "mutate, needle",
    [
        (lambda b: b"\x01" + b[1:], "bad magic"),
        (lambda b: b[:2] + b"\x0d" + b[3:], "type code"),
        (lambda b: b[:-5], "truncated or corrupt"),
        (lambda b: b[:6], "truncated IDX header"),
    ],
)
def test_corrupt_idx_names_the_file(tmp_path, mutate, needle):
    arr = np.zeros((3, 28, 28), dtype=np.uint8)
    p = tmp_path / "x.idx"
    p.write_bytes(mutate(idx_bytes(arr)))
    with pytest.raises(DataError) as e:
        read_idx(str(p))
    assert str(p) in str(e.value) and needle in str(e.value)


def test_corrupt_gzip(tmp_path):
    p = tmp_path / "x.gz"
    p.write_bytes(gzip.compress(idx_bytes(np.zeros((3, 2), np.uint8)))[:-8])
    with pytest.raises(DataError, match="corrupt gzip"):
        read_idx(str(p))


def test_split_validation(tmp_path):
    write_split(tmp_path, "train", 5, labels=np.array([0, 1, 2, 3, 12], np.uint8))
    with pytest.raises(DataError, match="label 12 out of range"):
        load_fashion_mnist(str(tmp_path), "train")
    with pytest.raises(DataError, match="t10k-images"):
        load_fashion_mnist(str(tmp_path), "test")
    with pytest.raises(DataError, match="directory not found"):
        load_fashion_mnist(str(tmp_path / "missing"), "train")


def test_mismatched_counts(tmp_path):
    write_split(tmp_path, "train", 5)
    (tmp_path / "train-labels-idx1-ubyte.gz").write_bytes(gzip.compress(idx_bytes(np.zeros(4, np.uint8))))
    with pytest.raises(DataError, match="5 images but"):
        load_fashion_mnist(str(tmp_path), "train")


@needs_fashion_mnist
def test_real_fashion_mnist_shapes_and_classes():
    for split, n in (("train", 60000), ("test", 10000)):
        x, y = load_fashion_mnist(FASHION_MNIST_DIR, split)
        assert x.shape == (n, 28, 28) and y.shape == (n,)
        assert np.array_equal(np.bincount(y, minlength=10), np.full(10, n // 10))  # balanced classes


def test_shards_are_disjoint_and_union_is_the_single_process_batch():
    ds = TensorDataset(torch.arange(103).float(), torch.arange(103))
    world, bs = 3, 4
    shards = [ShardedBatches(ds, bs, r, world, seed=7) for r in range(world)]
    single = ShardedBatches(ds, bs * world, 0, 1, seed=7)
    assert single.steps_per_epoch == shards[0].steps_per_epoch == 103 // 12
    for epoch in (0, 1):
        per_rank = [list(s.batches(epoch)) for s in shards]
        for step, (_, y1) in enumerate(single.batches(epoch)):
            parts = [per_rank[r][step][1] for r in range(world)]
            assert torch.equal(torch.cat(parts), y1)
        seen = torch.cat([y for r in range(world) for _, y in per_rank[r]])
        assert len(set(seen.tolist())) == len(seen)  # no sample twice in an epoch
    assert not torch.equal(single.epoch_order(0), single.epoch_order(1))


def test_resume_mid_epoch_gives_the_same_batches():
    ds = TensorDataset(torch.arange(50).float(), torch.arange(50))
    s = ShardedBatches(ds, 5, 1, 2, seed=3)
    full = [y for _, y in s.batches(2)]
    tail = [y for _, y in s.batches(2, start_step=3)]
    assert all(torch.equal(a, b) for a, b in zip(full[3:], tail, strict=True)) and len(tail) == len(full) - 3


def test_eval_shards_cover_everything_once():
    ds = TensorDataset(torch.arange(10).float(), torch.arange(10))
    parts = [eval_shard(ds, r, 3).targets for r in range(3)]
    assert torch.equal(torch.cat(parts), torch.arange(10))
