"""What the scaling grid runs: the exchange variants, each model's step plan, the grid's settings."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from ..common import costmodel, sharded

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
    commbench_impl: str  # the commbench row that calibrates it
    description: str
    method: costmodel.Method = costmodel.BASELINE  # the communication-reduction concept (docs/concepts.md)


# The exchanges the grids run by default; variants() adds the communication-reduction concepts on them
# (16-bit, PowerSGD, local SGD: docs/concepts.md), run when --strategies names them.
DEFAULT_STRATEGIES = ("allreduce", "allreduce-mpi", "ps-dedicated", "ps-colocated")
# PowerSGD's rank and local SGD's period of the concept variants: the time-to-accuracy grid's (lab/tta/spec.py:
# rank 4 matched full precision in Vogels et al.; H = 4 sends a quarter of the bytes)
POWERSGD_RANK, LOCALSGD_PERIOD = 4, 4


def concept_variants(base: Variant) -> list[Variant]:
    """The concepts a base exchange runs in the trainer (the rest it refuses): 16-bit on every exchange
    (bf16 not on Horovod), PowerSGD and local SGD on the allreduce engines, and the sharded stages on the
    allreduce engines where the trainer accepts them (``allreduce-mpi-zero2``: :func:`sharded_variants`)."""
    C = costmodel
    concepts: list[tuple[str, tuple[str, ...], costmodel.Method, str]] = [
        ("fp16", ("--compression", "fp16"), C.Method(C.FP16), "16-bit (fp16) on the wire")
    ]
    if base.strategy == "allreduce":
        if base.commbench_impl != "horovod":
            concepts.append(("bf16", ("--compression", "bf16"), C.Method(C.BF16), "16-bit (bf16) on the wire"))
        r, h = POWERSGD_RANK, LOCALSGD_PERIOD
        concepts += [
            (
                f"powersgd-r{r}",
                ("--compression", "powersgd", "--powersgd-rank", str(r)),
                C.Method(C.POWERSGD, r),
                f"PowerSGD rank {r} (error feedback, warm start)",
            ),
            (
                f"localsgd-h{h}",
                ("--average-every", str(h)),
                C.Method(every=h),
                f"local SGD, parameters averaged every {h} steps",
            ),
        ]
    return [
        Variant(
            f"{base.name}-{suffix}",
            base.strategy,
            (*base.flags, *flags),
            base.servers,
            base.kind,
            base.commbench_impl,
            f"{base.description}, {what}",
            method,
        )
        for suffix, flags, method, what in concepts
    ] + sharded_variants(base)


def sharded_variants(base: Variant) -> list[Variant]:
    """The sharded stages on an allreduce base's engine (the trainer's --strategy sharded takes the same
    --allreduce-engine), each where the trainer accepts it; the cost model prices them as the ring's
    collectives (costmodel ``Method(shard=S)``)."""
    if base.strategy != "allreduce":
        return []
    engine = base.flags[base.flags.index("--allreduce-engine") + 1] if "--allreduce-engine" in base.flags else ""
    return [
        Variant(
            f"{base.name}{sharded.suffix(stage)}",
            "sharded",
            (*base.flags, "--shard-stage", str(stage)),
            0,
            costmodel.ALLREDUCE,
            base.commbench_impl,
            f"sharded data parallel, ZeRO stage {stage}, on the engine of: {base.description}",
            costmodel.Method(shard=stage),
        )
        for stage in sharded.STAGES
        if sharded.accepted(stage, engine)
    ]


def variants(ps_servers: int = 1) -> dict[str, Variant]:
    """Every exchange the grids can run, by name: the four exchanges of DEFAULT_STRATEGIES and each one's
    concepts (``allreduce-mpi-fp16``, ``allreduce-mpi-powersgd-r4``, ``allreduce-localsgd-h4``, ...)."""
    base = _exchanges(ps_servers)
    return {**base, **{c.name: c for v in base.values() for c in concept_variants(v)}}


def _exchanges(ps_servers: int) -> dict[str, Variant]:
    k = str(ps_servers)
    return {
        v.name: v
        for v in (
            Variant("allreduce", "allreduce", (), 0, costmodel.ALLREDUCE, "horovod", "Horovod ring allreduce"),
            # the same concept on the PS's machinery: separates the concept from the implementation
            Variant(
                "allreduce-mpi",
                "allreduce",
                ("--allreduce-engine", "mpi"),
                0,
                costmodel.ALLREDUCE,
                "mpi-ring",
                "ring allreduce on mpi4py messages from gradient hooks (--allreduce-engine mpi)",
            ),
            Variant(
                "ps-dedicated",
                "ps",
                ("--ps-placement", "dedicated", "--ps-servers", k),
                ps_servers,
                costmodel.PS_DEDICATED,
                "ps-dedicated",
                f"parameter server, {k} dedicated server process(es)",
            ),
            Variant(
                "ps-colocated",
                "ps",
                ("--ps-placement", "colocated"),
                0,
                costmodel.PS_COLOCATED,
                "ps-colocated",
                "parameter server colocated with the workers (each serves 1/N)",
            ),
        )
    }


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
