"""Experiments built on the trainer: ``bench``, ``commbench``, ``gpucheck``, ``scaling``, ``scaling-netns``.

One-way rule (torchtitan's): modules here import the core (``allreduce_train.*``, ``launch``,
``models``); nothing in the core imports from here (tests/unit/test_layout.py checks it).
Run them with ``python -m lab COMMAND``; their per-rank programs are
modules (``...bench.rank``, ``...commbench.rank``) that the launcher starts with ``--module``.
"""
