"""The GPT example's task: characters of any text file, next-character loss, perplexity.

    python -m launch -np 2 -- --task examples.gpt.task:build --steps 200 --lr 0.003 --no-scale-lr
    python -m launch -np 2 -- --task examples.gpt.task:build --model-arg path=my.txt --model-arg layers=4

Without ``path`` it reads the training split of the Penn-Treebank-format corpus the project
builds offline (Python's documentation; any text file does).
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch.utils.data import Dataset

import allreduce_train

from .model import GPT


class Windows(Dataset):
    """Sample ``i``: ``block`` characters from position ``i * block`` and the same shifted by one.
    Nothing is copied: each sample is a view of the one tensor of the text."""

    def __init__(self, ids: torch.Tensor, block: int) -> None:
        self.ids, self.block = ids, block

    def __len__(self) -> int:
        return (len(self.ids) - 1) // self.block

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        lo = i * self.block
        return self.ids[lo : lo + self.block], self.ids[lo + 1 : lo + self.block + 1]


class CharGPT(allreduce_train.Task):
    """Next-character prediction over a text file; the last tenth is the evaluation text."""

    def __init__(
        self,
        path: str = "",
        block: int = 64,
        dim: int = 96,
        layers: int = 2,
        heads: int = 4,
        dropout: float = 0.0,
        max_chars: int = 0,
    ) -> None:
        super().__init__()
        if not path:  # the project's offline PTB-format corpus (built on first use)
            import os

            from allreduce_train.data.ptb import offline_corpus

            path = os.path.join(offline_corpus(), "ptb.train.txt")
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
        if max_chars:
            text = text[:max_chars]
        self.chars = sorted(set(text))
        index = {c: i for i, c in enumerate(self.chars)}
        self.ids = torch.tensor([index[c] for c in text], dtype=torch.long)
        self.block = block
        self.dims: dict[str, Any] = dict(dim=dim, layers=layers, heads=heads, dropout=dropout)
        self.words_per_sample = block  # characters per sample: the words/s figure counts characters
        self.note = f"data: {path} ({len(text)} characters, {len(self.chars)} distinct)"

    def build_model(self) -> GPT:
        return GPT(len(self.chars), self.block, **self.dims)

    def datasets(self) -> tuple[Windows, Windows]:
        cut = len(self.ids) * 9 // 10
        return Windows(self.ids[:cut], self.block), Windows(self.ids[cut:], self.block)

    def loss(self, model: GPT, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        logits = model(inputs)  # (B, T, vocab)
        return F.cross_entropy(logits.flatten(0, 1), targets.flatten())

    def eval_sums(self, model: GPT, inputs: torch.Tensor, targets: torch.Tensor) -> dict[str, float]:
        logits = model(inputs)
        return {
            "loss": F.cross_entropy(logits.flatten(0, 1), targets.flatten(), reduction="sum").item(),
            "chars": targets.numel(),
        }

    def eval_metrics(self, sums: dict[str, float]) -> dict[str, float]:
        loss = sums["loss"] / sums["chars"]
        return {"loss": loss, "perplexity": math.exp(min(loss, 700.0))}


def build(**kwargs) -> CharGPT:
    """``--task examples.gpt.task:build``; keyword arguments from ``--model-arg``."""
    return CharGPT(**kwargs)
