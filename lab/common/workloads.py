"""The trainer's first step as a plain function, shared by the loops that are timed beside it
(lab/common/baselines.py: bench's and gpucheck's): the same batch, the same loss, so their speeds compare equal work."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from models import MODELS


def first_batch(model: str, batch_size: int, synthetic_samples: int, seed: int, rank: int, size: int):
    """This rank's share of the trainer's first global batch on the synthetic dataset."""
    from allreduce_train.data.images import ShardedBatches, synthetic
    from allreduce_train.data.ptb import LMBatches, synthetic_lm

    spec = MODELS[model]
    if spec.task == "lm":  # the first window of bptt tokens of this rank's rows of the stream
        corpus = synthetic_lm(spec.num_classes, spec.bptt, synthetic_samples, seed)
        return next(LMBatches(corpus.train, batch_size, spec.bptt, rank, size).batches(0))
    train_set, _ = synthetic(spec.input_shape, spec.num_classes, synthetic_samples, seed)
    return next(ShardedBatches(train_set, batch_size, rank, size, seed).batches(0))


def loss_of(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """The trainer's loss on its first step: cross-entropy over classes, or over every next token
    of a window for a language model (whose hidden state starts at zero)."""
    out = model(x)
    if isinstance(out, tuple):  # language model: (logits (B, T, V), hidden)
        return F.cross_entropy(out[0].flatten(0, 1), y.flatten())
    return F.cross_entropy(out, y)
