"""The Penn-Treebank-format reader, the per-rank token streams and the offline corpus."""

import pytest
import torch

from allreduce_train.data import ptb
from allreduce_train.errors import DataError

from helpers import write_corpus


def test_reader_vocabulary_eos_and_unk(tmp_path):
    d = tmp_path / "c"
    d.mkdir()
    (d / "ptb.train.txt").write_text(" b a b <unk> \n c b \n")
    (d / "ptb.valid.txt").write_text(" a zebra \n")  # zebra is not in train: <unk>
    (d / "ptb.test.txt").write_text(" c \n\n")  # an empty line is still a sentence end
    c = ptb.load_ptb(str(d))
    # counts: b 3, <eos> 2, a 1, c 1, <unk> 1; ties by spelling
    assert c.vocab == ["b", "<eos>", "<unk>", "a", "c"]
    ids = {w: i for i, w in enumerate(c.vocab)}
    assert c.train.tolist() == [ids[w] for w in ["b", "a", "b", "<unk>", "<eos>", "c", "b", "<eos>"]]
    assert c.valid.tolist() == [ids["a"], ids["<unk>"], ids["<eos>"]]
    assert c.test.tolist() == [ids["c"], ids["<eos>"], ids["<eos>"]]


def test_unk_is_added_when_train_has_none(tmp_path):
    d = tmp_path / "c"
    d.mkdir()
    for split in ptb.SPLITS:
        (d / f"ptb.{split}.txt").write_text(" x y \n" if split == "train" else " y q \n")
    c = ptb.load_ptb(str(d))
    assert "<unk>" in c.vocab and c.valid.tolist()[1] == c.vocab.index("<unk>")


@pytest.mark.parametrize("world, rows", [(2, 3), (3, 2), (1, 5)])
def test_rank_streams_are_disjoint_contiguous_and_union_is_one_process(world, rows):
    stream = torch.arange(1000)
    shards = [ptb.LMBatches(stream, rows, 7, r, world) for r in range(world)]
    single = ptb.LMBatches(stream, rows * world, 7, 0, 1)
    length = 1000 // (rows * world)
    covered = torch.cat([s.rows.flatten() for s in shards])
    assert covered.tolist() == list(range(length * rows * world))  # disjoint, contiguous, in rank order
    assert all(s.steps_per_epoch == single.steps_per_epoch == (length - 1) // 7 for s in shards)
    for step, (x1, y1) in enumerate(single.batches(0)):
        parts = [next(iter(s.batches(0, step))) for s in shards]
        assert torch.equal(torch.cat([p[0] for p in parts]), x1)
        assert torch.equal(torch.cat([p[1] for p in parts]), y1)
        assert torch.equal(y1, x1 + 1)  # targets: the next token of the stream
        assert x1.shape == (rows * world, 7)


def test_eval_parts_predict_every_token_once():
    stream = torch.arange(101)
    parts = [ptb.eval_part(stream, r, 3) for r in range(3)]
    assert torch.cat([p.targets for p in parts]).tolist() == list(range(1, 101))
    for p in parts:
        assert torch.equal(p.targets, p.inputs + 1)


def test_missing_split_is_named(tmp_path):
    d = write_corpus(tmp_path / "c")
    (d / "ptb.valid.txt").unlink()
    with pytest.raises(DataError, match=r"ptb\.valid\.txt: file not found"):
        ptb.load_ptb(str(d))


def test_empty_file_is_named(tmp_path):
    d = write_corpus(tmp_path / "c")
    (d / "ptb.test.txt").write_text("\n\n")
    with pytest.raises(DataError, match=r"ptb\.test\.txt: no words"):
        ptb.load_ptb(str(d))


def test_missing_directory_is_named(tmp_path):
    with pytest.raises(DataError, match=r"--data-dir .*nope: directory not found"):
        ptb.load_ptb(str(tmp_path / "nope"))


@pytest.mark.heavy
def test_offline_corpus_is_ptb_format_capped_and_cached(tmp_path):
    first = ptb.offline_corpus(str(tmp_path))
    c = ptb.load_ptb(first)
    assert 1000 < len(c.vocab) <= ptb.OFFLINE_VOCAB and "<unk>" in c.vocab and "<eos>" in c.vocab
    assert len(c.train) > 100_000 and len(c.valid) > 5_000 and len(c.test) > 5_000
    train_text = (tmp_path / first / "ptb.train.txt").read_text()
    tokens = train_text.split()
    assert "N" in tokens and all(w == "N" or w == w.lower() for w in tokens)  # PTB: lower case, numbers -> N
    assert ptb.offline_corpus(str(tmp_path)) == first  # built once, then read from the cache
    assert [p.name for p in tmp_path.iterdir()] == [first.rsplit("/", 1)[1]]  # no temporary left behind
    # the cap: words outside the top of the training text become <unk>
    small = tmp_path / "small"
    small.mkdir()
    ptb.write_offline_corpus(str(small), vocab_size=500)
    capped = ptb.load_ptb(str(small))
    assert len(capped.vocab) == 500
    assert (capped.train == capped.vocab.index("<unk>")).float().mean() > 0.05
