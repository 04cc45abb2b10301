"""Hugging Face's GPT-2 under the trainer: ``transformers.GPT2LMHeadModel``, built from a small
``GPT2Config``, on the characters of a text file (examples/gpt's data, unchanged).

    python -m launch -np 2 -- --task examples.hf_gpt2.task:build --optimizer adamw --lr-schedule cosine \\
        --precision bf16-mixed --steps 200

What differs from a model written here, and why it needs nothing of the trainer:

- the input and output embeddings are tied (``lm_head.weight`` *is* ``transformer.wte.weight``):
  ``parameters()`` yields the one tensor once, so it is exchanged, updated and sharded once; the
  ``state_dict`` still names it twice, as Hugging Face's own loader expects;
- the forward pass returns a ``CausalLMOutputWithCrossAttentions``, not a tensor: the loss reads its
  ``.logits`` (and computes the loss itself: the targets are already shifted by one, so passing
  ``labels=`` would shift them again).

Nothing is downloaded: the model is built from a config (never ``from_pretrained``) and the
vocabulary is the text's characters (no tokenizer), so no ``HF_HUB_OFFLINE`` is needed.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from transformers import GPT2Config, GPT2LMHeadModel

import allreduce_train
from examples.gpt.task import CharGPT, Windows


class HFGPT2(allreduce_train.Task):
    """Next-character prediction with Hugging Face's GPT-2 as the model; the text, its split and its
    windows are examples/gpt's. ``dim``: ``n_embd``, ``layers``: ``n_layer``, ``heads``: ``n_head``;
    ``n_positions`` is the window (``block``)."""

    def __init__(
        self,
        path: str = "",
        block: int = 64,
        dim: int = 64,
        layers: int = 2,
        heads: int = 4,
        dropout: float = 0.0,
        max_chars: int = 0,
    ) -> None:
        super().__init__()
        self.text = CharGPT(path=path, block=block, max_chars=max_chars)  # the characters, as ids
        self.words_per_sample = block  # characters per sample: the words/s figure counts characters
        self.note = self.text.note
        self.config = GPT2Config(
            vocab_size=len(self.text.chars),
            n_positions=block,
            n_embd=dim,
            n_layer=layers,
            n_head=heads,
            resid_pdrop=dropout,
            embd_pdrop=dropout,
            attn_pdrop=dropout,
            tie_word_embeddings=True,
            # GPT-2's token ids 50256 lie outside a vocabulary of characters; no token is special here
            bos_token_id=None,
            eos_token_id=None,
        )

    def build_model(self) -> GPT2LMHeadModel:
        return GPT2LMHeadModel(self.config)  # initialised from torch's RNG, which the trainer seeds alike on every rank

    def datasets(self) -> tuple[Windows, Windows]:
        return self.text.datasets()

    def logits(self, model: GPT2LMHeadModel, inputs: torch.Tensor) -> torch.Tensor:
        """(B, T, vocab) in float32: the model's output object holds them in ``.logits`` (bf16 under
        autocast; the cross-entropy is taken in float32)."""
        return model(input_ids=inputs).logits.float()

    def loss(self, model: GPT2LMHeadModel, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(self.logits(model, inputs).flatten(0, 1), targets.flatten())

    def eval_sums(self, model: GPT2LMHeadModel, inputs: torch.Tensor, targets: torch.Tensor) -> dict[str, float]:
        logits = self.logits(model, inputs)
        return {
            "loss": F.cross_entropy(logits.flatten(0, 1), targets.flatten(), reduction="sum").item(),
            "chars": targets.numel(),
        }

    def eval_metrics(self, sums: dict[str, float]) -> dict[str, float]:
        loss = sums["loss"] / sums["chars"]
        return {"loss": loss, "perplexity": math.exp(min(loss, 700.0))}


def build(**kwargs) -> HFGPT2:
    """``--task examples.hf_gpt2.task:build``; keyword arguments from ``--model-arg`` (``dim=``,
    ``layers=``, ``heads=``, ``block=``, ``max_chars=``, ``path=``, ``dropout=``)."""
    return HFGPT2(**kwargs)
