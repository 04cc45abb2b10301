"""``python -m allreduce_train.experiments bench|commbench|scaling|scaling-netns ...``"""

from __future__ import annotations

import argparse
import sys


def make_parser() -> argparse.ArgumentParser:
    from .bench.main import add_arguments as bench_args
    from .commbench.main import add_arguments as commbench_args
    from .scaling.grid import add_arguments as scaling_args
    from .scaling.netns import add_arguments as netns_args

    parser = argparse.ArgumentParser(prog="python -m allreduce_train.experiments",
                                     description="Experiments that launch training or exchange jobs and report on them.")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, add, help_ in (
        ("bench", bench_args, "throughput of the trainer vs a bare Horovod loop and torch DDP, side by side"),
        ("commbench", commbench_args, "time the gradient exchange alone: Horovod, raw MPI, the PS patterns"),
        ("scaling", scaling_args, "scaling grid: strategies x models x worker counts -> report, plots, TensorBoard, "
                                  "cost model"),
        ("scaling-netns", netns_args, "the scaling grid on emulated hosts (network namespaces, root) at given link "
                                      "rates, beside the cost model"),
    ):
        add(sub.add_parser(name, help=help_, description=help_))
    return parser


def main(argv: list[str] | None = None) -> int:
    args = make_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
