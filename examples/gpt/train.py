"""The GPT example from a user's own script, through allreduce_train.fit (the trainer's own loop):

    python -m launch -np 2 --script examples/gpt/train.py -- --steps 200 --block 64

Every rank runs this file. ``--path``, ``--block``, ``--layers``, ``--max-chars`` are this script's;
every other flag is the trainer's (``--strategy ps``, ``--compression fp16``, ``--resume auto``, ...).
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # examples/, for `gpt`

from gpt.task import CharGPT

import allreduce_train


def main(argv: list[str]) -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--path", default="", help="a text file (default: the project's offline PTB-format corpus)")
    p.add_argument("--block", type=int, default=64, help="characters per sample")
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--max-chars", type=int, default=0, help="read only this much of the text (0 = all)")
    mine, trainer_flags = p.parse_known_args(argv)
    task = CharGPT(path=mine.path, block=mine.block, layers=mine.layers, max_chars=mine.max_chars)
    # keyword settings are this script's defaults, the transformer recipe (examples/gpt/recipe.toml's):
    # AdamW with decay on the matrices only, a cosine after a short warm-up, bf16 autocast. The command
    # line's trainer flags override them (--optimizer sgd --lr-schedule step --precision 32: the 2014 recipe).
    result = allreduce_train.fit(
        task=task,
        argv=trainer_flags,
        optimizer="adamw",
        lr=0.002,
        betas="0.9,0.95",
        weight_decay=0.1,
        decay_norm_bias=False,
        lr_schedule="cosine",
        warmup_steps=10,
        min_lr=0.0002,
        grad_clip=1.0,
        precision="bf16-mixed",
        batch_size=16,
    )
    if result is not None:  # the main rank's result; the other ranks get None
        print(f"eval loss {result['final']['eval_loss']:.3f} after {result['steps']} steps -> {result['run_dir']}")


if __name__ == "__main__":
    main(sys.argv[1:])
