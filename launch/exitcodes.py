"""The exit codes of a training job: one table for the trainer and every launcher.

``python -m allreduce_train train`` exits with them (allreduce_train/errors.py imports this module);
mpirun passes a rank's code through, and the launchers act on it: ``python -m launch`` restarts
with ``--max-restarts`` or not, the Slurm script requeues after 75, the Kubernetes job's
podFailurePolicy replaces a preempted pod and fails at once on 2 or 65. Standard library only (as
all of launch/): the trainer may import this module, launch never imports the trainer.
docs/faults.md says what each fault does.

====  ===========================================================================================
0     the run finished (or stopped at ``--exit-after-steps`` / ``--target``)
1     an error during training (a traceback-worthy bug, a rank that raised)
2     usage: a bad flag, a missing data file, an unreadable checkpoint (one line names it)
65    diverged: a non-finite loss or gradient norm (EX_DATAERR); the last good checkpoint is kept
69    stalled: no progress for ``--stall-timeout`` s; the line names the rank(s) that did not arrive
75    preempted: SIGTERM/SIGUSR1 ended the run after a checkpoint (EX_TEMPFAIL: requeue and
      ``--resume auto`` continues bit-exactly)
124   the launcher's ``--timeout`` ran out
130   interrupted (Ctrl-C: 128 + SIGINT)
128+N killed by signal N (137 = SIGKILL, e.g. the out-of-memory killer)
====  ===========================================================================================
"""

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_DIVERGED = 65  # sysexits.h EX_DATAERR
EXIT_STALLED = 69  # sysexits.h EX_UNAVAILABLE
EXIT_PREEMPTED = 75  # sysexits.h EX_TEMPFAIL: try again later
EXIT_TIMEOUT = 124  # as coreutils' timeout
EXIT_SIGNAL_BASE = 128  # + the signal number
EXIT_INTERRUPTED = EXIT_SIGNAL_BASE + 2  # SIGINT

# A restart would only fail the same way again: bad input, divergence.
NO_RETRY = (EXIT_USAGE, EXIT_DIVERGED)
# What ends ``python -m launch --max-restarts`` without a restart: those, success, the launcher's own
# --timeout and Ctrl-C. (A preempted job is not restarted by the launcher either: its stop signal was.)
NOT_RESTARTED = frozenset({EXIT_OK, *NO_RETRY, EXIT_TIMEOUT, EXIT_INTERRUPTED})
# The codes in words, for the launcher's messages (128 + N: launch.mpirun.why names the signal).
WORDS = {
    EXIT_OK: "finished",
    EXIT_ERROR: "a rank failed",
    EXIT_USAGE: "a usage error",
    EXIT_DIVERGED: "diverged",
    EXIT_STALLED: "stalled",
    EXIT_PREEMPTED: "a rank was preempted",
    EXIT_TIMEOUT: "--timeout",
    EXIT_INTERRUPTED: "interrupted",
}

# Set by ``python -m launch``: a directory where each rank leaves ``<rank>`` = {"code": .., "host": ..}
# as it exits. mpirun learns of an exit through the rank's host daemon; when another host cannot be
# reached, mpirun waits for that host forever, and this is how the launcher still knows the job is over.
EXIT_DIR_ENV = "ALLREDUCE_TRAIN_EXIT_DIR"
