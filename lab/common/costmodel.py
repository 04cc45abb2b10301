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
difference is the implementation's. The sharded concept (``--strategy sharded``, ZeRO stages 1-3) runs
on the allreduce engines and is a :class:`Method` of the ring (``zero1``, ``zero2``, ``zero3``):

    sharded, stages 1-2   2(N-1) alpha      + 2(N-1)/N * S/B                 (reduce-scatter + all-gather)
    sharded, stage 3      (N-1)(2M+1) alpha + 3(N-1)/N * S/B                 (M gathered modules)

Stages 1 and 2 reduce-scatter the gradients and all-gather the updated parameters: the ring's bytes
and messages. Stage 3 gathers each of M modules' parameters twice (forward, backward): 1.5x the bytes,
and a latency per gathered module. Compute and exchange are added (no overlap), so predicted
step times are upper bounds for an exchange that overlaps the backward pass.

Communication-reduction methods (docs/concepts.md: 16-bit, PowerSGD, local SGD) change the
messages and bytes per step and add compute of their own: :class:`Method` names one (from the
trainer's flags or a label such as ``powersgd-r4``), :func:`method_cost` says what it costs on an
exchange, and :func:`predict_method` is :func:`predict` for it (the gradient given as its tensor
shapes, lab/common/gradients.py). The extra compute is charged at one core's memory bandwidth and
float32 rate (:class:`Host`), added like the exchange. Sharded stages 1-3 (``zeroS``) move the
bytes of allreduce_train/distributed/wirecost.py ``sharded_bytes_per_step``.

Calibration: :func:`fit_alpha_beta` fits alpha and B of one exchange from a size sweep (commbench)
by least squares on relative error; compute is the measured single-worker step minus its wait.
Pure Python (no MPI, no torch) so that it is cheap to test and to run anywhere.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

# The bytes-per-step formulas, the wire formats' element sizes and PowerSGD's rule of which matrices it
# compresses: the trainer's own (torch-free), so the model charges what the product sends.
from allreduce_train.distributed.wirecost import (
    SIXTEEN_BIT,
    WIRE_DTYPES,
    compressible,
    element_bytes,
    sharded_bytes_per_step,
)
from allreduce_train.distributed.wirecost import dims as _dims

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
    def from_gbit_us(cls, gbit_per_s: float, latency_us: float) -> Network:
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


def predict(
    kind: str, n: int, nbytes: float, compute_s: float, batch: int, net: Network, servers: int = 1
) -> Prediction:
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
    return Prediction(kind, n, servers if kind == PS_DEDICATED else 0, compute_s, ex, step, thr, speedup, speedup / n)


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


# ------------------------------------------------------------------------- communication-reduction methods
#
# The exchanges above move float32 gradients every step. The concepts of docs/concepts.md send
# less: 16-bit elements, low-rank factors (PowerSGD), or the full exchange every H steps only
# (local SGD). Each changes the exchange's messages and bytes per step and adds compute of its own
# (casts, matrix products, copies), which this model charges at one core's memory bandwidth and
# arithmetic rate (:class:`Host`). Step time = compute + extra compute + exchange, still without
# overlap, so a prediction is an upper bound of the same kind as :func:`predict`'s.

NONE, FP16, BF16, POWERSGD = "none", "fp16", "bf16", "powersgd"
COMPRESSIONS = tuple(WIRE_DTYPES)  # --compression's choices
CAST_BYTES = 6  # a cast of one element between float32 and 16 bits reads 4 bytes and writes 2, or reads 2 writes 4
# PowerSGD's memory traffic per gradient element (allreduce_train/distributed/powersgd.py, one step):
# add the error (read 2 x 4, write 4), clone what is sent (read 4, write 4), the new error
# = sent - result (read 2 x 4, write 4): 32 bytes for every element; a compressed matrix is then
# read by M Q and by M^T P and written by P Q^T (12 more), an uncompressed tensor is copied into the
# flat buffer and back (16 more).
POWERSGD_BYTES_ALL, POWERSGD_BYTES_MATRIX, POWERSGD_BYTES_PLAIN = 32, 12, 16
LOCALSGD_BYTES = (
    16  # local SGD's parameter sum: every parameter copied in and the average copied back (read + write 8 each)
)
# DiLoCo's outer step per parameter: the delta (read outer and local, write: 12), its sum copied in and out
# (8), Nesterov momentum and the outer update (read 3, write 2 tensors: 20) and the copy into the model (8)
DILOCO_BYTES = 48

Shape = tuple[int, ...]


@dataclass(frozen=True)
class Host:
    """What a worker's extra compute runs at: ``mem_bw`` bytes of memory traffic per second (reads
    and writes counted, one core) and ``flops`` float32 operations per second (one core, matrix
    products). The defaults are this project's 2-core build machine: commbench measured one core
    copying 5.0 GB/s (docs/scaling.md: 10 GB/s of reads and writes); 20 GFLOP/s is an assumption for
    one core's single-threaded float32 matrix products, not a measurement."""

    mem_bw: float = 10e9
    flops: float = 20e9

    def __post_init__(self) -> None:
        if not (self.mem_bw > 0 and self.flops > 0):
            raise ValueError(f"host mem_bw and flops must be > 0 (got {self.mem_bw!r}, {self.flops!r})")


HOST = Host()


@dataclass(frozen=True)
class Method:
    """A communication-reduction concept, as the trainer's flags set it: ``compression`` (none, fp16,
    bf16, powersgd: ``--compression``), ``rank`` (``--powersgd-rank``), ``every`` (local SGD's H,
    ``--average-every``; 0 and 1 both mean every step is synchronous) and ``outer`` (DiLoCo's H,
    ``--diloco-every``; 0 = off) and ``shard`` (the sharded concept's stage, ``--strategy sharded
    --shard-stage``: 1-3; 0 = not sharded)."""

    compression: str = NONE
    rank: int = 1
    every: int = 1
    outer: int = 0
    shard: int = 0

    def __post_init__(self) -> None:
        if self.compression not in COMPRESSIONS:
            raise ValueError(f"unknown compression {self.compression!r}; choose one of: {', '.join(COMPRESSIONS)}")
        if self.rank < 1:
            raise ValueError(f"PowerSGD rank must be >= 1 (got {self.rank})")
        if self.every < 0:
            raise ValueError(f"local SGD period H must be >= 0 (got {self.every})")
        if self.compression == POWERSGD and self.period > 1:
            raise ValueError(
                "PowerSGD with local SGD is not a method of the trainer (--compression powersgd "
                "refuses --average-every)"
            )
        if self.outer < 0 or (self.outer and (self.every > 1 or self.compression != NONE)):
            raise ValueError(
                "DiLoCo (--diloco-every H >= 1) sends float32 parameter deltas only: no --compression, "
                "no --average-every"
            )
        if self.shard not in (0, 1, 2, 3):
            raise ValueError(f"shard stage must be 1, 2 or 3 (0: not sharded; got {self.shard})")
        if self.shard and (self.compression == POWERSGD or self.period > 1):
            raise ValueError(
                "the sharded concept (--strategy sharded) refuses --compression powersgd, --average-every and "
                "--diloco-every: zeroS combines with fp16 or bf16 only (zero2+fp16)"
            )

    @property
    def period(self) -> int:
        """H: a full exchange every H steps (1: every step)."""
        return self.outer or max(1, self.every)

    @property
    def elem(self) -> int:
        """Bytes per gradient element on the wire (PowerSGD's factors are float32)."""
        return element_bytes(self.compression)

    @property
    def label(self) -> str:
        """A short name: ``fp32``, ``fp16``, ``bf16``, ``powersgd-r4``, ``localsgd-h4``, ``localsgd-h4+fp16``,
        ``zero2``, ``zero2+fp16``."""
        base = {NONE: "fp32", POWERSGD: f"powersgd-r{self.rank}"}.get(self.compression, self.compression)
        if self.shard:
            return f"zero{self.shard}" + ("" if self.compression == NONE else f"+{base}")
        if self.outer:
            return f"diloco-h{self.outer}"
        if self.period == 1:
            return base
        return f"localsgd-h{self.period}" + ("" if self.compression == NONE else f"+{base}")

    @classmethod
    def from_flags(
        cls, compression: str = NONE, powersgd_rank: int = 1, average_every: int = 0, diloco_every: int = 0
    ) -> Method:
        """The method of a trainer run with these flags (its config's values)."""
        return cls(compression, powersgd_rank if compression == POWERSGD else 1, max(1, average_every), diloco_every)

    @classmethod
    def parse(cls, text: str) -> Method:
        """``fp32`` (or ``none``), ``fp16``, ``bf16``, ``powersgd-rR``, ``localsgd-hH``, ``localsgd-hH+fp16``
        ``zeroS``, ``zeroS+fp16`` (as :attr:`label` writes them); ValueError otherwise."""
        t = text.strip().lower()
        if t.startswith("zero"):
            stage, sep, rest = t[len("zero") :].partition("+")
            if stage not in ("1", "2", "3"):
                raise ValueError(f"method {text!r}: the sharded concept is zero1, zero2 or zero3 (ZeRO's stages)")
            inner = cls.parse(rest) if sep else cls()
            if sep and inner.compression not in SIXTEEN_BIT:
                raise ValueError(f"method {text!r}: a sharded stage combines with fp16 or bf16 only (zero2+fp16)")
            return cls(inner.compression, shard=int(stage))
        if t.startswith("diloco-h"):
            h = t[len("diloco-h") :]
            if not h.isdigit() or int(h) < 1:
                raise ValueError(f"method {text!r}: DiLoCo is diloco-hH with H >= 1, e.g. diloco-h16")
            return cls(outer=int(h))
        every, sep, rest = t.partition("+")
        if every.startswith("localsgd-h"):
            h = every[len("localsgd-h") :]
            if not h.isdigit() or int(h) < 1:
                raise ValueError(f"method {text!r}: local SGD is localsgd-hH with H >= 1, e.g. localsgd-h4")
            inner = cls.parse(rest) if sep else cls()
            if inner.shard:
                raise ValueError(f"method {text!r}: the sharded concept refuses local SGD (--average-every)")
            return cls(inner.compression, inner.rank, int(h))
        if sep:
            raise ValueError(f"method {text!r}: only local SGD combines with another method (localsgd-h4+fp16)")
        if t in ("fp32", NONE):
            return cls()
        if t in SIXTEEN_BIT:
            return cls(t)
        if t.startswith("powersgd-r") and t[len("powersgd-r") :].isdigit():
            return cls(POWERSGD, int(t[len("powersgd-r") :]))
        raise ValueError(
            f"unknown method {text!r}; choose fp32, fp16, bf16, powersgd-rR, localsgd-hH[+fp16], diloco-hH "
            "or zeroS[+fp16] (S = 1, 2, 3)"
        )


BASELINE = Method()  # synchronous SGD, float32 on the wire


def as_shapes(grad: float | Iterable[Shape]) -> list[Shape]:
    """A gradient as a list of float32 tensor shapes; a number is taken as bytes of one float32 vector."""
    if isinstance(grad, (int, float)):
        if grad < 0:
            raise ValueError(f"gradient bytes must be >= 0 (got {grad!r})")
        return [(round(grad / 4),)]
    return [tuple(int(d) for d in s) for s in grad]


@dataclass(frozen=True)
class MethodCost:
    """A method's exchange and extra compute per step, averaged over a local SGD period.

    messages: alpha terms on the critical path; volume: bytes through the busiest link each way
    (for the ring: what each worker sends, as allreduce_train/distributed's ``bytes_per_step``);
    worker_s / server_s: extra compute on a worker and on the busiest server (seconds; both lie
    on the critical path and are added)."""

    messages: float
    volume: float
    worker_s: float
    server_s: float

    @property
    def extra_compute_s(self) -> float:
        return self.worker_s + self.server_s

    def exchange_s(self, net: Network) -> float:
        return self.messages * net.alpha + self.volume / net.bandwidth


def method_cost(
    method: Method,
    kind: str,
    n: int,
    grad: float | Iterable[Shape],
    servers: int = 1,
    host: Host = HOST,
    modules: int = 0,
) -> MethodCost:
    """What ``method`` costs per step on exchange ``kind`` with ``n`` workers, for a gradient given as
    its float32 tensor shapes (or, except for PowerSGD, its float32 bytes):

    * fp32: the exchange of :func:`coefficients`, no extra compute;
    * fp16 / bf16: half the bytes, the same messages; two casts of every element on each worker
      (narrow before, widen after), and on a parameter server the servers' casts of their share:
      N pushes widened and one reply narrowed per step (CAST_BYTES of memory traffic each);
    * PowerSGD rank r (allreduce only): two ring allreduces per step (uncompressed tensors with the
      Ps, then the Qs; the first alone where no matrix is compressed): 4(N-1) messages and
      2(N-1)/N x 4 x (sum of (n + m) r over the compressed matrices + the other tensors' elements) bytes;
      extra compute: three n x m x r products per matrix and the orthonormalisation of P and Q (flops),
      the error feedback's copies (memory);
    * local SGD every H (allreduce only): one gradient allreduce and one parameter allreduce (float32)
      per H steps, both amortised over the H steps, and the parameters copied in and out once per
      period; H = 1 is synchronous SGD: the gradients only;
    * DiLoCo every H (allreduce only): no gradient travels; one float32 allreduce of the parameter
      delta per H steps (allreduce_train/distributed/wirecost.py ``diloco_bytes_per_step``), and the
      outer step's memory traffic (DILOCO_BYTES per parameter), both amortised over the H steps;
    * sharded stage S (``zeroS``, allreduce engines only): the gradients reduce-scattered at the wire's element
      size and the float32 parameters all-gathered (wirecost ``sharded_bytes_per_step``); stages 1-2: 2(N-1)
      messages, the ring's; stage 3: (N-1) for the gradients' reduce-scatter and (N-1) per gathered module
      twice (forward, backward): (N-1)(2M+1), with M = ``modules`` (0: one per tensor of ``grad``, the most
      a model can have); 16 bits: the gradients' casts, as on the ring.
    """
    _check(kind, n, servers)
    shapes = as_shapes(grad)
    numel = sum(math.prod(s) for s in shapes)
    h = method.period
    if method.compression == POWERSGD and kind != ALLREDUCE:
        raise ValueError(f"PowerSGD runs over an allreduce only (the trainer refuses it with {kind})")
    if method.outer and kind != ALLREDUCE:
        raise ValueError(f"DiLoCo averages over an allreduce only (the trainer refuses --diloco-every with {kind})")
    if h > 1 and kind != ALLREDUCE:
        raise ValueError(f"local SGD averages over an allreduce only (the trainer refuses --average-every with {kind})")
    if method.shard and kind != ALLREDUCE:
        raise ValueError(f"the sharded concept runs on the allreduce engines' collectives, not on {kind}")
    if method.shard:
        if n == 1:  # one worker owns every shard: nothing travels, nothing is cast
            return MethodCost(0.0, 0.0, 0.0, 0.0)
        gathers = 2 * (modules or len(shapes)) if method.shard == 3 else 1
        volume = sharded_bytes_per_step(numel, n, method.shard, method.compression)
        casts = 2 * CAST_BYTES * numel / host.mem_bw if method.elem == 2 else 0.0
        return MethodCost((n - 1) * (1.0 + gathers), volume, casts, 0.0)
    if method.outer:
        if n == 1:  # one worker's average is its own delta: nothing travels
            return MethodCost(0.0, 0.0, DILOCO_BYTES * numel / host.mem_bw / h, 0.0)
        messages, volume = coefficients(ALLREDUCE, n, 4.0 * numel)
        return MethodCost(messages / h, volume / h, DILOCO_BYTES * numel / host.mem_bw / h, 0.0)
    if method.compression == POWERSGD and isinstance(grad, (int, float)):
        raise ValueError(
            "PowerSGD's cost needs the gradient's tensor shapes (which matrices it compresses), not its bytes"
        )
    if method.compression == POWERSGD:
        sent, flops, mem, sums = 0, 0.0, 0.0, 1  # sums: the Qs' allreduce only where a matrix is compressed
        for s in shapes:
            e = math.prod(s)
            if compressible(s, method.rank):
                sums = 2
                rows, cols = _dims(s)
                r = min(rows, cols, method.rank)
                sent += (rows + cols) * r
                flops += 6.0 * rows * cols * r + 4.0 * (rows + cols) * r * r
                mem += (POWERSGD_BYTES_ALL + POWERSGD_BYTES_MATRIX) * e
            else:
                sent += e
                mem += (POWERSGD_BYTES_ALL + POWERSGD_BYTES_PLAIN) * e
        messages, volume = coefficients(ALLREDUCE, n, 4.0 * sent)
        if n == 1:  # one worker sends nothing and leaves its gradient as it is
            return MethodCost(0.0, 0.0, 0.0, 0.0)
        return MethodCost(sums * messages, volume, flops / host.flops + mem / host.mem_bw, 0.0)
    messages, volume = coefficients(kind, n, numel * method.elem, servers)
    worker_s = server_s = 0.0
    if method.elem == 2 and (n > 1 or kind == PS_DEDICATED):
        worker_s = 2 * CAST_BYTES * numel / host.mem_bw
        if kind != ALLREDUCE:  # a server's share: P/K (dedicated), P/N (colocated: every worker serves)
            share = numel / (servers if kind == PS_DEDICATED else n)
            server_s = (n + 1) * CAST_BYTES * share / host.mem_bw
    if h > 1 and n > 1:
        pm, pv = coefficients(ALLREDUCE, n, 4.0 * numel)
        messages, volume = (messages + pm) / h, (volume + pv) / h
        worker_s = (worker_s + LOCALSGD_BYTES * numel / host.mem_bw) / h
    elif h > 1:
        worker_s /= h
    return MethodCost(messages, volume, worker_s, server_s)


@dataclass(frozen=True)
class MethodPrediction(Prediction):
    """:class:`Prediction` of a method: its label, extra compute (included in ``step_s``) and the
    bytes through the busiest link per step."""

    method: str
    extra_compute_s: float
    volume: float


def predict_method(
    method: Method,
    kind: str,
    n: int,
    grad: float | Iterable[Shape],
    compute_s: float,
    batch: int,
    net: Network,
    servers: int = 1,
    host: Host = HOST,
    modules: int = 0,
) -> MethodPrediction:
    """:func:`predict` for a communication-reduction ``method``: step = compute + the method's extra
    compute + its exchange (averaged over a local SGD period). ``grad``: the float32 gradient as its
    tensor shapes (a model's parameters; PowerSGD needs them), or its bytes; ``modules``: the modules sharded
    stage 3 gathers (:func:`method_cost`). For ``BASELINE`` (fp32, every step) this is
    :func:`predict`; speedup is against the same method at one worker."""
    if compute_s < 0:
        raise ValueError(f"compute time must be >= 0 (got {compute_s!r})")
    if batch < 1:
        raise ValueError(f"batch must be >= 1 (got {batch})")
    shapes = grad if isinstance(grad, (int, float)) else as_shapes(grad)
    cost = method_cost(method, kind, n, shapes, servers, host, modules)
    one = method_cost(method, kind, 1, shapes, servers, host, modules)
    ex = cost.exchange_s(net)
    step = compute_s + cost.extra_compute_s + ex
    step_one = compute_s + one.extra_compute_s + one.exchange_s(net)
    thr = n * batch / step if step > 0 else math.inf
    speedup = n * step_one / step if step > 0 else float(n)
    return MethodPrediction(
        kind,
        n,
        servers if kind == PS_DEDICATED else 0,
        compute_s,
        ex,
        step,
        thr,
        speedup,
        speedup / n,
        method.label,
        cost.extra_compute_s,
        cost.volume,
    )
