"""Penn-Treebank-format text for the LSTM language models: reader, offline corpus, per-rank batches.

The format (Mikolov's ``simple-examples`` release used by Zaremba et al. 2014): three files
``ptb.train.txt``, ``ptb.valid.txt``, ``ptb.test.txt``, one sentence per line, tokens separated by
whitespace, rare words already replaced by ``<unk>``. Reading appends ``<eos>`` to every line and
takes the vocabulary from the training file, so the real PTB gives its 10,000 words.

The real PTB is licensed by the LDC and cannot be shipped, so ``--data-dir`` takes a user's copy
as it is. Without one, :func:`offline_corpus` writes a corpus in the same format from English text
that every Python installation has (the documentation in ``pydoc_data`` and the standard
library's docstrings), capped to 10,000 words. Its perplexities are NOT comparable with the
paper's: different text, a quarter of PTB's size.

Sharding for data parallelism (as in Zaremba's ``batchify``): the training stream is cut into
``W*B`` equal rows and rank ``r`` takes rows ``[r*B, (r+1)*B)``, a disjoint contiguous part of the
stream. One process with batch ``W*B`` therefore sees exactly the union of what W ranks see.
"""

from __future__ import annotations

import ast
import collections
import os
import re
import shutil
import sys
import sysconfig
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from ..errors import DataError

SPLITS = ("train", "valid", "test")
EOS, UNK = "<eos>", "<unk>"
OFFLINE_VOCAB = 10_000  # PTB's size, <eos> and <unk> included
OFFLINE_VERSION = 2  # bump when the builder's output changes, so caches are rebuilt


def split_path(data_dir: str, split: str) -> str:
    return os.path.join(data_dir, f"ptb.{split}.txt")


def read_words(path: str) -> list[str]:
    """The tokens of one PTB-format file, ``<eos>`` after every line."""
    try:
        with open(path, encoding="utf-8") as fh:
            words = [w for line in fh for w in (*line.split(), EOS)]
    except FileNotFoundError:
        raise DataError(
            f"{path}: file not found; --data-dir must hold ptb.train.txt, ptb.valid.txt and "
            "ptb.test.txt (Penn Treebank format), or leave --data-dir empty for the offline corpus"
        ) from None
    except UnicodeDecodeError as e:
        raise DataError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start}); expected PTB-format text") from None
    except OSError as e:
        raise DataError(f"{path}: cannot read ({e.strerror})") from None
    if len(words) == sum(w == EOS for w in words):
        raise DataError(f"{path}: no words in the file; expected one sentence per line (Penn Treebank format)")
    return words


@dataclass
class Corpus:
    """The vocabulary (index -> word) and the three splits as 1-D tensors of word ids."""

    vocab: list[str]
    train: torch.Tensor
    valid: torch.Tensor
    test: torch.Tensor


def build_vocab(words: list[str]) -> list[str]:
    """Most frequent first, ties by spelling: the same ids on every rank and every run."""
    counts = collections.Counter(words)
    counts.setdefault(UNK, 0)  # words of valid/test unseen in train map here
    return sorted(counts, key=lambda w: (-counts[w], w))


def load_ptb(data_dir: str) -> Corpus:
    if not os.path.isdir(data_dir):
        raise DataError(
            f"--data-dir {data_dir}: directory not found; give a directory with ptb.train.txt, "
            "ptb.valid.txt, ptb.test.txt, or leave --data-dir empty for the offline corpus"
        )
    splits = {s: read_words(split_path(data_dir, s)) for s in SPLITS}
    vocab = build_vocab(splits["train"])
    index = {w: i for i, w in enumerate(vocab)}
    unk = index[UNK]
    ids = {s: torch.tensor([index.get(w, unk) for w in words], dtype=torch.long) for s, words in splits.items()}
    return Corpus(vocab, ids["train"], ids["valid"], ids["test"])


class LMBatches:
    """This rank's rows of the batchified training stream, cut into windows of ``bptt`` tokens.

    Same interface as :class:`allreduce_train.data.ShardedBatches`. The order is the same every
    epoch: the hidden state carried from one window to the next needs the text in sequence.
    """

    def __init__(self, stream: torch.Tensor, batch_size: int, bptt: int, rank: int, num_shards: int) -> None:
        self.batch_size, self.bptt = batch_size, bptt
        self.global_batch = batch_size * num_shards
        length = len(stream) // self.global_batch
        rows = stream[: length * self.global_batch].view(self.global_batch, length)  # (W*B, L)
        self.rows = rows[rank * batch_size : (rank + 1) * batch_size]  # (B, L): contiguous tokens of the stream
        self.steps_per_epoch = max(0, length - 1) // bptt  # targets are inputs shifted by one

    def sample_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The first batch (the trainer's check of the model and the loss)."""
        return next(self.batches(0))

    def batches(self, epoch: int, start_step: int = 0):
        """Yield (inputs, targets), each (B, bptt), for steps ``start_step ..`` of an epoch."""
        for step in range(start_step, self.steps_per_epoch):
            lo = step * self.bptt
            yield self.rows[:, lo : lo + self.bptt], self.rows[:, lo + 1 : lo + self.bptt + 1]


@dataclass
class EvalStream:
    """One rank's part of an evaluation stream: predict ``targets[i]`` from ``inputs[..i]``."""

    inputs: torch.Tensor
    targets: torch.Tensor

    def __len__(self) -> int:
        return len(self.targets)

    def batches(self, batch_size: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """The part as ``batch_size`` parallel streams (rows of equal length) and the tail that does not
        fill a row as one more stream: (inputs, targets) blocks of shape (rows, length), every token once."""
        n = len(self)
        rows = max(1, min(batch_size, n))
        length = n // rows
        yield self.inputs[: rows * length].view(rows, length), self.targets[: rows * length].view(rows, length)
        if rows * length < n:
            yield self.inputs[rows * length :].view(1, -1), self.targets[rows * length :].view(1, -1)


def eval_part(stream: torch.Tensor, rank: int, num_shards: int) -> EvalStream:
    """Disjoint contiguous parts; together they predict every token after the first exactly once."""
    n = len(stream) - 1
    lo, hi = n * rank // num_shards, n * (rank + 1) // num_shards
    return EvalStream(stream[lo:hi], stream[lo + 1 : hi + 1])


def synthetic_lm(vocab_size: int, bptt: int, samples: int, seed: int) -> Corpus:
    """Random token ids: ``samples`` training windows of ``bptt`` tokens, no I/O, for benchmarks."""
    g = torch.Generator().manual_seed(seed)
    n = samples * bptt + 1
    train = torch.randint(0, vocab_size, (n,), generator=g)
    held_out = train[: max(2, n // 10)]
    return Corpus([str(i) for i in range(vocab_size)], train, held_out, held_out)


# ---------------------------------------------------------------------------- offline corpus

_WORD = re.compile(r"[a-z]+(?:'[a-z]+)?|[0-9]+(?:[.,][0-9]+)*")
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")
_SKIP_DIRS = {
    "site-packages",
    "dist-packages",
    "test",
    "tests",
    "idlelib",
    "lib2to3",
    "__pycache__",
    "turtledemo",
    "ensurepip",
}


def _documents() -> list[tuple[str, str]]:
    """(name, text) of every English text source, in a fixed order."""
    import pydoc_data.topics

    docs = [(f"topic:{k}", v) for k, v in sorted(pydoc_data.topics.topics.items())]
    root = sysconfig.get_paths()["stdlib"]
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in _SKIP_DIRS)
        for name in sorted(f for f in filenames if f.endswith(".py")):
            path = os.path.join(dirpath, name)
            try:
                with open(path, encoding="utf-8") as fh:
                    tree = ast.parse(fh.read())  # parsed, never imported or run
            except (SyntaxError, UnicodeDecodeError, ValueError, OSError):
                continue
            text = "\n\n".join(
                d
                for node in ast.walk(tree)
                if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                and (d := ast.get_docstring(node))
            )
            if text:
                docs.append((os.path.relpath(path, root), text))
    return docs


def _sentences(text: str) -> list[list[str]]:
    """Prose only: indented blocks (code, grammar) and heading underlines are dropped;
    lower case, numbers become ``N`` as in PTB."""
    out = []
    for para in re.split(r"\n\s*\n", text):
        lines = para.split("\n")
        if any(ln[:1].isspace() or ln.startswith(">>>") for ln in lines):
            continue
        prose = " ".join(ln for ln in lines if not re.fullmatch(r"[*=~^\-+#]{3,}", ln.strip()))
        for sentence in _SENTENCE_END.split(prose.lower()):
            words = ["N" if w[0].isdigit() else w for w in _WORD.findall(sentence)]
            if len(words) >= 3:
                out.append(words)
    return out


def write_offline_corpus(out_dir: str, vocab_size: int = OFFLINE_VOCAB) -> None:
    """Write ptb.{train,valid,test}.txt: documents in a fixed order, every 20th to valid (offset 18)
    and test (offset 19). As in PTB, rare words are <unk>: those seen once in the training text,
    and any beyond the ``vocab_size`` most frequent, so the model also learns to predict <unk>."""
    parts: dict[str, list[list[str]]] = {s: [] for s in SPLITS}
    for i, (_, text) in enumerate(_documents()):
        parts["valid" if i % 20 == 18 else "test" if i % 20 == 19 else "train"] += _sentences(text)
    counts = collections.Counter(w for s in parts["train"] for w in s)
    ranked = sorted((kv for kv in counts.items() if kv[1] >= 2), key=lambda kv: (-kv[1], kv[0]))
    keep = {w for w, _ in ranked[: vocab_size - 2]}  # + <unk>, <eos>
    for split, sentences in parts.items():
        with open(split_path(out_dir, split), "w", encoding="utf-8") as fh:
            for s in sentences:
                fh.write(" " + " ".join(w if w in keep else UNK for w in s) + " \n")  # PTB's spacing


def cache_root() -> str:
    return os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "allreduce_train")


def offline_corpus(cache_dir: str | None = None) -> str:
    """The directory of the offline corpus, built on first use.

    Every rank may call this at once: each builds into its own temporary directory and renames it
    into place; the first rename wins and the others discard theirs, so nobody reads a half-written
    file. The name carries the Python version because the source text comes with it.
    """
    v = sys.version_info
    final = os.path.join(cache_dir or cache_root(), f"corpus-pydoc-py{v.major}.{v.minor}.{v.micro}-v{OFFLINE_VERSION}")
    if os.path.isdir(final):
        return final
    parent = os.path.dirname(final)
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=".corpus-", dir=parent)
    os.chmod(tmp, 0o755)  # a shared cache, not a secret (mkdtemp makes it 0700)
    try:
        write_offline_corpus(tmp)
        os.rename(tmp, final)
    except OSError:
        if not os.path.isdir(final):
            raise
    finally:
        if os.path.isdir(tmp):
            shutil.rmtree(tmp)
    return final


if __name__ == "__main__":  # `python -m allreduce_train.data.ptb` builds the offline corpus, prints where
    print(offline_corpus())
