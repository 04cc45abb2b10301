"""Command line: ``python -m allreduce_train train|models|export ...`` (also the ``allreduce-train`` script).

Parse, then hand over: ``train`` is the job's core (job.py: the prologue, the run, the faults and
their exit codes), as :func:`allreduce_train.fit` is. Every rank parses the same argv, so a usage
error fails every rank alike and only rank 0 speaks (exit 2).
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import NoReturn

from . import __version__, job
from .config import add_arguments
from .distributed.mpi import launched_as
from .errors import EXIT_ERROR, EXIT_USAGE, UserError, record_exit
from .job import fail


def cmd_train(args: argparse.Namespace) -> int:
    return job.run(job.configure(args))[0]


def _as_flag(name: str, value: object) -> str:
    """A config value as the command line would give it: ``--grad-clip 0.25``, ``--no-scale-lr``."""
    flag = name.replace("_", "-")
    if isinstance(value, bool):
        return f"--{flag}" if value else f"--no-{flag}"
    return f"--{flag} {value:g}" if isinstance(value, float) else f"--{flag} {value}"


def cmd_models(args: argparse.Namespace) -> int:
    from models import MODELS, count_parameters

    for name, spec in sorted(MODELS.items()):
        print(f"{name:20s} {count_parameters(spec.build()):>12,d} params  input {spec.input_shape}  {spec.description}")
        if spec.defaults:  # what --model NAME sets unless told otherwise
            print(f"{'':20s} defaults: " + " ".join(_as_flag(k, v) for k, v in spec.defaults.items()))
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from .checkpoint import export

    try:
        done = export(args.source, args.out)
    except UserError as e:
        return fail(str(e))
    step = f", step {done['step']}" if done["step"] is not None else ""
    print(f"{args.out}: {done['tensors']} tensors, {done['bytes'] / 2**20:.2f} MiB, from {done['path']}{step}")
    return 0


class _Parser(argparse.ArgumentParser):
    """Usage errors are printed by rank 0 only: every rank parses the same argv and fails alike."""

    def error(self, message: str) -> NoReturn:
        if launched_as().rank == 0:
            self.print_usage(sys.stderr)
            print(f"{self.prog}: error: {message}", file=sys.stderr)
        else:
            time.sleep(2.0)  # see job.fail_before_init
        raise SystemExit(EXIT_USAGE)


def make_parser() -> _Parser:
    parser = _Parser(
        prog="allreduce_train",
        description="Data-parallel PyTorch training: ring allreduce (Horovod) or a parameter server behind "
        "one trainer. Launch with `python -m launch -np N -- ARGS` or mpirun. Experiments (bench, "
        "scaling, commbench): `python -m lab --help`.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    train = sub.add_parser("train", help="train a model (run under mpirun for several ranks)")
    add_arguments(train)
    train.set_defaults(func=cmd_train)
    models = sub.add_parser("models", help="list the registered models")
    models.set_defaults(func=cmd_models)
    export = sub.add_parser(
        "export",
        help="write a run's model weights as a plain state_dict for PyTorch (or safetensors)",
        description="Write the model weights of a run directory (its checkpoint.pt) or a checkpoint file as a "
        "plain state_dict: model.load_state_dict(torch.load(FILE, weights_only=True)) takes it without this "
        "project (docs/own_model.md). Tensors on the CPU, contiguous; tied weights under each name as torch's "
        "state_dict has them. FILE.safetensors is written in that format (needs the safetensors package).",
    )
    export.add_argument("source", metavar="RUN_DIR|CHECKPOINT", help="a run directory or a checkpoint file")
    export.add_argument("--out", required=True, metavar="FILE", help="FILE.pt (or .pth, ...) or FILE.safetensors")
    export.set_defaults(func=cmd_export)
    return parser


def main(argv: list[str] | None = None) -> int:
    code = EXIT_ERROR  # what an exception escaping from here means
    try:
        args = make_parser().parse_args(argv)
        code = args.func(args)
        return code
    except SystemExit as e:
        code = 0 if e.code is None else e.code if isinstance(e.code, int) else EXIT_ERROR  # as Python exits
        raise
    finally:
        record_exit(launched_as().rank, code)  # for the launcher's bound on ending the job (docs/faults.md)
