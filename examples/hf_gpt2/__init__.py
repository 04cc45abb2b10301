"""Hugging Face's GPT-2 (``transformers.GPT2LMHeadModel``), a model from a library, trained by the trainer
through ``--task``."""
