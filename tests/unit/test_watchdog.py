"""The stall watchdog's heartbeats and verdicts, in one process over loopback (the real jobs with
a frozen rank are in tests/mpi/test_faults.py)."""

import time

import pytest

from allreduce_train import watchdog
from allreduce_train.errors import Stalled
from allreduce_train.watchdog import AFTER, COMPUTING, EXCHANGING, Watchdog


def wait_until(cond, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline
        time.sleep(0.05)


def test_heartbeats_reach_the_board_and_its_answer_comes_back():
    host, peer = Watchdog(0, 2, timeout=60), Watchdog(1, 2, timeout=60)
    board = host.address()
    assert "127.0.0.1" in board[1]
    host.start(board)
    peer.start(board)
    try:
        peer.state = (7, EXCHANGING)
        wait_until(lambda: peer.board.get(1, [None])[0] == 7 and 0 in peer.board)
        assert host.board[1][:2] == [7, EXCHANGING]
    finally:
        peer.stop()
        host.stop()
    assert watchdog.current() is None


@pytest.mark.heavy
def test_a_silent_board_host_is_the_one_named():
    host, peer = Watchdog(0, 2, timeout=60), Watchdog(1, 2, timeout=60)
    board = host.address()
    host.start(board)
    peer.start(board)
    try:
        wait_until(lambda: 0 in peer.board)
        host.stop()  # as silent as a stopped process
        wait_until(lambda: peer.missing()[0] == [0])
        assert "rank 0 has not answered" in peer.missing()[1]
    finally:
        peer.stop()


def test_ranks_behind_the_others_did_not_arrive():
    w = Watchdog(0, 4, timeout=60)
    try:
        now = time.monotonic()
        w.state = (12, EXCHANGING)
        w.board = {
            1: [12, EXCHANGING, True, now, True],
            2: [12, COMPUTING, True, now, False],
            3: [11, AFTER, True, now, False],
        }
        ranks, how = w.missing()
        assert ranks == [2, 3] and "behind" in how
        # a server (compare=False) is named only when it goes silent, never for its step
        w.board = {
            1: [12, EXCHANGING, True, now, True],
            2: [0, COMPUTING, False, now, False],
            3: [12, EXCHANGING, True, now - 60, True],
        }
        ranks, how = w.missing()
        assert ranks == [3] and "no heartbeat from rank 3" in how
    finally:
        w.sock.close()


def test_a_rank_waiting_for_a_frozen_peer_is_not_named_for_being_behind():
    """The main worker of a parameter-server job fetches the optimizer state for a checkpoint from a
    frozen server while the other worker has gone on a step: only the server is to blame."""
    w = Watchdog(1, 3, timeout=60)  # rank 1: the first worker (the board's host); rank 0: the server
    try:
        now = time.monotonic()
        w.board = {0: [0, COMPUTING, False, now - 60, False], 2: [193, EXCHANGING, True, now, True]}
        w.state = (192, AFTER)
        watchdog._current = w  # as Watchdog.start makes it, without its thread
        with watchdog.waiting():
            ranks, how = w.missing()
        assert ranks == [0] and "no heartbeat from rank 0" in how and "behind" not in how
        # a wait that gave up: still waiting when Watchdog.fire judges
        with pytest.raises(Stalled), watchdog.waiting():
            raise Stalled("waiting for the servers' optimizer state")
        assert w.missing()[0] == [0]
        w.waiting = False
        ranks, how = w.missing()  # the same step outside a wait: behind its peer
        assert ranks == [0, 1] and "rank 1 behind at step(s) 192" in how
    finally:
        watchdog._current = None
        w.sock.close()
