"""Errors that the command line reports as one line, without a traceback, and the exit codes.

The exit codes live in one table shared with the launchers, ``launch/exitcodes.py`` (standard
library only, so launch never imports the trainer); docs/faults.md says what each fault does.
"""

import json
import os
import socket

from launch.exitcodes import (  # noqa: F401
    EXIT_DIR_ENV,
    EXIT_DIVERGED,
    EXIT_ERROR,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_PREEMPTED,
    EXIT_SIGNAL_BASE,
    EXIT_STALLED,
    EXIT_TIMEOUT,
    EXIT_USAGE,
)


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
        super().__init__(
            f"diverged at step {step}: {what} is {value}; the last good checkpoint is kept "
            "(lower --lr, raise --warmup-steps or set --grad-clip)"
        )
        self.step, self.what, self.value = step, what, value


class Preempted(Exception):
    """A stop signal reached a rank; every rank finished the step and the checkpoint is written."""

    def __init__(self, step: int, signame: str) -> None:
        super().__init__(f"preempted ({signame}) after step {step}; checkpoint written, continue with --resume auto")
        self.step, self.signame = step, signame


class Stalled(Exception):
    """A wait that saw no progress for --stall-timeout seconds."""
