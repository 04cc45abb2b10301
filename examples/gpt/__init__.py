"""A user's own small GPT-style language model, trained by the trainer through ``--task``."""
