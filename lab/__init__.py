"""The lab: what measures and emulates, built on the product (docs/layout.md).

``python -m lab bench|commbench|commbench-netns|concept-map|gpucheck|scaling|scaling-netns|time-to-accuracy``;
one folder (or module) per experiment, each independent of its siblings; what two of them share lives in
``lab/common`` (jobs, cost model, TensorBoard, plots, ...) and ``lab/emulation`` (hosts as network
namespaces: ``python -m lab.emulation``, the emulated Slurm cluster, the link probes).
One-way rule (torchtitan's): the lab imports the product (``allreduce_train``, ``launch``, ``models``);
the product never imports the lab (tests/unit/test_layout.py checks it, and that no experiment imports
another). Per-rank programs are modules (``lab.bench.rank``, ``lab.commbench.rank``) that the launcher
starts with ``--module``.
"""
