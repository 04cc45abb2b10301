"""Stall watchdog: a job that makes no progress for ``--stall-timeout`` seconds ends, naming who is missing.

A frozen rank (SIGSTOP, a hung node, a stuck NFS read) leaves its peers blocked inside a
collective, where nothing in the training loop runs again: Open MPI sees live processes and waits
forever, and Horovod's stall inspector runs in the coordinator's background thread, which is as
blocked as everyone else when the frozen rank is rank 0 or when the stall is inside the
coordination itself. So every rank runs a small thread of its own:

* the training loop notes its state (:func:`note`: the step it runs and whether it has arrived at
  the exchange); waits that poll (the parameter server's, the mpi engine's, Horovod's metric
  reductions) run inside :func:`waiting` and call :func:`beat` when something moved;
* the threads exchange heartbeats over UDP, star-shaped: every rank sends its state to the main
  rank (rank 0; the first worker under a parameter server) about once a second, which answers
  with everyone's latest state (a "board"). A rank whose
  heartbeats stopped is frozen or gone; one whose state is behind its peers' has not arrived --
  unless it is itself waiting for a peer (the main worker fetching a checkpoint's optimizer state
  from a frozen server is a victim, not a cause);
* when a rank's own state has not changed for the timeout, its thread prints one line (only the
  lowest live rank speaks) naming the step and the rank(s) that did not arrive, and ends the process
  with ``os._exit(69)`` -- from a thread, and without MPI calls that could block. mpirun then ends
  the job's other ranks, the frozen one included (SIGKILL reaches a stopped process).

The heartbeats carry nothing the job needs; if they cannot get through (a firewall between hosts),
the line says that the missing rank is unknown, and the job still ends.
"""

from __future__ import annotations

import fcntl
import json
import os
import select
import socket
import struct
import sys
import threading
import time
from typing import Any

from .errors import EXIT_STALLED, record_exit

_current: Watchdog | None = None


COMPUTING, EXCHANGING, AFTER = 0, 1, 2  # the phases of a step, in order


def note(step: int, phase: int) -> None:
    """The training loop's state: in ``step`` (1-based), at ``phase`` (forward/backward, waiting on
    the exchange, or the logging/evaluation/checkpoint after it)."""
    w = _current
    if w is not None:
        w.state, w.changed = (step, phase), time.monotonic()


def beat() -> None:
    """Something moved in a polling wait (a message arrived): progress, though the step is the same."""
    w = _current
    if w is not None:
        w.changed = time.monotonic()


class waiting:
    """``with waiting():`` around a wait for peers: this rank is blocked on someone else, so a verdict
    never names it for being behind (its step may lag because the one it waits for is frozen)."""

    __slots__ = ("before", "w")

    def __enter__(self) -> None:
        self.w = _current
        if self.w is not None:
            self.before, self.w.waiting = self.w.waiting, True

    def __exit__(self, exc_type: object, *exc: object) -> None:
        # A wait that gave up (Stalled) leaves the rank marked as waiting: its own verdict in
        # Watchdog.fire must agree with what its peers last saw of it, or each may leave the
        # report to the other and nobody speaks.
        if self.w is not None and exc_type is None:
            self.w.waiting = self.before


def current() -> Watchdog | None:
    return _current


def ipv4_addresses() -> list[str]:
    """This host's IPv4 addresses, loopback last: where the other ranks may reach rank 0's board."""
    found = []
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for _, name in socket.if_nameindex():
            try:  # SIOCGIFADDR: the interface's address (bytes 20..24 of struct ifreq)
                packed = fcntl.ioctl(s.fileno(), 0x8915, struct.pack("256s", name.encode()[:15]))
            except OSError:
                continue  # no IPv4 address on this interface
            found.append(socket.inet_ntoa(packed[20:24]))
    return sorted(set(found), key=lambda a: (a.startswith("127."), a)) or ["127.0.0.1"]


class Watchdog:
    """One per rank; see the module docstring. ``interval``: seconds between heartbeats."""

    def __init__(
        self, rank: int, size: int, timeout: float, compare: bool = True, hosts: list[str] | None = None
    ) -> None:
        self.rank, self.size, self.timeout = rank, size, timeout
        self.hosts = hosts or []  # every rank's hostname, by rank: the verdict says where a missing rank runs
        self.compare = compare  # False on a rank whose state says nothing about the steps (a PS server)
        self.interval = min(1.0, max(0.1, timeout / 10))
        self.state: tuple[int, int] = (0, COMPUTING)
        self.waiting = False  # inside a wait for peers (see :class:`waiting`)
        self.changed = time.monotonic()
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("0.0.0.0", 0))
        self.board: dict[int, list[Any]] = {}  # rank -> [step, phase, compare, monotonic time seen, waiting]
        self.board_seen = time.monotonic()  # when the board last answered (on the host: always now)
        self.host = 0  # the rank that keeps the board
        self.peers: list[tuple[str, int]] = []  # its addresses
        self.tick = 0.0  # the thread's last pass (monotonic)
        self.frozen_at = -1e9  # when this process was last found to have been stopped itself
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        # fire() ends the process; the thread and a wait that gave up (a parameter server's deadline)
        # may call it at the same moment, and only one of them may print the verdict
        self._firing = threading.Lock()

    def address(self) -> tuple[int, list[str], int]:
        """Where this rank's board listens: called on the main rank, broadcast by the caller."""
        return self.rank, ipv4_addresses(), self.sock.getsockname()[1]

    def start(self, board: tuple[int, list[str], int]) -> None:
        """Start the thread; ``board``: the main rank's :meth:`address`."""
        global _current
        self.host, addrs, port = board
        self.peers = [(a, port) for a in addrs]
        self.changed = self.board_seen = time.monotonic()
        _current = self
        self._thread = threading.Thread(target=self._run, name="stall-watchdog", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        global _current
        if _current is self:
            _current = None
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self.sock.close()

    # ------------------------------------------------------------ the thread
    def _was_frozen(self, now: float) -> bool:
        """Whether this process itself was stopped (SIGSTOP, a suspended VM) a moment ago: the
        thread's own passes show the gap."""
        if self.tick and now - self.tick > max(3 * self.interval, 2.0):
            self.frozen_at = now
        return now - self.frozen_at < self.timeout

    def _run(self) -> None:
        next_beat = 0.0
        while not self._stop.is_set():
            now = time.monotonic()
            if self._was_frozen(now) and self.frozen_at == now:
                # It has no news of its peers and must not blame them for its own silence: a fresh window.
                self.changed = self.board_seen = now
                self.board = {}
            self.tick = now
            if now >= next_beat:
                self._heartbeat(now)
                next_beat = now + self.interval
            try:
                ready, _, _ = select.select([self.sock], [], [], self.interval / 2)
            except (OSError, ValueError):
                return  # closed by stop()
            if ready:
                self._receive()
            if now - self.changed > self.timeout:
                self.fire()

    def _mine(self, now: float) -> list[Any]:
        step, phase = self.state
        return [step, phase, self.compare, now, self.waiting]

    def _heartbeat(self, now: float) -> None:
        if self.rank == self.host:
            self.board[self.rank] = self._mine(now)
            self.board_seen = now
            return
        step, phase = self.state
        msg = json.dumps({"r": self.rank, "s": step, "p": phase, "c": self.compare, "w": self.waiting}).encode()
        for peer in self.peers:
            try:
                self.sock.sendto(msg, peer)
            except OSError:
                pass  # an address of the host that is not reachable from here

    def _receive(self) -> None:
        try:
            data, sender = self.sock.recvfrom(65536)
            msg = json.loads(data)
        except (OSError, ValueError):
            return
        now = time.monotonic()
        if self.rank == self.host and "r" in msg:  # a heartbeat: note it, answer with the board
            self.board[int(msg["r"])] = [msg["s"], msg["p"], msg["c"], now, msg["w"]]
            self.board[self.rank] = self._mine(now)
            ages = {r: [*v[:3], now - v[3], v[4]] for r, v in self.board.items()}
            try:
                self.sock.sendto(json.dumps({"b": ages}).encode(), sender)
            except OSError:
                pass
        elif "b" in msg:  # the host's board, ages relative to its clock
            self.board = {int(r): [*v[:3], now - v[3], v[4]] for r, v in msg["b"].items()}
            self.board_seen = now

    # ------------------------------------------------------------ the verdict
    def missing(self) -> tuple[list[int], str]:
        """The ranks that did not arrive, and how that is known."""
        now = time.monotonic()
        silent_after = max(3 * self.interval, 2.0)
        if self.rank != self.host and now - self.board_seen > silent_after:
            return [self.host], f"rank {self.host} has not answered heartbeats for {now - self.board_seen:.0f} s"
        if not self.board:
            return [], "no heartbeats arrived (blocked between hosts?)"
        board = dict(self.board)
        board[self.rank] = self._mine(now)
        silent = [r for r in range(self.size) if r not in board or now - board[r][3] > silent_after]
        live = [r for r in range(self.size) if r not in silent and board[r][2]]
        ahead = max((tuple(board[r][:2]) for r in live), default=None)
        # a rank blocked on a peer is not behind by its own doing (board[r][4]: waiting)
        behind = [r for r in live if tuple(board[r][:2]) < ahead and not board[r][4]] if ahead else []
        parts = []
        if silent:
            parts.append(f"no heartbeat from rank {', '.join(map(str, silent))} (frozen or gone)")
        if behind:
            parts.append(
                f"rank {', '.join(map(str, behind))} behind at step(s) {', '.join(str(board[r][0]) for r in behind)}"
            )
        if not parts:
            return [], "every rank is waiting in the exchange (a broken link?)"
        return sorted(silent + behind), "; ".join(parts)

    def fire(self, cause: str = "") -> None:
        """Report the stall (the lowest live rank speaks) and end this process with exit 69.

        A rank that was itself frozen and has just been woken (mpirun's SIGCONT before its SIGKILL,
        or a peer's socket closing) leaves quietly: the others have named it already."""
        self._firing.acquire()  # a second caller waits here for the first one's os._exit
        if self._was_frozen(time.monotonic()):
            record_exit(self.rank, EXIT_STALLED)
            os._exit(EXIT_STALLED)
        ranks, how = self.missing()
        step = self.state[0]
        speaker = min((r for r in range(self.size) if r not in ranks), default=self.rank)
        if self.rank == speaker:
            where = sorted({self.hosts[r] for r in ranks if r < len(self.hosts)})
            who = (
                f"rank(s) {', '.join(map(str, ranks))} did not arrive" + (f" (on {', '.join(where)})" if where else "")
                if ranks
                else "no rank is known to be missing"
            )
            print(
                f"allreduce_train: error: stalled at step {step}: no progress for {self.timeout:g} s "
                f"(--stall-timeout); {who}: {how}{'; ' + cause if cause else ''}. Ending the job "
                f"(exit {EXIT_STALLED}).",
                file=sys.stderr,
                flush=True,
            )
        else:
            time.sleep(min(5.0, 2 * self.interval + 1.0))  # let the speaker's line out before mpirun ends the job
        record_exit(self.rank, EXIT_STALLED)
        os._exit(EXIT_STALLED)
