"""``python -m launch run -- CMD ...``: run a ready-made mpirun line within the launcher's bound.

The Slurm batch script (``python -m launch slurm``) and the Kubernetes launcher pod
(deploy/launcher-entrypoint.sh) start their own mpirun line; this wrapper gives them what
``python -m launch`` gives its own (:func:`launch.bound.run_bounded`):

- SIGTERM or SIGUSR1: SIGUSR1 to mpirun (every rank checkpoints and exits 75); if the job has not
  ended ``--grace-period`` s later, or no rank is left to checkpoint, mpirun is killed; a second
  signal kills it at once.
- A rank on this host that exits with an error (the stall watchdog's 69 included) starts the grace
  period too: mpirun waits forever for a daemon on a host whose link is gone.

The ranks record their exit codes in a directory named by ``$ALLREDUCE_TRAIN_EXIT_DIR``, which this
wrapper creates and mpirun's local ranks inherit; ranks on other hosts do not see it and record
nothing (their failures reach mpirun through their host's daemon, or stall rank 0's watchdog here).
The wrapper exits with the job's code: the rank's, 75 after a checkpoint, 128 + the signal without one.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys

from .bound import GRACE_PERIOD, exit_dir, run_bounded
from .exitcodes import EXIT_INTERRUPTED, EXIT_USAGE
from .specflags import trailing


def make_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m launch run",
        description="Run a ready-made mpirun line within the launcher's bound (docs/faults.md).",
    )
    p.add_argument(
        "--grace-period",
        type=float,
        default=GRACE_PERIOD,
        metavar="SECONDS",
        help=f"how long mpirun has to end the job once a rank on this host failed or a stop was asked "
        f"for, before it is killed (default {GRACE_PERIOD:g})",
    )
    p.add_argument(
        "--np",
        type=int,
        default=0,
        metavar="N",
        help="the job's ranks, when every one of them runs on this host: once all have exited, mpirun "
        "has the grace period to end (default 0: not counted)",
    )
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- then the command (the mpirun line)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = make_parser().parse_args(argv)
    cmd = trailing(args.command)
    if not cmd:
        print(
            "launch run: error: give the command after --, e.g. python -m launch run -- mpirun -np 2 ...",
            file=sys.stderr,
        )
        return EXIT_USAGE
    if args.grace_period <= 0 or args.np < 0:
        print(
            f"launch run: error: --grace-period must be > 0 and --np >= 0 (got {args.grace_period:g}, {args.np})",
            file=sys.stderr,
        )
        return EXIT_USAGE
    if shutil.which(cmd[0]) is None:
        print(
            f"launch run: error: {cmd[0]} not found on PATH; give its full path, or install it (mpirun: "
            "apt-get install openmpi-bin, or make install)",
            file=sys.stderr,
        )
        return EXIT_USAGE
    env = dict(os.environ)
    with exit_dir(env):
        try:
            return run_bounded(cmd, env, grace=args.grace_period, np=args.np)
        except KeyboardInterrupt:
            print("launch run: interrupted", file=sys.stderr)
            return EXIT_INTERRUPTED
