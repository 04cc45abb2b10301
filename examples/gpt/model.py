"""A small GPT-style transformer language model (nanoGPT's shape, a few hundred thousand parameters).

Plain torch: it knows nothing about distribution, like a model in any user's package.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    """Pre-norm transformer block: causal self-attention, then an MLP, each on a residual."""

    def __init__(self, dim: int, heads: int, dropout: float) -> None:
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape  # (B, T, C)
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
        # (B, T, C) -> (B, heads, T, C / heads)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=self.drop.p if self.training else 0.0)
        x = x + self.drop(self.proj(y.transpose(1, 2).reshape(b, t, c)))
        return x + self.drop(self.mlp(self.ln2(x)))


class GPT(nn.Module):
    """Token ids (B, T) -> next-token logits (B, T, vocab)."""

    def __init__(
        self,
        vocab_size: int,
        block_size: int = 64,
        dim: int = 96,
        layers: int = 2,
        heads: int = 4,
        dropout: float = 0.0,
    ) -> None:
        super().__init__()
        if dim % heads:
            raise ValueError(f"dim {dim} is not a multiple of heads {heads}")
        self.block_size = block_size
        self.tok = nn.Embedding(vocab_size, dim)
        self.pos = nn.Embedding(block_size, dim)
        self.blocks = nn.Sequential(*(Block(dim, heads, dropout) for _ in range(layers)))
        self.ln = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab_size, bias=False)
        self.head.weight = self.tok.weight  # tied embeddings (Press & Wolf 2017), as nanoGPT
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, std=0.02)
            if isinstance(m, nn.Linear) and m.bias is not None:
                nn.init.zeros_(m.bias)
        for block in self.blocks:  # scaled residual projections (GPT-2)
            assert isinstance(block, Block)
            nn.init.normal_(block.proj.weight, std=0.02 / math.sqrt(2 * layers))

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        t = idx.shape[1]
        x = self.tok(idx) + self.pos(torch.arange(t, device=idx.device))  # (B, T, C)
        return self.head(self.ln(self.blocks(x)))  # (B, T, vocab)
