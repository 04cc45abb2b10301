"""An alpha-beta cost model of one data-parallel training step, calibrated from measurements.

    step time = compute + exchange(N, S)

with N workers, S bytes of gradient per worker, alpha seconds per message (latency, counted on the
busiest endpoint) and B bytes/s per link (each process has one full-duplex link):

    ring allreduce        2(N-1) alpha      + 2(N-1)/N * S/B
    PS, K dedicated       2 max(K, N) alpha + 2 max(S/B, N*S/(K*B))      (push + pull)
    PS, colocated         2(N-1) alpha      + 2(N-1)/N * S/B

A dedicated server receives N shards of S/K bytes and sends as many back, so its link carries
N*S/K each way while a worker's carries S: whichever is larger bounds the exchange. A colocated
PS (every worker serves 1/N of the parameters) is an all-to-all reduce followed by an all-gather:
the same bytes and messages as the ring, so the model cannot tell them apart; any measured
difference is the implementation's. Compute and exchange are added (no overlap), so predicted
step times are upper bounds for an exchange that overlaps the backward pass.

Calibration: :func:`fit_alpha_beta` fits alpha and B of one exchange from a size sweep (commbench)
by least squares on relative error; compute is the measured single-worker step minus its wait.
Pure Python (no MPI, no torch) so that it is cheap to test and to run anywhere.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable

ALLREDUCE = "allreduce"
PS_DEDICATED = "ps-dedicated"
PS_COLOCATED = "ps-colocated"
KINDS = (ALLREDUCE, PS_DEDICATED, PS_COLOCATED)


@dataclass(frozen=True)
class Network:
    """Per-message latency ``alpha`` (seconds) and per-link bandwidth ``bandwidth`` (bytes/s)."""

    alpha: float
    bandwidth: float

    def __post_init__(self) -> None:
        if not (self.alpha >= 0 and math.isfinite(self.alpha)):
            raise ValueError(f"alpha must be a finite number >= 0 (got {self.alpha!r})")
        if not (self.bandwidth > 0):
            raise ValueError(f"bandwidth must be > 0 (got {self.bandwidth!r})")

    @classmethod
    def from_gbit_us(cls, gbit_per_s: float, latency_us: float) -> "Network":
        """A network given as link speed in Gbit/s and latency in microseconds (the CLI's units)."""
        return cls(alpha=latency_us * 1e-6, bandwidth=gbit_per_s * 1e9 / 8)


def _check(kind: str, n: int, servers: int) -> None:
    if kind not in KINDS:
        raise ValueError(f"unknown exchange {kind!r}; choose one of: {', '.join(KINDS)}")
    if n < 1:
        raise ValueError(f"workers must be >= 1 (got {n})")
    if kind == PS_DEDICATED and servers < 1:
        raise ValueError(f"a dedicated PS needs servers >= 1 (got {servers})")


def coefficients(kind: str, n: int, nbytes: float, servers: int = 1) -> tuple[float, float]:
    """(messages, bytes) on the critical path: exchange time = messages*alpha + bytes/B."""
    _check(kind, n, servers)
    if kind == PS_DEDICATED:
        return 2.0 * max(servers, n), 2.0 * max(nbytes, n * nbytes / servers)
    # ring allreduce and colocated PS: reduce-scatter + all-gather, N-1 rounds each
    return 2.0 * (n - 1), 2.0 * (n - 1) / n * nbytes


def exchange_time(kind: str, n: int, nbytes: float, net: Network, servers: int = 1) -> float:
    """Seconds to exchange ``nbytes`` of gradient among ``n`` workers with exchange ``kind``."""
    messages, volume = coefficients(kind, n, nbytes, servers)
    return messages * net.alpha + volume / net.bandwidth


def bus_factor(kind: str, n: int, servers: int = 1) -> float:
    """busbw / algbw: the bytes the bottleneck link carries per byte of gradient.

    For allreduce this is nccl-tests' 2(N-1)/N, so bus bandwidth is comparable with link speed
    across N; the PS factors follow the same rule from the formulas above.
    """
    return coefficients(kind, n, 1.0, servers)[1]


@dataclass(frozen=True)
class Prediction:
    kind: str
    workers: int
    servers: int
    compute_s: float
    exchange_s: float
    step_s: float
    samples_per_sec: float
    speedup: float
    efficiency: float


def predict(kind: str, n: int, nbytes: float, compute_s: float, batch: int, net: Network,
            servers: int = 1) -> Prediction:
    """Throughput and scaling of ``n`` workers, each processing ``batch`` samples per step.

    Speedup is against the same exchange with one worker (which for a dedicated PS still pays
    its push and pull), as in the measured figures.
    """
    if compute_s < 0:
        raise ValueError(f"compute time must be >= 0 (got {compute_s!r})")
    if batch < 1:
        raise ValueError(f"batch must be >= 1 (got {batch})")
    ex = exchange_time(kind, n, nbytes, net, servers)
    step = compute_s + ex
    one = compute_s + exchange_time(kind, 1, nbytes, net, servers)
    thr = n * batch / step if step > 0 else math.inf
    speedup = n * one / step if step > 0 else float(n)
    return Prediction(kind, n, servers if kind == PS_DEDICATED else 0, compute_s, ex, step, thr,
                      speedup, speedup / n)


def fit_alpha_beta(kind: str, n: int, points: Iterable[tuple[float, float]], servers: int = 1) -> Network:
    """Least-squares alpha and B from (bytes, seconds) measurements of one exchange at ``n`` workers.

    Minimises the squared *relative* error, so a sweep from kilobytes (latency-bound) to hundreds
    of megabytes (bandwidth-bound) constrains both parameters. A negative latency fit (noise on
    tiny messages) is clamped to zero and B refitted alone.
    """
    rows = []  # time = a*alpha + c*(1/B), weighted by 1/time
    for nbytes, t in points:
        if t <= 0 or nbytes <= 0:
            raise ValueError(f"measurements must be positive (got {nbytes!r} bytes in {t!r} s)")
        a, c = coefficients(kind, n, nbytes, servers)
        rows.append((a / t, c / t))
    if not rows:
        raise ValueError("no measurements to fit")
    if all(c == 0 for _, c in rows):
        raise ValueError(f"{kind} at {n} worker(s) moves no bytes; measure with at least 2 workers")
    saa = sum(a * a for a, _ in rows)
    scc = sum(c * c for _, c in rows)
    sac = sum(a * c for a, c in rows)
    sa = sum(a for a, _ in rows)  # the weighted targets are all 1
    sc = sum(c for _, c in rows)
    det = saa * scc - sac * sac
    alpha, inv_b = -1.0, 0.0
    if det > 1e-12 * max(saa * scc, 1e-300):
        alpha = (sa * scc - sc * sac) / det
        inv_b = (saa * sc - sac * sa) / det
    if alpha < 0:
        alpha, inv_b = 0.0, sc / scc
    elif inv_b <= 0:  # no size dependence measurable: pure latency, unbounded bandwidth
        alpha, inv_b = sa / saa, 0.0
    return Network(alpha=alpha, bandwidth=1.0 / inv_b if inv_b > 0 else math.inf)
