"""What the scaling grid runs: the exchange variants, each model's step plan, the grid's settings."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from ..common import costmodel, methods

DEFAULT_MODELS = ("lenet5", "ptb-lstm-small", "resnet18")
DEFAULT_WORKERS = (1, 2)
REPORT_WORKERS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)


@dataclass(frozen=True)
class Variant:
    """One way to exchange gradients, as trainer flags, with the processes it adds beside workers."""

    name: str
    strategy: str  # the trainer's --strategy
    flags: tuple[str, ...]
    servers: int  # processes that only serve
    kind: str  # the cost model's exchange
    commbench_impl: str  # the commbench row that calibrates it: the float32 method on the same engine or placement
    description: str
    method: costmodel.Method = costmodel.BASELINE  # the communication-reduction concept (docs/concepts.md)


# The exchanges the grids run by default; variants() adds the communication-reduction concepts on them
# (16-bit, PowerSGD, local SGD, DiLoCo, the sharded stages: docs/concepts.md), run when --strategies names them.
DEFAULT_STRATEGIES = ("ring-horovod", "ring-mpi", "ps-sync-dedicated", "ps-sync-colocated")


def offered(m: methods.Method) -> bool:
    """Whether the grid runs registry method ``m``: what commbench calibrates (the Horovod and mpi rings, the
    synchronous PS: the cost model has no asynchronous PS), one concept at a time (no 16-bit wire under a
    period)."""
    return (m.engine in ("horovod", "mpi") or (m.strategy == "ps" and m.synchronous)) and not (
        m.schedule and m.wire != "none"
    )


def variant(m: methods.Method) -> Variant:
    """The grid's variant of registry method ``m`` (its flags after ``--strategy``, which the grid adds)."""
    return Variant(m.name, m.strategy, m.flags[2:], m.servers, m.kind, m.base, m.description, m.cost)


def variants(ps_servers: int = 1) -> dict[str, Variant]:
    """Every exchange the grids can run, by name (lab/common/methods.py's scheme): the four of
    DEFAULT_STRATEGIES and each one's concepts (``ring-mpi-fp16``, ``ring-mpi-powersgd-r4``,
    ``ring-horovod-localsgd-h4``, ``ring-mpi-zero2``, ``ps-sync-colocated-fp16``, ...)."""
    table = {n: variant(m) for n, m in methods.registry(ps_servers).items() if offered(m)}
    return {**{n: table[n] for n in DEFAULT_STRATEGIES}, **table}


@dataclass(frozen=True)
class Plan:
    """Per-model job settings that keep one job at a few seconds on one core."""

    batch_size: int
    warmup: int
    steps: int  # measured steps, after the warm-up
    samples: int  # synthetic samples (a tenth is the evaluation set scored at the end of the job)


PLANS = {
    "lenet5": Plan(batch_size=64, warmup=10, steps=40, samples=6400),
    "ptb-lstm-small": Plan(batch_size=20, warmup=3, steps=12, samples=400),
    "resnet18": Plan(batch_size=8, warmup=2, steps=8, samples=320),
}
FALLBACK_PLAN = Plan(batch_size=16, warmup=3, steps=10, samples=512)


@dataclass
class GridConfig:
    strategies: list[str] = field(default_factory=lambda: list(DEFAULT_STRATEGIES))
    models: list[str] = field(default_factory=lambda: list(DEFAULT_MODELS))
    workers: list[int] = field(default_factory=lambda: list(DEFAULT_WORKERS))
    repeats: int = 3
    data: str = "synthetic"  # or "real": each model's own dataset
    steps: int = 0  # 0: the model's plan
    warmup_steps: int = -1  # -1: the model's plan
    batch_size: int = 0  # 0: the model's plan
    ps_servers: int = 1
    out_dir: str = ""
    commbench: bool = True
    commbench_sizes: str = "4K,64K,1M,4M,16M"
    calibration: str = ""  # an existing commbench.json instead of running one
    net_gbps: float = 10.0
    net_latency_us: float = 50.0
    horovod_cycle_ms: str = "auto"  # "auto": the fastest in the calibration commbench; "default": Horovod's
    horovod_fusion_mb: float = -1.0
    extra: list[str] = field(default_factory=list)
    job_timeout: float = 900.0
    link_rate: str = ""  # the emulated cluster's link rate (scaling-netns), "" on this host

    def plan(self, model: str) -> Plan:
        p = PLANS.get(model, FALLBACK_PLAN)
        return Plan(
            self.batch_size or p.batch_size,
            p.warmup if self.warmup_steps < 0 else self.warmup_steps,
            self.steps or p.steps,
            p.samples,
        )

    def validate(self) -> None:
        """Raise :class:`GridError` naming the flag of the first bad field."""
        self.strategies = [methods.canonical(s) for s in self.strategies]  # an old name (allreduce-mpi) still runs
        unknown = [s for s in self.strategies if s not in variants()]
        if unknown:
            raise GridError(f"--strategies: unknown strategy {unknown[0]!r}; choose from: {', '.join(variants())}")
        if any(n < 1 for n in self.workers):
            raise GridError(f"--workers: counts must be >= 1 (got {','.join(map(str, self.workers))})")
        for flag, v, lo in (
            ("--repeats", self.repeats, 1),
            ("--steps", self.steps, 0),
            ("--batch-size", self.batch_size, 0),
            ("--ps-servers", self.ps_servers, 1),
        ):
            if v < lo:
                raise GridError(f"{flag} must be >= {lo} (got {v})")
        if self.warmup_steps < -1:
            raise GridError(f"--warmup-steps must be >= 0 (got {self.warmup_steps})")
        if self.net_gbps <= 0 or self.net_latency_us < 0:
            raise GridError("--net-gbps must be > 0 and --net-latency-us >= 0")
        if self.calibration and not os.path.isfile(self.calibration):
            raise GridError(
                f"--calibration {self.calibration}: file not found; run `python -m "
                "lab commbench --np 2` and pass its commbench.json"
            )


class GridError(Exception):
    """Bad grid input; the message names the flag."""


def parse_list(text: str, flag: str, conv=str) -> list:
    """A comma-separated flag value as a list (``conv`` per item); GridError naming ``flag`` otherwise."""
    try:
        vals = [conv(v.strip()) for v in text.split(",") if v.strip()]
    except ValueError:
        raise GridError(f"{flag}: cannot read {text!r}; give a comma-separated list") from None
    if not vals:
        raise GridError(f"{flag}: empty list")
    return vals
