"""``python -m lab EXPERIMENT ...``: bench, bench-memory, commbench, commbench-netns, concept-map, gpucheck, paper,
recommend, scaling, scaling-netns, time-to-accuracy."""

from __future__ import annotations

import argparse
import sys


def make_parser() -> argparse.ArgumentParser:
    from . import gpucheck
    from .bench import main as bench
    from .commbench import main as commbench
    from .commbench import netns as commbench_netns
    from .conceptmap import main as concept_map
    from .memory import main as bench_memory
    from .paper import main as paper
    from .recommend import main as recommend
    from .scaling import grid, netns
    from .tta import main as tta

    parser = argparse.ArgumentParser(
        prog="python -m lab", description="Experiments that launch training or exchange jobs and report on them."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    for name, module, run, help_ in (
        (
            "bench",
            bench,
            bench.cmd_bench,
            "throughput of the trainer vs a bare Horovod loop and torch DDP, side by side",
        ),
        (
            "bench-memory",
            bench_memory,
            bench_memory.main,
            "per-rank memory of the ring, the PS (dedicated, colocated) and the sharded stages 1-3 at 1, 2 and 4 "
            "ranks against the ZeRO formula, and a run that fits a per-rank memory limit only sharded -> table, PNG",
        ),
        ("commbench", commbench, commbench.main, "time the gradient exchange alone: Horovod, raw MPI, the PS patterns"),
        (
            "commbench-netns",
            commbench_netns,
            commbench_netns.main,
            "the network model checked alone: commbench on emulated hosts at given link rates vs the alpha-beta model "
            "(root)",
        ),
        (
            "concept-map",
            concept_map,
            concept_map.main,
            "the cost model's map: which communication-reduction concept (fp32, fp16, PowerSGD, local SGD) is "
            "fastest per step by model, link bandwidth and latency, N = 4-256 workers, with measured points -> PNG, "
            "TensorBoard",
        ),
        (
            "scaling",
            grid,
            grid.main,
            "scaling grid: strategies x models x worker counts -> report, plots, TensorBoard, cost model",
        ),
        (
            "paper",
            paper,
            paper.main,
            "Jäger et al. (2018) re-examined: centralized vs decentralized PS vs ring "
            "allreduce on emulated hosts (throughput, speedup, time to quality) -> a verdict "
            "per finding, figure, TensorBoard (root; docs/paper.md)",
        ),
        (
            "recommend",
            recommend,
            recommend.main,
            "which concept reaches a quality target fastest for your model (--model/--task MODULE:CALLABLE) on the "
            "workers and links you give: its compute and gradient measured here, each concept's steps to the target "
            "on 2 emulated hosts (root), the cost model for the rest -> one screen, PNG",
        ),
        (
            "gpucheck",
            gpucheck,
            gpucheck.main,
            "one GPU, one rank: trainer vs bare Horovod (NCCL) vs DDP (NCCL), "
            "LeNet-5/ResNet-18/LSTM -> one table (tools/gpu_check.sh)",
        ),
        (
            "scaling-netns",
            netns,
            netns.main,
            "the scaling grid on emulated hosts (network namespaces, root) at given link rates, beside the cost model",
        ),
        (
            "time-to-accuracy",
            tta,
            tta.main,
            "wall time, steps and epochs to a quality target (test accuracy, "
            "perplexity) per exchange method and worker count",
        ),
    ):
        cmd = sub.add_parser(name, help=help_, description=help_)
        module.add_arguments(cmd)
        cmd.set_defaults(func=run)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = make_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
