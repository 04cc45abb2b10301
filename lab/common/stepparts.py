"""A step's parts, from the trainer's own trace: the per-step accounting of ``python -m lab.bench.stepcost`` (the
trainer against the bare Horovod loop, on CPU) and of ``gpucheck --parts`` (the trainer on a GPU).

The trainer marks its phases (allreduce_train/trace.py: data, forward, backward, the exchange's wait, the
update, evaluation, checkpoint); ``--trace-steps`` (:func:`trace_flags`) records the steps the trainer's own
throughput figure covers, and :func:`result` turns a rank's trace into each phase's wall and CPU time (this
thread's: ``tdur``) per step. What no phase covers (the vote's tensor, the step meter, the log steps'
figures and TensorBoard) is the step's residue. Nothing of the trainer is wrapped or replaced: every engine
is timed alike, the torch engine included. A mark costs about a microsecond while tracing (:func:`mark_us`,
measured on the tracer itself and taken off the residue).
"""

from __future__ import annotations

import glob
import json
import os
import statistics
import time
from typing import Any

from allreduce_train.trace import Tracer


def trace_flags(warmup: int, steps: int) -> list[str]:
    """The ``train`` flags that trace the timed steps: after ``warmup`` steps, ``steps`` of them."""
    return ["--trace-steps", f"{warmup}:{warmup + steps}"]


def mark_us(n: int = 2000) -> tuple[float, float]:
    """What one mark of a recording :class:`Tracer` costs, wall and this thread's CPU (``n`` marks timed), so
    that it can be taken off (wall time under load is mostly the time the process waited for a core)."""
    probe = Tracer(0, 0, 1)
    probe.step(0)
    t0, c0 = time.perf_counter(), time.thread_time()
    for _ in range(n):
        probe.mark("forward")
    return 1e6 * (time.perf_counter() - t0) / n, 1e6 * (time.thread_time() - c0) / n


def result(trace: dict[str, Any], impl: str, model: str, rank: int, size: int) -> dict[str, Any]:
    """Per phase of a rank's trace (Chrome JSON) its microseconds per step, wall and CPU, and its spans per step;
    the step's whole time, and what no phase covers as the residue."""
    events = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    stepped = [e for e in events if e["cat"] == "step"]
    steps = max(1, len(stepped))
    parts: dict[str, dict[str, float]] = {}
    for e in events:
        if e["cat"] != "phase":  # buckets travel beside the phases: their time is the wait's, where it shows
            continue
        part = parts.setdefault(e["name"], {"us_per_step": 0.0, "cpu_us_per_step": 0.0, "calls_per_step": 0.0})
        part["us_per_step"] += e["dur"] / steps
        part["cpu_us_per_step"] += e["tdur"] / steps
        part["calls_per_step"] += 1 / steps
    wall = sum(e["dur"] for e in stepped) / steps
    cpu = sum(e["tdur"] for e in stepped) / steps
    over, over_cpu = mark_us()
    marks = sum(p["calls_per_step"] for p in parts.values()) + 1  # each phase's mark, and the step's own
    parts["step residue"] = {
        "us_per_step": wall - sum(p["us_per_step"] for p in parts.values()) - over * marks,
        "cpu_us_per_step": cpu - sum(p["cpu_us_per_step"] for p in parts.values()) - over_cpu * marks,
        "calls_per_step": 1.0,
    }
    return {
        "impl": impl,
        "model": model,
        "rank": rank,
        "size": size,
        "steps": len(stepped),
        "step_us": wall,
        "step_cpu_us": cpu,
        "mark_us": over,
        "mark_cpu_us": over_cpu,
        "marks_us_per_step": over * marks,
        "parts": parts,
    }


def read(path: str, impl: str, model: str, rank: int, size: int) -> dict[str, Any]:
    """:func:`result` of the trace file a trainer's rank wrote (``<run dir>/trace/rank<R>.json``)."""
    with open(path) as fh:
        return result(json.load(fh), impl, model, rank, size)


def load(out: str) -> dict[tuple[str, str], list[dict]]:
    """Every ``stepcost-*.json`` in ``out`` (one per rank), by (model, impl)."""
    found: dict[tuple[str, str], list[dict]] = {}
    for path in sorted(glob.glob(os.path.join(out, "stepcost-*-rank*.json"))):
        with open(path) as fh:
            r = json.load(fh)
        found.setdefault((r["model"], r["impl"]), []).append(r)
    return found


ORDER = ("data", "forward", "backward", "wait", "update", "evaluation", "checkpoint", "step residue")
LABELS = {
    "data": "data (the batch to the device, the next one gathered, zero_grad)",
    "forward": "forward+loss (and the vote's start)",
    "wait": "exchange wait (synchronize, the vote's end)",
    "update": "update (clipping, the optimizer step)",
    "step residue": "step residue (the step meter, log steps' figures and TensorBoard)",
}


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
        "| tracer cost per mark (taken off the residue) | "
        + " | ".join(
            f"{statistics.median(r['mark_us'] for r in found[c]):.2f} / "
            f"{statistics.median(r['mark_cpu_us'] for r in found[c]):.2f}"
            for c in cols
        )
        + " |"
    )
    return "\n".join(lines)
