"""Errors that the command line reports as one line, without a traceback, and the exit codes.

Exit codes of ``python -m allreduce_train train`` and ``python -m launch`` (mpirun passes a rank's
code through; docs/faults.md says what each fault does):

====  ===========================================================================================
0     the run finished (or stopped at ``--exit-after-steps`` / ``--target``)
1     an error during training (a traceback-worthy bug, a rank that raised)
2     usage: a bad flag, a missing data file, an unreadable checkpoint (one line names it)
65    diverged: a non-finite loss or gradient norm (EX_DATAERR); the last good checkpoint is kept
69    stalled: no progress for ``--stall-timeout`` s; the line names the rank(s) that did not arrive
75    preempted: SIGTERM/SIGUSR1 ended the run after a checkpoint (EX_TEMPFAIL: requeue and
      ``--resume auto`` continues bit-exactly)
124   the launcher's ``--timeout`` ran out
128+N killed by signal N (137 = SIGKILL, e.g. the out-of-memory killer)
====  ===========================================================================================
"""

import json
import os
import socket

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_DIVERGED = 65  # sysexits.h EX_DATAERR
EXIT_STALLED = 69  # sysexits.h EX_UNAVAILABLE
EXIT_PREEMPTED = 75  # sysexits.h EX_TEMPFAIL: try again later
EXIT_TIMEOUT = 124  # as coreutils' timeout
EXIT_SIGNAL_BASE = 128  # + the signal number

# Codes after which the launcher's --max-restarts relaunches (a usage error or divergence would
# only fail again the same way).
RESTARTABLE = frozenset({EXIT_ERROR, EXIT_STALLED, EXIT_PREEMPTED})

# Set by ``python -m launch``: a directory where each rank leaves ``<rank>`` = {"code": .., "host": ..}
# as it exits. mpirun learns of an exit through the rank's host daemon; when another host cannot be
# reached, mpirun waits for that host forever, and this is how the launcher still knows the job is over.
EXIT_DIR_ENV = "ALLREDUCE_TRAIN_EXIT_DIR"


def record_exit(rank: int, code: int) -> None:
    """Tell the launcher that this rank is about to exit with ``code`` (nothing without the launcher's
    directory, e.g. on a host that does not share its file system). Never raises: it runs on the way out."""
    d = os.environ.get(EXIT_DIR_ENV)
    if not d or not os.path.isdir(d):
        return
    path = os.path.join(d, str(rank))
    try:
        with open(path + ".tmp", "w") as fh:
            json.dump({"code": code, "host": socket.gethostname()}, fh)
        os.replace(path + ".tmp", path)  # the launcher never reads half a record
    except OSError:
        pass


class UserError(Exception):
    """Bad input that the user can fix; the message names what is wrong and how to fix it."""


class ConfigError(UserError):
    """An invalid configuration value; the message names the flag."""


class DataError(UserError):
    """A missing or malformed dataset file; the message names the file."""


class Diverged(Exception):
    """A non-finite loss or gradient norm: every rank agreed at the same step (see trainer)."""

    def __init__(self, step: int, what: str, value: float) -> None:
        super().__init__(f"diverged at step {step}: {what} is {value}; the last good checkpoint is kept "
                         "(lower --lr, raise --warmup-steps or set --grad-clip)")
        self.step, self.what, self.value = step, what, value


class Preempted(Exception):
    """A stop signal reached a rank; every rank finished the step and the checkpoint is written."""

    def __init__(self, step: int, signame: str) -> None:
        super().__init__(f"preempted ({signame}) after step {step}; checkpoint written, continue with --resume auto")
        self.step, self.signame = step, signame


class Stalled(Exception):
    """A wait that saw no progress for --stall-timeout seconds."""
