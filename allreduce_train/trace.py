"""A trace of the training steps: each phase of a step and each bucket's exchange, as a Chrome trace.

The trainer marks its phases (:data:`PHASES`: data, forward, backward, the exchange's wait, the update,
evaluation, checkpoint) and the engines report each bucket's start and finish (:meth:`Tracer.bucket_start`,
:meth:`Tracer.bucket_done`). ``--trace-steps A:B`` records the steps A to B-1 (counted as the trainer counts
them: the steps done before each, so ``0:5`` is the first five) and writes them per rank to
``<run dir>/trace/rank<R>.json`` in the Chrome trace format (``{"traceEvents": [...]}``: "X" complete events,
``ts``/``dur`` in microseconds, ``pid`` = the rank, ``tid`` = a lane per phase kind and one per bucket, as
Horovod's timeline has a row per tensor), which Perfetto (ui.perfetto.dev) and ``chrome://tracing`` open.
Phases also carry the thread's CPU time (``tts``/``tdur``), which the lab's step accounting reads
(:mod:`lab.common.stepparts`).

Off, the trainer holds :data:`NULL`, whose methods do nothing and allocate nothing.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Iterator
from typing import Any

# The step's phases in the order a step runs them; each is a lane of the trace (its ``tid``), after the
# lane of the whole step. Buckets get lanes of their own after these.
PHASES = ("data", "forward", "backward", "wait", "update", "evaluation", "checkpoint")
STEP_LANE, BUCKET_LANE0 = 0, 100


class NullTracer:
    """Tracing off: every call returns at once, allocating nothing (:data:`NULL`)."""

    active = False  # whether a trace is wanted at all (engines add their own hooks only then)
    on = False  # whether the current step is recorded

    def step(self, n: int) -> None:
        """A step begins; ``n`` steps were done before it."""

    def mark(self, phase: str) -> None:
        """The phase ``phase`` begins now and the open one ends ("" ends it only)."""

    def begin(self, name: str, cat: str = "phase") -> None:
        """Open a span ``name`` on its own lane."""

    def end(self, name: str) -> None:
        """Close the span ``name`` opened by :meth:`begin`."""

    def span(self, name: str, cat: str = "phase") -> contextlib.AbstractContextManager[None]:
        """A span as a context manager (:meth:`begin` and :meth:`end` around the block)."""
        return _NO_SPAN

    def bucket_start(self, index: int) -> None:
        """Bucket ``index``'s exchange leaves (an engine's "start a bucket" place)."""

    def bucket_done(self, index: int) -> None:
        """Bucket ``index``'s exchange is seen done; later calls for the same bucket change nothing."""

    def close(self) -> None:
        """The run's last step is done: write what was recorded."""


_NO_SPAN = contextlib.nullcontext()
NULL = NullTracer()


class Tracer(NullTracer):
    """Records the steps ``first`` to ``stop - 1`` of rank ``rank`` and writes them to ``path`` (Chrome JSON) once
    step ``stop`` begins or the run ends (:meth:`close`); ``path`` empty: kept in :attr:`events` only."""

    active = True

    def __init__(self, rank: int, first: int, stop: int, path: str = "") -> None:
        self.rank, self.first, self.stop, self.path = rank, first, stop, path
        self.on = False
        self.written = False
        self.n = -1  # the step being recorded
        self.phase = ""  # the phase open now ("" none)
        # perf_counter for durations, the wall clock once for where they lie: ranks on one host line up
        self.origin, self.epoch_us = time.perf_counter(), time.time_ns() / 1000
        self.open: dict[str, tuple[str, float, float]] = {}  # span name -> (category, start, CPU start)
        self.buckets: dict[int, float] = {}  # bucket index -> start, while in flight
        self.events: list[dict[str, Any]] = []
        self.lanes: dict[str, int] = {"step": STEP_LANE, **{p: i + 1 for i, p in enumerate(PHASES)}}

    def _us(self, t: float) -> float:
        return round(self.epoch_us + 1e6 * (t - self.origin), 3)

    def _lane(self, name: str) -> int:
        return self.lanes.setdefault(name, len(self.lanes))

    def step(self, n: int) -> None:
        if self.on:
            self.mark("")
            self.end("step")
        self.on = self.first <= n < self.stop
        if self.on:
            self.n = n
            self.buckets.clear()  # a bucket of an untraced step that never finished is not this step's
            self.begin("step", "step")
            self.mark("data")  # the step's batch to the device, until the forward pass
        elif n >= self.stop:
            self.close()

    def mark(self, phase: str) -> None:
        if not self.on:
            return
        if self.phase:
            self.end(self.phase)
        self.phase = phase
        if phase:
            self.begin(phase)

    def begin(self, name: str, cat: str = "phase") -> None:
        if self.on:
            self.open[name] = (cat, time.perf_counter(), time.thread_time())

    def end(self, name: str) -> None:
        opened = self.open.pop(name, None)
        if opened is None:
            return
        t, cpu = time.perf_counter(), time.thread_time()
        cat, t0, cpu0 = opened
        self.events.append(
            {
                "name": f"step {self.n}" if cat == "step" else name,
                "cat": cat,
                "ph": "X",
                "ts": self._us(t0),
                "dur": round(1e6 * (t - t0), 3),
                "tts": round(1e6 * cpu0, 3),
                "tdur": round(1e6 * (cpu - cpu0), 3),  # this thread's CPU time in the span
                "pid": self.rank,
                "tid": self._lane(name),
                "args": {"step": self.n},
            }
        )

    @contextlib.contextmanager
    def _span(self, name: str, cat: str) -> Iterator[None]:
        self.begin(name, cat)
        try:
            yield
        finally:
            self.end(name)

    def span(self, name: str, cat: str = "phase") -> contextlib.AbstractContextManager[None]:
        return self._span(name, cat)

    def bucket_start(self, index: int) -> None:
        if self.on:
            self.buckets[index] = time.perf_counter()

    def bucket_done(self, index: int) -> None:
        t0 = self.buckets.pop(index, None)
        if t0 is None:
            return
        name = f"bucket {index}"
        self.events.append(
            {
                "name": name,
                "cat": "bucket",
                "ph": "X",
                "ts": self._us(t0),
                "dur": round(1e6 * (time.perf_counter() - t0), 3),
                "pid": self.rank,
                "tid": BUCKET_LANE0 + index,
                "args": {"step": self.n, "bucket": index},
            }
        )
        self.lanes.setdefault(name, BUCKET_LANE0 + index)

    def close(self) -> None:
        if self.on:
            self.mark("")
            self.end("step")
            self.on = False
        if not self.written and self.path:
            write(self.path, self.chrome())
        self.written = True

    def chrome(self) -> dict[str, Any]:
        """The Chrome trace: the events, and each lane's name and order as metadata events."""
        meta: list[dict[str, Any]] = [
            {"name": "process_name", "ph": "M", "pid": self.rank, "tid": 0, "args": {"name": f"rank {self.rank}"}}
        ]
        for name, tid in self.lanes.items():
            meta.append({"name": "thread_name", "ph": "M", "pid": self.rank, "tid": tid, "args": {"name": name}})
            meta.append(
                {"name": "thread_sort_index", "ph": "M", "pid": self.rank, "tid": tid, "args": {"sort_index": tid}}
            )
        return {
            "traceEvents": meta + self.events,
            "displayTimeUnit": "ms",
            "otherData": {"rank": self.rank, "steps": [self.first, self.stop]},
        }


def write(path: str, trace: dict[str, Any]) -> None:
    """Write ``trace`` as JSON to ``path`` whole or not at all (a temporary file, renamed)."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    tmp = f"{path}.tmp"
    with open(tmp, "w") as fh:
        json.dump(trace, fh)
    os.replace(tmp, path)


def path_of(run_dir: str, rank: int) -> str:
    """Where rank ``rank`` writes its trace: ``<run dir>/trace/rank<R>.json``."""
    return os.path.join(run_dir, "trace", f"rank{rank}.json")


def make(steps: str, rank: int, run_dir: str) -> NullTracer:
    """The trainer's tracer: ``--trace-steps`` (``A:B``, checked by the config) or :data:`NULL` when empty."""
    if not steps:
        return NULL
    from .config import parse_trace_steps

    first, stop = parse_trace_steps(steps)
    return Tracer(rank, first, stop, path_of(run_dir, rank))
