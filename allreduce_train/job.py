"""The job's core under both entry points: the command line's ``train`` (cli.py) and the API's
:func:`~allreduce_train.fit` and :func:`~allreduce_train.init` (api.py) call it and add only how they
are called.

- :func:`configure`: the prologue every rank runs first (stop signals recorded, freed memory kept),
  then the configuration from a command line and settings. Bad input is checked before any process
  group forms: every rank fails alike and rank 0 says it once, exit 2.
- :func:`run`: one training job on this rank, from forming the process group to leaving it. Set-up
  errors (data files, checkpoint) are agreed on by all ranks in one collective, so that the lowest
  failing rank reports and nobody waits on a peer that gave up; anything that fails once training
  runs aborts the whole MPI job.
- :func:`connect`: only the process group, for a script with its own loop (:func:`init`).

Faults have their own exit codes (launch/exitcodes.py, docs/faults.md): bad input 2, divergence 65,
a stall 69, preemption 75; :func:`exit` records the code for the launcher and ends the process.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import time
import traceback
from collections.abc import Mapping, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any, NoReturn

from .distributed.mpi import launched_as
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
    from .config import Config
    from .distributed.base import GradientExchange
    from .watchdog import Watchdog


def fail(msg: str) -> int:
    """One error line on this rank's stderr; the usage exit code."""
    print(f"allreduce_train: error: {msg}", file=sys.stderr, flush=True)
    return EXIT_USAGE


def fail_before_init(msg: str) -> int:
    """An error every rank hits alike before any process group exists: rank 0 says it once.

    The other ranks linger a moment before exiting: mpirun ends the whole job as soon as one rank
    exits non-zero, and rank 0 must have printed the line by then.
    """
    if launched_as().rank == 0:
        return fail(msg)
    time.sleep(2.0)
    return EXIT_USAGE


def exit(code: int) -> NoReturn:
    """End this rank with ``code``, recorded first for the launcher's bound on ending the job."""
    record_exit(launched_as().rank, code)
    raise SystemExit(code)


def configure(args: argparse.Namespace | Sequence[str] | None, overrides: Mapping[str, Any] | None = None) -> Config:
    """The prologue of every job, then its validated configuration (:func:`.config.build_config`:
    ``args`` the trainer's flags, ``overrides`` the same by name, the flags winning). Bad input:
    one line from rank 0 and SystemExit(2) on every rank."""
    from . import preempt
    from .config import build_config
    from .memory import keep_freed_memory

    preempt.install()  # first: a stop signal from now on is recorded (the trainer: finish the step, checkpoint, 75)
    try:
        keep_freed_memory()  # before the data and the model are allocated (docs/performance.md)
        return build_config([] if args is None else args, overrides)
    except UserError as e:
        exit(fail_before_init(str(e)))


def connect(cfg: Config) -> GradientExchange:
    """The exchange of ``cfg``: the process group formed. Bad settings that only the engine can see:
    one line from rank 0 and SystemExit(2) on every rank."""
    from .distributed import create_exchange

    try:
        return create_exchange(cfg)
    except UserError as e:
        exit(fail_before_init(str(e)))


def default_run_name(cfg: Config, world: int) -> str:
    return f"{cfg.model.label}-{cfg.exchange.strategy}-np{world}-{time.strftime('%Y%m%d-%H%M%S')}"


def run(cfg: Config, task: Any = None) -> tuple[int, dict | None]:
    """One training job on this rank, from forming the process group to leaving it: (exit code,
    the run's result on a worker that finished, else None). ``task``: a user's Task object
    (:func:`allreduce_train.fit`); else the configuration names the task. A fault ends as the
    command line's do: one line from the lowest failing rank, or the whole job aborted."""
    ex = connect(cfg)

    from .run_logger import RunLogger, config_text
    from .trainer import Trainer
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

    A clean end (every ``return`` in :func:`run`) closes the run log (progress bar, TensorBoard),
    stops the stall watchdog and leaves the process group, in that order. An exception closes only
    the log: its handler then aborts every rank (MPI_Abort), and leaving the process group politely
    could wait forever for the rank that failed.
    """

    def __init__(self, ex: GradientExchange) -> None:
        from .run_logger import NullLogger

        self.ex, self.log = ex, NullLogger()
        self.watchdog: Watchdog | None = None

    def __enter__(self) -> _Held:
        return self

    def __exit__(
        self, typ: type[BaseException] | None, value: BaseException | None, tb: TracebackType | None
    ) -> None:  # None: an exception goes on to run's handlers
        self.log.close()
        if typ is None:
            if self.watchdog is not None:
                self.watchdog.stop()
            self.ex.close()


def _gather_setup(ex: GradientExchange, err: str | None) -> tuple[list[str], list[str]]:
    """Collective: every rank's set-up error, lowest rank first (empty when all succeeded), and
    every rank's hostname by rank (metrics.json's ``hosts``: where the job ran)."""
    gathered = ex.allgather_object((err, socket.gethostname()))
    return [e for e, _ in gathered if e], [host for _, host in gathered]


def _remove_empty(directory: str) -> None:
    try:
        os.rmdir(directory)  # only when empty: nothing anyone wrote is removed
    except OSError:
        pass
