"""The run's figures: step times and waits (:class:`Throughput`, the perf/ tags and metrics.json's
throughput) and the evaluations against ``--target`` (:class:`TimeToTarget`, metrics.json's ``evals``
and ``target``). The trainer records into them; nothing here communicates."""

from __future__ import annotations

import statistics
import time
from typing import Any

from .config import parse_target
from .stragglers import window_median_ms

__all__ = ["Throughput", "TimeToTarget"]


class Throughput:
    """Step times, exchange waits, compute times and CPU time of this rank: the one place the perf/
    figures and metrics.json's throughput come from. The first ``warmup`` steps are excluded from
    the totals. A step's compute time is its wall time less its wait (:mod:`.stragglers` says what
    each covers per engine)."""

    def __init__(self, samples_per_step: int, warmup: int) -> None:
        self.samples_per_step = samples_per_step  # global: workers x batch x micro-batches
        self.warmup = warmup
        self.step_times: list[float] = []
        self.waits: list[float] = []
        self.computes: list[float] = []
        self.wall_from = self.wall_to = time.perf_counter()  # wall clock over the measured steps, bookkeeping included
        self.cpu_from = self.cpu_to = time.process_time()  # CPU time of every thread of this rank (Horovod's included)

    def record(self, started: float, wait: float) -> None:
        """One step that began at ``started`` (perf_counter) and waited ``wait`` s for the exchange."""
        self.wall_to, self.cpu_to = time.perf_counter(), time.process_time()
        self.step_times.append(self.wall_to - started)
        self.waits.append(wait)
        self.computes.append(self.step_times[-1] - wait)
        if len(self.step_times) == self.warmup:
            self.wall_from, self.cpu_from = self.wall_to, self.cpu_to

    def rate(self, times: list[float]) -> float:
        """Samples per second over these step times."""
        return self.samples_per_step * len(times) / sum(times) if times else 0.0

    def recent(self, n: int) -> dict[str, float]:
        """The figures of the last ``n`` steps, for the log."""
        times = self.step_times[-n:]
        return {
            "perf/step_ms": 1e3 * statistics.median(times),
            "perf/samples_per_sec": self.rate(times),
            "comm/wait_ms": 1e3 * statistics.median(self.waits[-n:]),
        }

    def per_rank(self, n: int, window: int) -> list[float]:
        """This rank's figures for the per-rank log: median compute and wait ms over the last ``n``
        steps, and the straggler rule's median compute ms over the last ``window`` (0 until it is full)."""
        return [
            1e3 * statistics.median(self.computes[-n:]),
            1e3 * statistics.median(self.waits[-n:]),
            window_median_ms(self.computes, window, self.warmup) or 0.0,
        ]

    def run_medians(self) -> list[float]:
        """Median compute and wait ms over the measured steps (metrics.json's ``ranks``)."""
        computes, waits = self.computes[self.warmup :] or self.computes, self.waits[self.warmup :] or self.waits
        return [1e3 * statistics.median(computes), 1e3 * statistics.median(waits)] if computes else [0.0, 0.0]

    @property
    def cpu_seconds(self) -> float:
        return self.cpu_to - self.cpu_from

    def summary(self, cpu_seconds_all_workers: float) -> dict[str, float]:
        """metrics.json's throughput fields (``cpu_seconds_all_workers``: :attr:`cpu_seconds` summed)."""
        measured = self.step_times[self.warmup :] or self.step_times
        after = len(self.step_times) - self.warmup  # steps after warm-up
        return {
            "samples_per_sec": self.rate(measured),
            "step_ms": 1e3 * statistics.median(measured) if measured else 0.0,
            # everything between the end of warm-up and the end of the last step: what `bench` compares
            "wall_samples_per_sec": (
                self.samples_per_step * after / (self.wall_to - self.wall_from) if after > 0 else 0.0
            ),
            "cpu_ms_per_step": 1e3 * cpu_seconds_all_workers / after if after > 0 else 0.0,
            "comm_wait_ms": 1e3 * statistics.median(self.waits[self.warmup :] or self.waits) if self.waits else 0.0,
        }


class TimeToTarget:
    """Every evaluation with its wall-clock time since the first step of this invocation, and the
    first one that reaches ``--target`` (MLPerf's figure: the time a user waits for a model that good)."""

    def __init__(self, target: str) -> None:
        self.target = parse_target(target) if target else None
        self.started = time.perf_counter()
        self.evals: list[dict[str, float]] = []
        self.reached: dict[str, float] | None = None

    def record(self, step: int, epoch: float, figures: dict[str, float]) -> bool:
        """Note one evaluation; True when it is the first to reach the target."""
        row = {
            "step": step,
            "epoch": epoch,
            "seconds": time.perf_counter() - self.started,
            **{key.replace("/", "_"): v for key, v in figures.items()},
        }
        self.evals.append(row)
        if self.target is None or self.reached is not None or self.target[0] not in figures:
            return False
        metric, op, value = self.target
        if figures[metric] >= value if op == ">=" else figures[metric] <= value:
            self.reached = row
            return True
        return False

    def summary(self) -> dict[str, Any]:
        """metrics.json's ``evals`` and, with a target, ``target`` (reached or not, and when)."""
        out: dict[str, Any] = {"evals": self.evals}
        if self.target:
            metric, op, value = self.target
            out["target"] = {
                "metric": metric,
                "op": op,
                "value": value,
                "reached": self.reached is not None,
                **({key: self.reached[key] for key in ("step", "epoch", "seconds")} if self.reached else {}),
            }
        return out


def words_per_sec(task, samples_per_sec: float) -> dict[str, float]:
    """A language model's throughput in tokens (each sample is a window of ``bptt`` words)."""
    return {"perf/words_per_sec": samples_per_sec * task.words_per_sample} if task.words_per_sample else {}
