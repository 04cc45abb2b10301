"""Stragglers: naming the rank whose own computation holds every step back.

In a synchronous exchange every step waits for the slowest worker, so step times are the same on
every rank and cannot tell which one is slow. What differs is how a step's time splits between
the two figures each worker measures for itself (:class:`~allreduce_train.trainer.Throughput`):

* **wait**: the wall time from the end of backward until the averaged gradients (and the step's
  vote, started before the last backward) are back -- ``synchronize`` + ``end_vote``;
* **compute**: the rest of the step -- the batch's move to the device, forward and backward, the
  optimizer step and clipping after the exchange, everything but waiting for peers.

What that means per engine (the exchange code that runs inside backward counts as compute):

* Horovod: backward's hooks only enqueue each gradient's allreduce; Horovod's background thread
  moves it while backward goes on. Compute is backward with that overlap (the thread's CPU use
  included, on shared cores); wait is what is still in flight after backward, usually the last
  layers' gradients and whatever a slower peer has not yet sent.
* ``--allreduce-engine mpi``: the hooks start each bucket's ring and advance the rings in flight
  (non-blocking tests, the adding of partial sums that have arrived): compute; the rest of the
  rings after backward: wait.
* ``--strategy ps``: the hooks push each bucket (and a colocated rank serves its shard between
  layers): compute; waiting for the servers' replies (serving meanwhile): wait. Dedicated server
  ranks run no steps and are not measured.

On a GPU the vote copies the loss to the host, which waits for backward's kernels, and the
trainer already synchronises the device at the end of every step: both figures are the GPU's
without another synchronisation (not run on a GPU here).

A worker slowed by its own computation (thermal throttling, a noisy neighbour, a slower CPU) shows
a larger compute figure, and its peers wait for it. A worker slowed by its network link shows no
larger compute: every worker of the ring waits for the transfer, so every wait grows and nobody is
named (the per-rank ``perf/wait_ms`` shows it; docs/faults.md).

The rule (:class:`StragglerRule`): at every ``--log-every`` step, once ``--straggler-window``
steps after the throughput warm-up have been measured, each worker contributes the median of its
compute time over its last ``--straggler-window`` steps. A worker is slow at that check when its
median is at least ``--straggler-factor`` times the median of the other workers' medians, and a
straggler when it was slow at every check for ``--straggler-window`` steps more: persistently,
for at least twice the window. It is named once, in one line, with its global rank and host. A
median over the window needs more than half of the window's steps to be slow, and the second
window a slowdown that lasts: one long step (a page fault, a garbage collection) or a burst of
them (another job on the host for a while, the scheduler favouring one process for some
seconds) names nobody.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass


def slow_workers(compute_ms: Sequence[float], factor: float) -> list[tuple[int, float]]:
    """The workers whose figure is at least ``factor`` times the median of the others' figures,
    each with that median; nobody with fewer than two workers or with ``factor`` 0 (off)."""
    n = len(compute_ms)
    if factor <= 0 or n < 2:
        return []
    order = sorted(range(n), key=compute_ms.__getitem__)
    ranked = [compute_ms[i] for i in order]

    def without(k: int, j: int) -> float:  # the j-th smallest figure once the k-th smallest is left out
        return ranked[j] if j < k else ranked[j + 1]

    found = []
    for k, i in enumerate(order):  # one sort for all: the others' median is the sorted list less one
        half = (n - 1) // 2
        others = without(k, half) if (n - 1) % 2 else (without(k, half - 1) + without(k, half)) / 2
        if others > 0 and compute_ms[i] >= factor * others:
            found.append((i, others))
    return sorted(found)


@dataclass(frozen=True)
class Straggler:
    """One straggler, as the log line and metrics.json's ``stragglers`` report it."""

    rank: int  # global rank
    host: str
    since: int  # the first step of the first window in which it was slow
    step: int  # the step at which the rule fired
    compute_ms: float  # the straggler's median compute time per step over the window ending at ``step``
    others_ms: float  # the median of the other workers' medians over that window

    @property
    def ratio(self) -> float:
        return self.compute_ms / self.others_ms

    def line(self) -> str:
        return (
            f"straggler: rank {self.rank} on host {self.host} computes {self.compute_ms:.1f} ms per step, "
            f"{self.ratio:.2f}x the other ranks' median {self.others_ms:.1f} ms (slow since step {self.since}, "
            f"checked at step {self.step}); every step waits for it"
        )

    def record(self) -> dict[str, float | int | str]:
        return {**asdict(self), "ratio": self.ratio}


class StragglerRule:
    """The rule of the module docstring over the workers ``ranks`` (global ranks, by worker index)
    on ``hosts``; :meth:`check` returns each straggler the first time only."""

    def __init__(self, factor: float, window: int, ranks: Sequence[int], hosts: Sequence[str]) -> None:
        self.factor, self.window = factor, window
        self.ranks, self.hosts = list(ranks), list(hosts)
        self.slow_from: dict[int, int] = {}  # worker -> the first check of its current run of slow checks
        self.found: list[Straggler] = []

    def check(self, step: int, window_compute_ms: Sequence[float]) -> list[Straggler]:
        """``window_compute_ms``: each worker's median compute time over the window ending at ``step``."""
        slow = dict(slow_workers(window_compute_ms, self.factor))
        self.slow_from = {i: self.slow_from.get(i, step) for i in slow}
        named = {s.rank for s in self.found}
        new = [
            Straggler(self.ranks[i], self.hosts[i], first - self.window + 1, step, window_compute_ms[i], slow[i])
            for i, first in self.slow_from.items()
            if step - first >= self.window and self.ranks[i] not in named
        ]
        self.found += new
        return new


def window_median_ms(compute_s: Sequence[float], window: int, warmup: int) -> float | None:
    """A worker's figure for the rule: the median of its last ``window`` compute times (seconds per
    step, oldest first) in ms; None until ``window`` steps after the first ``warmup`` were measured."""
    if window < 1 or len(compute_s) - warmup < window:
        return None
    return 1e3 * statistics.median(compute_s[-window:])


def scan(
    compute_s: Sequence[Sequence[float]], factor: float, window: int, every: int, warmup: int = 0
) -> list[Straggler]:
    """The rule over whole per-worker series of compute seconds per step (``compute_s[w][t]``),
    checked every ``every`` steps as the trainer checks it at ``--log-every``: whom it names, in
    order. Worker ``w`` is rank ``w`` on host ``host<w>``."""
    n = len(compute_s)
    rule = StragglerRule(factor, window, range(n), [f"host{w}" for w in range(n)])
    for step in range(every, len(compute_s[0]) + 1, every):
        medians = [m for s in compute_s if (m := window_median_ms(s[:step], window, warmup)) is not None]
        if len(medians) == n:  # every series past its warm-up (they are equally long)
            rule.check(step, medians)
    return rule.found
