"""Training data: :mod:`.images` (Fashion-MNIST idx files, synthetic tensors, per-worker shards) and
:mod:`.ptb` (Penn-Treebank-format text, the offline corpus, token streams for language models)."""
