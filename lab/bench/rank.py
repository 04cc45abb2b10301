"""One rank of a ``bench`` baseline loop (bare Horovod, torch DDP) or of its gradient check.

Started by ``python -m lab bench`` through the launcher's ``--module``,
never by hand; bench's side of it is :mod:`.loops`, the loops themselves :mod:`lab.common.baselines`.
"""

from __future__ import annotations

import argparse
import os
import sys

from .loops import add_arguments, run_rank


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="bench.rank", description=__doc__.split("\n\n")[0])
    add_arguments(p)
    args = p.parse_args(argv)
    if os.environ.get("ALLREDUCE_TRAIN_MALLOC") == "keep":
        # The trainer's allocator settings for a baseline (bench-tuning's ddp+malloc); the baselines
        # otherwise run with glibc's own, as a user's script would.
        from allreduce_train.memory import keep_freed_memory

        keep_freed_memory()
    rc = run_rank(args)
    if args.impl == "ddp":
        # Results are written and the process group is gone: skip the interpreter's teardown, where
        # torch's gloo threads can still abort the process (a baseline's exit, not what is timed).
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(rc)
    return rc


if __name__ == "__main__":
    sys.exit(main())
