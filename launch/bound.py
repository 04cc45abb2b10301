"""The launcher's bound: a job ends within a stated time, whatever the network does.

:func:`run_bounded` runs one mpirun line and watches three things besides mpirun itself: its own
``--timeout``, the stop signals sent to the launcher, and the exit records the ranks leave in the
directory named by ``$ALLREDUCE_TRAIN_EXIT_DIR`` (:func:`exit_dir`; allreduce_train/errors.py
record_exit), because mpirun hears of a rank's exit only from that rank's host daemon and waits forever
for a daemon on a host it can no longer reach. ``python -m launch`` (mpirun.py) and ``python -m
launch run`` (run.py, the Slurm and Kubernetes scripts' wrapper) both run their jobs through it.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from .exitcodes import EXIT_DIR_ENV, EXIT_PREEMPTED, EXIT_TIMEOUT, WORDS

GRACE_PERIOD = 30.0  # seconds mpirun has to end the job once a rank failed or a stop was asked for
KILL_PATIENCE = 5.0  # seconds between SIGTERM to mpirun and SIGKILL to it and its descendants


def why(rc: int) -> str:
    """A job's exit code in words."""
    if rc > 128:
        try:
            return f"a rank was killed by {signal.Signals(rc - 128).name}"
        except ValueError:
            pass
    return WORDS.get(rc, "mpirun failed")


EXIT_DIR_PREFIX = "launch-exits-"


def remove_stale_exit_dirs(parent: str | None = None) -> list[str]:
    """Remove the exit-record directories of launchers that are gone (one killed with SIGKILL had no
    chance to remove its own); a directory's name carries its launcher's pid. Returns those removed."""
    parent = parent or tempfile.gettempdir()
    removed: list[str] = []
    try:
        names = os.listdir(parent)
    except OSError:
        return removed
    for name in names:
        pid = name[len(EXIT_DIR_PREFIX) :].split("-", 1)[0]
        if name.startswith(EXIT_DIR_PREFIX) and pid.isdigit() and not os.path.exists(f"/proc/{pid}"):
            shutil.rmtree(os.path.join(parent, name), ignore_errors=True)
            removed.append(name)
    return removed


@contextlib.contextmanager
def exit_dir(env: dict[str, str]) -> Iterator[str]:
    """A fresh directory for the ranks' exit records, named in ``env`` for the job (after this
    launcher's pid); removed afterwards, and those of launchers that died before they could."""
    remove_stale_exit_dirs()
    env[EXIT_DIR_ENV] = tempfile.mkdtemp(prefix=f"{EXIT_DIR_PREFIX}{os.getpid()}-")
    try:
        yield env[EXIT_DIR_ENV]
    finally:
        shutil.rmtree(env[EXIT_DIR_ENV], ignore_errors=True)


def read_exits(exit_dir: str) -> dict[int, tuple[int, str, float]]:
    """The ranks that have exited, from their records in ``exit_dir``: rank -> (code, host, when written)."""
    found: dict[int, tuple[int, str, float]] = {}
    try:
        names = [n for n in os.listdir(exit_dir) if n.isdigit()] if exit_dir else []
    except OSError:
        return found
    for name in names:
        path = os.path.join(exit_dir, name)
        try:
            record = json.loads(Path(path).read_text())
            found[int(name)] = (int(record["code"]), str(record.get("host", "?")), os.stat(path).st_mtime)
        except (OSError, ValueError, KeyError, TypeError):
            pass  # replaced while being read: the next look sees it
    return found


def descendants(pid: int) -> list[int]:
    """The processes below ``pid`` (children, their children, ...), from /proc."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            ppid = int(stat[stat.rindex(")") + 2 :].split()[1])  # after "pid (comm) state"
            children.setdefault(ppid, []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def kill_job(proc: subprocess.Popen, patience: float = KILL_PATIENCE) -> None:
    """End mpirun and what it started on this host. With ``patience``: SIGTERM first, Open MPI's own
    "end the job", and ``patience`` s for it. Then SIGKILL to mpirun and its descendants (the ranks it
    forked here; the ssh or namespace agents, which Open MPI puts in process groups of their own):
    a remote daemon ends when its agent's connection does; the emulated hosts' processes are ended
    by lab.emulation.netns."""
    if patience:
        proc.terminate()
        try:
            proc.wait(timeout=patience)
        except subprocess.TimeoutExpired:
            pass
    for pid in [proc.pid, *descendants(proc.pid)] if proc.poll() is None else []:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.wait()


def run_bounded(
    cmd: list[str],
    env: dict[str, str],
    timeout: float = 0,
    stops: list[str] | None = None,
    grace: float = GRACE_PERIOD,
    np: int = 0,
) -> int:
    """Run ``cmd`` (mpirun) and end it within a stated bound, whatever the network does.

    - Past ``timeout`` seconds (0 = none): mpirun is stopped; exit 124.
    - SIGTERM or SIGUSR1 to this launcher: SIGUSR1 to mpirun, which Open MPI forwards to every rank
      (a SIGTERM to mpirun itself would end the ranks a second later); the ranks finish their step,
      checkpoint and exit 75 (allreduce_train/preempt.py). Ctrl-C: SIGTERM to mpirun, Open MPI's
      "end the job"; KeyboardInterrupt is raised once it is over.
    - Once a rank has exited with an error (its record in ``$ALLREDUCE_TRAIN_EXIT_DIR``), all ``np``
      ranks have exited, or a stop was asked for, mpirun has ``grace`` seconds to end the job; then it
      is killed with what it started here (:func:`kill_job`; mpirun waits forever for a host it cannot
      reach). The exit code is then the first failed rank's, 75 when a rank checkpointed, else 128 +
      the stop signal's number.
    - A stop signal when a rank has already failed (nobody is left to checkpoint), or a second stop
      signal (TERM, USR1 or INT), kills mpirun at once.
    """
    exit_dir = env.get(EXIT_DIR_ENV, "")
    for name in os.listdir(exit_dir) if exit_dir else ():
        os.unlink(os.path.join(exit_dir, name))  # an earlier attempt's records
    proc = subprocess.Popen(cmd, env=env)
    stops = [] if stops is None else stops
    signals: list[int] = []
    main_thread = threading.current_thread() is threading.main_thread()
    old = (
        {
            sig: signal.signal(sig, lambda signum, _frame: signals.append(signum))
            for sig in (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT)
        }
        if main_thread
        else {}
    )
    started, since, handled = time.monotonic(), None, 0  # since: when the grace period began

    def say(line: str) -> None:
        print(f"launch: {line}", file=sys.stderr, flush=True)

    def first_failure(exits: dict[int, tuple[int, str, float]]) -> tuple[int, int, str] | None:
        failed = sorted((when, rank, code, host) for rank, (code, host, when) in exits.items() if code != 0)
        return failed[0][1:] if failed else None

    try:
        while True:
            try:
                rc = proc.wait(timeout=0.2)
                break
            except subprocess.TimeoutExpired:
                pass
            now, exits = time.monotonic(), read_exits(exit_dir)
            failed = first_failure(exits)
            for sig in signals[handled:]:
                handled += 1
                name = signal.Signals(sig).name
                stops.append(name)
                if handled > 1:
                    say(f"{name} again: killing the job now")
                    kill_job(proc, patience=0)
                    if sig == signal.SIGINT:
                        raise KeyboardInterrupt
                    return failed[1] if failed else 128 + sig
                if sig == signal.SIGINT:
                    say("interrupted: stopping the job (Ctrl-C again to kill it at once)")
                    proc.terminate()
                elif failed:
                    say(
                        f"{name}: rank {failed[0]} on {failed[2]} has exited {failed[1]} ({why(failed[1])}): no "
                        "checkpoint can be written; stopping the job now"
                    )
                    kill_job(proc, patience=0)
                    return failed[1]
                else:
                    say(
                        f"{name}: asking the job to checkpoint and stop (SIGUSR1 to mpirun; --grace-period {grace:g} s)"
                    )
                    proc.send_signal(signal.SIGUSR1)
                since = since if since is not None else now
            if timeout and now - started > timeout:
                say(f"error: the job ran past --timeout {timeout:g}s; stopping it")
                kill_job(proc)
                return EXIT_TIMEOUT
            if since is None and (failed or (np and len(exits) >= np)):
                since = now
            if since is not None and now - since > grace:
                if failed:
                    rank, code, host = failed
                    say(
                        f"rank {rank} on {host} exited {code} ({why(code)}) and mpirun has not ended the job "
                        f"{grace:g} s later (--grace-period; a host it cannot reach?): killing it"
                    )
                elif stops:
                    saved = any(code == EXIT_PREEMPTED for code, _, _ in exits.values())
                    code = EXIT_PREEMPTED if saved else 128 + signals[0]
                    say(
                        f"the job has not stopped {grace:g} s after {stops[0]} (--grace-period): killing it; "
                        + ("the checkpoint was written" if saved else "no checkpoint was written")
                    )
                else:
                    code = 0
                    say(f"every rank has exited, and mpirun has not {grace:g} s later (--grace-period): killing it")
                kill_job(proc, patience=0)  # it has had its grace period
                if stops and stops[0] == "SIGINT":
                    raise KeyboardInterrupt
                return code
        if signals and signals[0] == signal.SIGINT:
            raise KeyboardInterrupt
        if stops and rc == 128 + signal.SIGUSR1:
            # a rank still starting up (its handler not yet installed) died of the forwarded signal:
            # nothing had been trained, so nothing is lost; the job was preempted all the same
            say("the job was stopped before training began; nothing to checkpoint")
            rc = EXIT_PREEMPTED
        return rc
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)
        if proc.poll() is None:  # an exception (SIGHUP in an emulated cluster) cut the wait short
            kill_job(proc, patience=1.0)
