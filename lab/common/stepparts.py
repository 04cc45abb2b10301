"""A step's parts, timed: wrappers around what a training step calls, for the per-step accounting of
``python -m lab.bench.stepcost`` (the trainer against the bare Horovod loop, on CPU) and of
``gpucheck --parts`` (the trainer on a GPU).

:func:`instrument_trainer` wraps the trainer's parts (the batch, the forward pass and loss, backward,
the exchange's wait, the vote, the optimizer step, the watchdog's notes, the step meter, the progress
bar, the log steps' figures and TensorBoard) in a :class:`Meter`, which counts each part's own wall
and CPU time (this thread's), without the timed parts it calls, over the steps the trainer's own
throughput figure covers. What no wrapper covers is the loop's residue. A wrapper costs about a
microsecond per call (measured on a no-op and taken off the residue).
"""

from __future__ import annotations

import functools
import glob
import json
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

wall_clock = time.perf_counter
thread_cpu = time.thread_time  # this thread's CPU time: what a part costs, whatever else the machine runs


class Meter:
    """Accumulated wall time and calls per named part, counted only while ``on``."""

    def __init__(self) -> None:
        self.total: dict[str, float] = {}
        self.cpu: dict[str, float] = {}
        self.calls: dict[str, int] = {}
        self.on = False
        self.inner: list[list[float]] = []  # per open timed call: [wall, CPU] of the timed calls inside it
        # the measured steps: set by whoever runs them, around them
        self.started = self.stopped = self.cpu_started = self.cpu_stopped = 0.0
        self.steps = 0

    def wrap(self, name: str, fn: Callable) -> Callable:
        @functools.wraps(fn)
        def timed(*args, **kwargs):
            if not self.on:
                return fn(*args, **kwargs)
            t0, c0 = wall_clock(), thread_cpu()
            self.inner.append([0.0, 0.0])
            try:
                return fn(*args, **kwargs)
            finally:
                took, used = wall_clock() - t0, thread_cpu() - c0
                inner_wall, inner_cpu = self.inner.pop()
                # a part's own time: without the parts it called (backward inside train_step)
                self.total[name] = self.total.get(name, 0.0) + took - inner_wall
                self.cpu[name] = self.cpu.get(name, 0.0) + used - inner_cpu
                self.calls[name] = self.calls.get(name, 0) + 1
                if self.inner:
                    self.inner[-1][0] += took
                    self.inner[-1][1] += used

        return timed

    def wrap_iter(self, name: str, it):
        """The time each ``next()`` of an iterator takes (the batches)."""
        while True:
            t0, c0 = wall_clock(), thread_cpu()
            try:
                item = next(it)
            except StopIteration:
                return
            if self.on:
                took, used = wall_clock() - t0, thread_cpu() - c0
                self.total[name] = self.total.get(name, 0.0) + took
                self.cpu[name] = self.cpu.get(name, 0.0) + used
                self.calls[name] = self.calls.get(name, 0) + 1
                if self.inner:  # fetched inside a timed part (the trainer fetches the next batch in its step)
                    self.inner[-1][0] += took
                    self.inner[-1][1] += used
            yield item

    def overhead_us(self, n: int = 20000) -> float:
        """A wrapper's own cost per call (a no-op timed ``n`` times), so it can be taken off."""
        probe = Meter()
        probe.on = True
        noop = probe.wrap("noop", lambda: None)
        t0 = wall_clock()
        for _ in range(n):
            noop()
        wrapped = wall_clock() - t0
        bare = lambda: None  # noqa: E731
        t0 = wall_clock()
        for _ in range(n):
            bare()
        return 1e6 * max(0.0, wrapped - (wall_clock() - t0)) / n


def patch(meter: Meter, owner: Any, attr: str, name: str) -> None:
    setattr(owner, attr, meter.wrap(name, getattr(owner, attr)))


def instrument_trainer(meter: Meter, warmup: int, steps: int) -> None:
    """Wrap the trainer's parts (module and class attributes, before the run builds anything).
    Timing covers what the bench's wall clock covers: from the end of step ``warmup`` to the end of
    step ``warmup + steps`` (the step meter's record of each)."""
    import torch

    from allreduce_train import optim, preempt, run_logger, trainer, watchdog

    patch(meter, torch.Tensor, "backward", "backward")
    patch(meter, watchdog, "note", "watchdog notes")
    patch(meter, preempt, "requested", "preempt check")
    patch(meter, optim.LRSchedule, "set", "lr schedule")
    for cls in (run_logger.NullLogger, run_logger.RunLogger):
        patch(meter, cls, "progress", "progress bar")
        patch(meter, cls, "scalars", "log step: figures+TensorBoard")
    patch(meter, trainer.Trainer, "log_figures", "log step: metric allreduce")
    patch(meter, trainer.Trainer, "train_step", "train_step")

    record = meter.wrap("step meter (Throughput.record)", trainer.Throughput.record)
    seen = {"n": 0}

    def counted(self, started, wait):
        record(self, started, wait)
        seen["n"] += 1
        if seen["n"] == warmup:
            meter.on, meter.started, meter.cpu_started = True, wall_clock(), thread_cpu()
        elif seen["n"] == warmup + steps:
            meter.on, meter.stopped, meter.cpu_stopped, meter.steps = False, wall_clock(), thread_cpu(), steps

    build = trainer.Trainer.build

    def built(self):
        s = build(self)
        batches = s.batches.batches
        # the instrumentation replaces the method on purpose (in this benchmark process only)
        s.batches.batches = lambda *a, **k: meter.wrap_iter("batch (data)", batches(*a, **k))  # type: ignore[method-assign]
        self.task.loss = meter.wrap("forward+loss", self.task.loss)
        ex = self.ex
        for attr, name in (
            ("start_vote", "vote: start"),
            ("synchronize", "exchange wait (synchronize)"),
            ("end_vote", "vote: end"),
            ("apply", "optimizer step (apply)"),
        ):
            patch(meter, ex, attr, name)
        prepare = ex.prepare

        def prepared(model, optimizer, **kwargs):  # the schedule passes every_step=
            opt = prepare(model, optimizer, **kwargs)
            patch(meter, opt, "zero_grad", "zero_grad")
            return opt

        ex.prepare = prepared
        return s

    # the instrumentation replaces these methods on purpose (in this benchmark process only)
    trainer.Throughput.record = counted  # type: ignore[method-assign]
    trainer.Trainer.build = built  # type: ignore[method-assign]


def result(meter: Meter, impl: str, model: str, rank: int, size: int) -> dict[str, Any]:
    """Per part its own microseconds per step (without the timed parts it called) and calls per step."""
    steps = max(1, getattr(meter, "steps", 0))
    over = meter.overhead_us()
    parts = {
        name: {
            "us_per_step": 1e6 * total / steps,
            "cpu_us_per_step": 1e6 * meter.cpu[name] / steps,
            "calls_per_step": meter.calls[name] / steps,
        }
        for name, total in meter.total.items()
    }
    wall = 1e6 * (meter.stopped - meter.started) / steps
    cpu = 1e6 * (meter.cpu_stopped - meter.cpu_started) / steps
    calls = sum(p["calls_per_step"] for p in parts.values())
    # what no wrapper covers: the loop's own lines, less the wrappers' own cost
    parts["loop residue"] = {
        "us_per_step": wall - sum(p["us_per_step"] for p in parts.values()) - over * calls,
        "cpu_us_per_step": cpu - sum(p["cpu_us_per_step"] for p in parts.values()) - over * calls,
        "calls_per_step": 1.0,
    }
    return {
        "impl": impl,
        "model": model,
        "rank": rank,
        "size": size,
        "steps": steps,
        "step_us": wall,
        "step_cpu_us": cpu,
        "wrapper_us_per_call": over,
        "wrapper_us_per_step": over * calls,
        "parts": parts,
    }


def load(out: str) -> dict[tuple[str, str], list[dict]]:
    """Every ``stepcost-*.json`` in ``out`` (one per rank), by (model, impl)."""
    found: dict[tuple[str, str], list[dict]] = {}
    for path in sorted(glob.glob(os.path.join(out, "stepcost-*-rank*.json"))):
        with open(path) as fh:
            r = json.load(fh)
        found.setdefault((r["model"], r["impl"]), []).append(r)
    return found


ORDER = (
    "batch (data)",
    "lr schedule",
    "watchdog notes",
    "zero_grad",
    "forward+loss",
    "preempt check",
    "vote: start",
    "backward",
    "exchange wait (synchronize)",
    "vote: end",
    "optimizer step (apply)",
    "train_step",
    "step meter (Throughput.record)",
    "progress bar",
    "log step: metric allreduce",
    "log step: figures+TensorBoard",
    "loop residue",
)
LABELS = {"train_step": "train_step's own lines (the vote's tensor)", "optimizer step (apply)": "optimizer step"}


def table(found: dict[tuple[str, str], list[dict]]) -> str:
    """One column per (model, impl) of :func:`result`'s dicts, the median over its ranks: per part the
    wall and this thread's CPU microseconds per step."""
    cols = sorted(found, key=lambda k: (k[0], k[1] != "trainer", k[1]))
    names: list[str] = []
    for rs in found.values():
        for r in rs:
            names += [n for n in r["parts"] if n not in names]
    names = [n for n in ORDER if n in names] + [n for n in names if n not in ORDER]
    head = (
        "| part: µs per step, wall / main thread's CPU (median over ranks) | "
        + " | ".join(f"{m} {i} ({len(found[(m, i)])} rank{'s' if len(found[(m, i)]) > 1 else ''})" for m, i in cols)
        + " |"
    )
    lines = [head, "|---|" + "---:|" * len(cols)]
    for n in names:
        cells = []
        for c in cols:
            v = [r["parts"][n]["us_per_step"] for r in found[c] if n in r["parts"]]
            u = [r["parts"][n]["cpu_us_per_step"] for r in found[c] if n in r["parts"]]
            cells.append(f"{statistics.median(v):.0f} / {statistics.median(u):.0f}" if v else "–")
        lines.append(f"| {LABELS.get(n, n)} | " + " | ".join(cells) + " |")
    lines.append(
        "| **step** | "
        + " | ".join(
            f"**{statistics.median(r['step_us'] for r in found[c]):.0f} / "
            f"{statistics.median(r['step_cpu_us'] for r in found[c]):.0f}**"
            for c in cols
        )
        + " |"
    )
    lines.append(
        "| wrapper cost per call (taken off the residue) | "
        + " | ".join(f"{statistics.median(r['wrapper_us_per_call'] for r in found[c]):.2f}" for c in cols)
        + " |"
    )
    return "\n".join(lines)
