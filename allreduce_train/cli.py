"""Command line: ``python -m allreduce_train train|models|export ...`` (also the ``allreduce-train`` script).

Parse -> build -> run -> close. Bad input ends every rank with one error line and exit code 2:
configuration is checked before any process group forms (every rank parses the same argv, so
every rank fails alike and only rank 0 speaks); set-up errors (data files, checkpoint) are agreed
on by all ranks in one collective so that the lowest failing rank reports and nobody waits on a
peer that gave up; anything that fails once training runs aborts the whole MPI job. Faults have
their own exit codes (launch/exitcodes.py, docs/faults.md): divergence 65, a stall 69, preemption 75.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import time
import traceback
from typing import TYPE_CHECKING

from . import __version__
from .config import add_arguments, build_config
from .errors import (
    EXIT_DIVERGED,
    EXIT_ERROR,
    EXIT_INTERRUPTED,
    EXIT_PREEMPTED,
    EXIT_STALLED,
    EXIT_USAGE,
    Diverged,
    Preempted,
    Stalled,
    UserError,
    record_exit,
)

if TYPE_CHECKING:
    from .watchdog import Watchdog


def env_rank() -> int:
    """The global rank from the launcher's environment, before any process group exists."""
    for var in ("OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "HOROVOD_RANK"):
        if var in os.environ:
            return int(os.environ[var])
    return 0


def fail_before_init(msg: str) -> int:
    """An error every rank hits alike before any process group exists: rank 0 says it once.

    The other ranks linger a moment before exiting: mpirun ends the whole job as soon as one rank
    exits non-zero, and rank 0 must have printed the line by then.
    """
    if env_rank() == 0:
        return fail(msg)
    time.sleep(2.0)
    return EXIT_USAGE


def fail(msg: str) -> int:
    print(f"allreduce_train: error: {msg}", file=sys.stderr, flush=True)
    return EXIT_USAGE


def default_run_name(cfg, world: int) -> str:
    return f"{cfg.model.label}-{cfg.exchange.strategy}-np{world}-{time.strftime('%Y%m%d-%H%M%S')}"


def cmd_train(args: argparse.Namespace) -> int:
    from . import preempt
    from .memory import keep_freed_memory

    preempt.install()  # first: a stop signal from now on means finish the step, checkpoint, exit 75

    try:
        keep_freed_memory()  # before the data and the model are allocated (docs/performance.md)
        cfg = build_config(args)
    except UserError as e:
        return fail_before_init(str(e))
    return run_job(cfg)[0]


def run_job(cfg, task=None) -> tuple[int, dict | None]:
    """One training job on this rank, from forming the process group to leaving it: (exit code,
    the run's result on a worker that finished, else None). ``task``: a user's Task object
    (:func:`allreduce_train.fit`); else the configuration names the task. Faults end as the
    command line's do: one line from the lowest failing rank, or the whole job aborted."""
    from .distributed import create_exchange

    try:
        ex = create_exchange(cfg)
    except UserError as e:
        return fail_before_init(str(e)), None

    from .run_logger import RunLogger
    from .trainer import Trainer, config_text
    from .watchdog import Watchdog

    held = _Held(ex)
    try:
        with held:
            # Every rank must agree on the run directory; rank 0's clock names it.
            name = ex.broadcast_object(cfg.run.name or default_run_name(cfg, ex.size))  # communication
            run_dir = os.path.join(cfg.run.run_dir, name)
            trainer = Trainer(cfg, ex, run_dir, task)
            err = None
            made = False  # by this job: a set-up error leaves no empty run directory behind
            try:
                if ex.is_main:
                    made = not os.path.isdir(run_dir)
                    os.makedirs(run_dir, exist_ok=True)
                setup = trainer.build()
            except UserError as e:
                err = str(e)
            except OSError as e:
                err = f"{e.filename or run_dir}: {e.strerror}"
            errors, hosts = _gather_setup(ex, err)
            if (
                cfg.run.expect_hosts
            ):  # the launcher's placement, checked on every rank alike (allreduce_train/placement.py)
                from .placement import check, describe

                if ex.is_main:
                    print(f"allreduce_train: ranks on {describe(hosts)}", file=sys.stderr, flush=True)
                misplaced = check(hosts, cfg.run.expect_hosts)
                if misplaced:
                    errors.append(misplaced)
            if errors:
                if ex.is_main:
                    fail(errors[0])
                    if made:
                        _remove_empty(run_dir)
                return EXIT_USAGE, None

            if cfg.exchange.stall_timeout:
                held.watchdog = Watchdog(
                    ex.rank, ex.size, cfg.exchange.stall_timeout, compare=ex.is_worker, hosts=hosts
                )
                # communication: where the main rank's heartbeat board listens
                held.watchdog.start(ex.broadcast_object(held.watchdog.address() if ex.is_main else None))
            if not ex.is_worker:
                ex.serve()
                return 0, None
            if ex.is_main:
                held.log = RunLogger(
                    run_dir, setup.total_steps, setup.start_step, cfg.run.tensorboard, cfg.run.progress
                )
                held.log.text("config", config_text(cfg))
            try:
                result = trainer.run(setup, held.log)
            except (Diverged, Preempted) as e:  # every worker raised it at the same step
                held.log.close()  # the progress bar ends before the line below (closing twice is harmless)
                if ex.is_main:
                    print(
                        f"allreduce_train: {'error: ' if isinstance(e, Diverged) else ''}{e}",
                        file=sys.stderr,
                        flush=True,
                    )
                return (EXIT_DIVERGED if isinstance(e, Diverged) else EXIT_PREEMPTED), None
            result["run_dir"] = run_dir
            result["hosts"] = hosts
            trainer.report(result, held.log)
            return 0, {**result, "is_main": ex.is_main}
    except KeyboardInterrupt:
        record_exit(ex.rank, EXIT_INTERRUPTED)
        ex.abort(EXIT_INTERRUPTED)
    except Exception as e:  # a failure mid-run: report on this rank, take every rank down
        if isinstance(e, Stalled) or type(e).__name__ == "HorovodInternalError":
            # a wait that gave up (the parameter server's deadline; Horovod's stall shutdown, or
            # Gloo's timeout): the watchdog names who is missing and ends with exit 69
            if held.watchdog:
                held.watchdog.fire(f"{type(e).__name__}: {e}")
            print(f"allreduce_train: error on rank {ex.rank}: stalled: {e}", file=sys.stderr, flush=True)
            record_exit(ex.rank, EXIT_STALLED)
            ex.abort(EXIT_STALLED)
        print(f"allreduce_train: error on rank {ex.rank}: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
        if os.environ.get("ALLREDUCE_TRAIN_TRACEBACK"):
            traceback.print_exc()
        record_exit(ex.rank, EXIT_ERROR)
        ex.abort(EXIT_ERROR)
    return 1, None


class _Held:
    """What a training run holds open, closed in one place whatever path ends it.

    A clean end (every ``return`` in ``cmd_train``) closes the run log (progress bar, TensorBoard),
    stops the stall watchdog and leaves the process group, in that order. An exception closes only
    the log: its handler then aborts every rank (MPI_Abort), and leaving the process group politely
    could wait forever for the rank that failed.
    """

    def __init__(self, ex) -> None:
        from .run_logger import NullLogger

        self.ex, self.log = ex, NullLogger()
        self.watchdog: Watchdog | None = None

    def __enter__(self) -> _Held:
        return self

    def __exit__(self, typ, value, tb) -> None:  # None: an exception goes on to cmd_train's handlers
        self.log.close()
        if typ is None:
            if self.watchdog is not None:
                self.watchdog.stop()
            self.ex.close()


def _gather_setup(ex, err: str | None) -> tuple[list[str], list[str]]:
    """Collective: every rank's set-up error, lowest rank first (empty when all succeeded), and
    every rank's hostname by rank (metrics.json's ``hosts``: where the job ran)."""
    gathered = ex.allgather_object((err, socket.gethostname()))
    return [e for e, _ in gathered if e], [host for _, host in gathered]


def _remove_empty(directory: str) -> None:
    try:
        os.rmdir(directory)  # only when empty: nothing anyone wrote is removed
    except OSError:
        pass


def _as_flag(name: str, value) -> str:
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

    def error(self, message: str):
        if env_rank() == 0:
            self.print_usage(sys.stderr)
            print(f"{self.prog}: error: {message}", file=sys.stderr)
        else:
            time.sleep(2.0)  # see fail_before_init
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
        record_exit(env_rank(), code)  # for the launcher's bound on ending the job (docs/faults.md)
