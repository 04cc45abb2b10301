"""The LSTM language models of Zaremba, Sutskever & Vinyals 2014, "Recurrent Neural Network Regularization".

The seed paper's second workload is the "small" configuration: a 10 k-word vocabulary, 200-unit
embeddings, 2 LSTM layers of 200 units, a 10 k-way softmax, 20 unrolled steps, batch 20, no
dropout: 4.65 M parameters, 86 % of them in the embedding and the softmax. So per step it moves
many parameter bytes for little arithmetic, the opposite of a convolutional network. "Medium" has
650 units, 35 steps and dropout 0.5 on the non-recurrent connections (19.8 M parameters).

Training uses truncated backpropagation through time: the caller passes the hidden state of the
previous batch in (detached) and gets the new one back, so the model stays a plain ``nn.Module``.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from . import ModelSpec, register

PTB_VOCAB = 10_000

Hidden = tuple[torch.Tensor, torch.Tensor]  # (h, c), each (layers, B, hidden)


class LSTMLanguageModel(nn.Module):
    def __init__(
        self,
        vocab_size: int = PTB_VOCAB,
        hidden: int = 200,
        layers: int = 2,
        dropout: float = 0.0,
        init_range: float = 0.1,
    ) -> None:
        super().__init__()
        self.layers, self.hidden = layers, hidden
        self.embedding = nn.Embedding(vocab_size, hidden)
        self.drop = nn.Dropout(dropout)
        # Zaremba's dropout acts only between layers, never on the recurrent connections;
        # nn.LSTM's own dropout does exactly that between its stacked layers.
        self.lstm = nn.LSTM(hidden, hidden, num_layers=layers, dropout=dropout if layers > 1 else 0.0, batch_first=True)
        self.decoder = nn.Linear(hidden, vocab_size)  # no weight tying: the 2014 models had none
        for p in self.parameters():  # the paper: every parameter uniform in [-init_range, init_range]
            nn.init.uniform_(p, -init_range, init_range)

    def init_hidden(self, batch: int, device: torch.device | str = "cpu") -> Hidden:
        zeros = torch.zeros(self.layers, batch, self.hidden, device=device)
        return zeros, zeros.clone()

    def forward(self, tokens: torch.Tensor, hidden: Hidden | None = None) -> tuple[torch.Tensor, Hidden]:
        """tokens (B, T) -> logits (B, T, vocab) and the hidden state after the last step."""
        if hidden is None:
            hidden = self.init_hidden(tokens.shape[0], tokens.device)
        x = self.drop(self.embedding(tokens))  # (B, T, H)
        out, hidden = self.lstm(x, hidden)  # (B, T, H)
        return self.decoder(self.drop(out)), hidden


def zaremba_recipe(bptt: int, epochs: int, full_epochs: int, decay: float) -> dict:
    """The paper's training settings, applied unless the file or the command line says otherwise.

    Zaremba (and TensorFlow's PTB tutorial) minimise the cross-entropy summed over the ``bptt``
    unrolled steps and averaged over the batch, with SGD at lr 1.0 (no momentum) and the gradient
    clipped to global norm 5. The trainer averages over all tokens, a gradient ``bptt`` times
    smaller, so the same updates take lr ``bptt`` and a clip of ``5 / bptt`` (for the small model
    lr 20, clip 0.25, which is also PyTorch's word_language_model example). The paper's schedule:
    ``epochs`` in all, the first ``full_epochs`` at that LR, then the LR multiplied by ``decay`` after
    every epoch (small: 13 epochs, halved after epoch 4; medium: 39 epochs, divided by 1.2 after
    epoch 6). The LR is not scaled by the worker count: every step makes the paper's update, on a
    global batch W times larger.
    """
    return {
        "dataset": "ptb",
        "batch_size": 20,
        "lr": 1.0 * bptt,
        "momentum": 0.0,
        "grad_clip": 5.0 / bptt,
        "scale_lr": False,
        "eval_batch_size": 10,
        "epochs": epochs,
        "lr_decay": decay,
        "lr_decay_after": full_epochs,
    }


register(
    ModelSpec(
        name="ptb-lstm-small",
        build=lambda vocab_size=PTB_VOCAB: LSTMLanguageModel(
            vocab_size, hidden=200, layers=2, dropout=0.0, init_range=0.1
        ),
        input_shape=(20,),
        num_classes=PTB_VOCAB,
        description="Zaremba et al. 2014 small LSTM LM: 2x200, 20 steps, 4.65 M parameters with 10 k words "
        "(seed paper)",
        task="lm",
        defaults=zaremba_recipe(20, epochs=13, full_epochs=4, decay=0.5),
    )
)

register(
    ModelSpec(
        name="ptb-lstm-medium",
        build=lambda vocab_size=PTB_VOCAB: LSTMLanguageModel(
            vocab_size, hidden=650, layers=2, dropout=0.5, init_range=0.05
        ),
        input_shape=(35,),
        num_classes=PTB_VOCAB,
        description="Zaremba et al. 2014 medium LSTM LM: 2x650, 35 steps, dropout 0.5, 19.8 M parameters",
        task="lm",
        defaults=zaremba_recipe(35, epochs=39, full_epochs=6, decay=1 / 1.2),
    )
)
