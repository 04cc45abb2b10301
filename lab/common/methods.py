"""The lab's one list of exchange methods: every tool (bench, scaling, time-to-accuracy, commbench, their
reports and TensorBoard runs) names a method the same way and takes its trainer flags from here.

A method is generated from engine x wire x schedule (ring allreduce and the sharded stages) or placement x mode
x wire (the parameter server), and kept only where the trainer accepts its flags: :func:`refusal` asks the
trainer's own configuration (allreduce_train/config.py ``COMBINATIONS`` through ``build_config``), so the lab
never states by hand which combinations are valid. One naming scheme:

- ``ring-ENGINE[-WIRE][-SCHEDULE]``: ring allreduce on ``--allreduce-engine`` ENGINE (horovod, mpi, torch);
  WIRE ``fp16``, ``bf16`` (``--compression``) or ``powersgd-rR`` (rank R); SCHEDULE ``localsgd-hH``
  (``--average-every H``) or ``diloco-hH`` (``--diloco-every H``): ``ring-mpi-fp16``, ``ring-horovod-localsgd-h4``;
- ``ring-ENGINE-zeroS``: the sharded concept (ZeRO stage S, ``--strategy sharded``) on the ring's engine;
- ``ps-MODE-PLACEMENT[-WIRE]``: the parameter server, ``--ps-mode`` sync or async, ``--ps-placement``
  dedicated or colocated: ``ps-sync-colocated``, ``ps-async-dedicated-fp16``.

Results written under the lab's older names (bench ``trainer-mpi``, scaling ``allreduce-mpi``, commbench
``mpi-ring``, ...) are read under these: :func:`canonical` maps an old name to its method's.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

from allreduce_train.distributed.wirecost import SIXTEEN_BIT  # the trainer's one table of 16-bit formats

from . import costmodel

ENGINES = ("horovod", "mpi", "torch")
STAGES = (1, 2, 3)
PLACEMENTS = ("dedicated", "colocated")
MODES = ("sync", "async")
# PowerSGD's rank and the local SGD / DiLoCo periods the lab offers. Rank 4 matched full-precision accuracy on
# image models in Vogels et al. (rank 1-2 lose some); H = 4 and 16 bracket the periods post-local SGD (Lin et
# al. 2020) and DiLoCo-style runs use at this scale: 4 sends a quarter of the bytes, 16 a sixteenth.
POWERSGD_RANKS = (4,)
LOCALSGD_PERIODS = (4, 16)
DILOCO_PERIODS = (16,)


@dataclass(frozen=True)
class Method:
    """One way to exchange gradients, as the trainer's settings; its name and flags follow from them."""

    strategy: str  # the trainer's --strategy: allreduce, sharded or ps
    engine: str = ""  # --allreduce-engine of a ring or sharded method; "" for the PS (its own mpi4py machinery)
    wire: str = "none"  # --compression
    rank: int = 0  # --powersgd-rank (wire powersgd)
    schedule: str = ""  # "", localsgd (--average-every) or diloco (--diloco-every)
    period: int = 0  # the schedule's H
    stage: int = 0  # --shard-stage of a sharded method, 0 otherwise
    placement: str = ""  # the PS's --ps-placement
    mode: str = "sync"  # the PS's --ps-mode
    servers: int = 0  # --ps-servers: processes that only serve (a dedicated PS)

    @property
    def base(self) -> str:
        """The float32, every-step method on the same engine or placement: ``ring-mpi``, ``ps-sync-colocated``."""
        return f"ps-{self.mode}-{self.placement}" if self.strategy == "ps" else f"ring-{self.engine}"

    @property
    def name(self) -> str:
        wire = f"powersgd-r{self.rank}" if self.rank else self.wire
        parts = [self.base, f"zero{self.stage}" if self.stage else "", "" if wire == "none" else wire]
        return "-".join(p for p in (*parts, f"{self.schedule}-h{self.period}" if self.schedule else "") if p)

    @property
    def flags(self) -> tuple[str, ...]:
        """The trainer's flags, ``--strategy`` first."""
        out = ["--strategy", self.strategy]
        if self.strategy == "ps":
            out += ["--ps-placement", self.placement, *(["--ps-servers", str(self.servers)] if self.servers else [])]
            out += ["--ps-mode", self.mode]
        else:
            out += ["--allreduce-engine", self.engine, *(["--shard-stage", str(self.stage)] if self.stage else [])]
        if self.wire != "none":
            out += ["--compression", self.wire, *(["--powersgd-rank", str(self.rank)] if self.rank else [])]
        if self.schedule:
            out += ["--average-every" if self.schedule == "localsgd" else "--diloco-every", str(self.period)]
        return tuple(out)

    @property
    def synchronous(self) -> bool:
        return self.mode == "sync"

    @property
    def concept(self) -> str:
        """docs/concepts.md's name of what the method changes: none, fp16, bf16, powersgd, localsgd, diloco or
        sharded (a schedule over a 16-bit wire counts as its schedule)."""
        return self.schedule or ("sharded" if self.stage else self.wire)

    @property
    def param(self) -> int:
        """PowerSGD's rank, the schedule's period or the sharded stage; 0 otherwise."""
        return self.period or self.stage or self.rank

    @property
    def sync_peer(self) -> str:
        """The synchronous method an asynchronous one is compared with (same placement and wire)."""
        return self.name.replace("-async-", "-sync-")

    @property
    def sixteen_bit_allreduce(self) -> bool:
        """A 16-bit ring allreduce: the baseline a communication-reduction concept must beat (docs/concepts.md)."""
        return self.strategy == "allreduce" and self.concept in SIXTEEN_BIT

    @property
    def kind(self) -> str:
        """The cost model's exchange (lab/common/costmodel.py)."""
        if self.strategy != "ps":
            return costmodel.ALLREDUCE
        return costmodel.PS_DEDICATED if self.placement == "dedicated" else costmodel.PS_COLOCATED

    @property
    def cost(self) -> costmodel.Method:
        """The cost model's method (its concept)."""
        every, outer = (self.period, 0) if self.schedule == "localsgd" else (1, self.period)
        return costmodel.Method(
            costmodel.POWERSGD if self.rank else self.wire, self.rank or 1, every, outer, self.stage
        )

    @property
    def description(self) -> str:
        what = {"allreduce": "ring allreduce", "sharded": f"sharded, ZeRO stage {self.stage}"}.get(self.strategy)
        if what is None:
            return f"parameter server, {self.placement}, {'a' if self.mode == 'async' else ''}synchronous" + (
                f", push and pull as {self.wire}" if self.wire != "none" else ""
            )
        what += f", {self.engine} engine" + (f", gradients as {self.wire}" if self.wire != "none" else "")
        if self.rank:
            what += f" rank {self.rank} (error feedback, warm start)"
        return what + (f", {self.schedule} every {self.period} steps" if self.schedule else "")


@functools.cache
def registry(ps_servers: int = 1) -> dict[str, Method]:
    """Every method the trainer accepts, by name, in a stable order: each engine's rings (float32, 16-bit,
    PowerSGD; every step, local SGD, DiLoCo), its sharded stages, then the parameter server's.
    ``ps_servers``: the dedicated placement's server processes."""
    wires = [("none", 0), *((w, 0) for w in SIXTEEN_BIT), *(("powersgd", r) for r in POWERSGD_RANKS)]
    schedules = [("", 0), *(("localsgd", h) for h in LOCALSGD_PERIODS), *(("diloco", h) for h in DILOCO_PERIODS)]
    out = [Method("allreduce", e, w, r, s, h) for e in ENGINES for s, h in schedules for w, r in wires]
    out += [Method("sharded", e, stage=stage) for e in ENGINES for stage in STAGES]
    out += [
        Method("ps", wire=w, placement=p, mode=m, servers=ps_servers if p == "dedicated" else 0)
        for m in MODES
        for p in PLACEMENTS
        for w in ("none", *SIXTEEN_BIT)
    ]
    return {m.name: m for m in out if refusal(m.flags) is None}


def get(name: str, ps_servers: int = 1) -> Method:
    """The method called ``name`` (or an old name of it: :func:`canonical`); KeyError if the trainer has none."""
    return registry(ps_servers)[canonical(name)]


def sharded_stages(engine: str) -> list[Method]:
    """The sharded stages the trainer runs on ``engine``."""
    return [m for m in registry().values() if m.stage and m.engine == engine]


@functools.cache
def refusal(argv: tuple[str, ...]) -> str | None:
    """The trainer's one line refusing the train flags ``argv`` (on a registered model), None where it accepts
    them; a flag or value the trainer does not know (a strategy it lacks) is refused with its parser's line."""
    from allreduce_train.config import build_config
    from allreduce_train.errors import UserError

    try:
        build_config(["--model", "lenet5", *argv])
    except UserError as e:
        return str(e)
    return None


@functools.cache
def defaults() -> Method:
    """The method the trainer runs without exchange flags, read from its config's defaults: ``ring-horovod``."""
    from allreduce_train.config import ExchangeConfig, PSConfig

    x, ps = ExchangeConfig(), PSConfig()
    stage = x.shard_stage if x.strategy == "sharded" else 0
    if x.strategy == "ps":
        return Method("ps", placement=ps.placement, mode=ps.mode, servers=ps.servers)
    return Method(x.strategy, x.allreduce_engine, stage=stage)


# Older names -> the method's (prefixes: the rest of the name is kept, ``allreduce-mpi-fp16`` -> ``ring-mpi-fp16``).
# Longest first, so ``allreduce-mpi-`` wins over ``allreduce-``.
_OLD_PREFIXES = (
    ("trainer-torch", "ring-torch"),  # bench
    ("trainer-mpi", "ring-mpi"),
    ("trainer-ps", "ps-sync-colocated"),
    ("trainer-zero", "ring-horovod-zero"),
    ("allreduce-mpi", "ring-mpi"),  # scaling, paper, concept-map
    ("allreduce", "ring-horovod"),
    ("ps-dedicated", "ps-sync-dedicated"),
    ("ps-colocated", "ps-sync-colocated"),
    ("sharded", "ring"),  # bench-memory: sharded-mpi-zero2 -> ring-mpi-zero2
    ("horovod-fp16", "ring-horovod-fp16"),  # commbench
    ("mpi-ring", "ring-mpi"),
)


def canonical(name: str) -> str:
    """``name`` under the one naming scheme: an old name (bench ``trainer-mpi-zero2``, scaling
    ``allreduce-fp16``, commbench ``mpi-ring``) becomes its method's, any other name is returned as it is."""
    for old, new in _OLD_PREFIXES:
        if name == old or name.startswith(old + "-") or (old == "trainer-zero" and name.startswith(old)):
            return new + name[len(old) :]
    return name


# The fields of the lab's result files that hold a method's name (scaling and paper rows: "strategy"; tta:
# "method"; commbench: "impl"); an "hparams" or "argv" entry holds the trainer's own values and is left alone.
NAME_FIELDS = ("strategy", "method", "impl", "variant")
COMMBENCH_OLD = {"horovod": "ring-horovod"}  # commbench's Horovod row (bench's "horovod" is the bare Horovod loop)


def renamed(result: Any, extra: dict[str, str] | None = None) -> Any:
    """A result file's content (parsed JSON) with every method name under the one naming scheme, so that a run
    directory written under the older names (scaling ``allreduce-mpi``, commbench ``mpi-ring``) reads as a new
    one; ``extra``: a tool's own old names (commbench: :data:`COMMBENCH_OLD`)."""

    def name(v: Any) -> Any:
        return (extra or {}).get(v) or canonical(v) if isinstance(v, str) else v

    if isinstance(result, list):
        return [renamed(v, extra) for v in result]
    if not isinstance(result, dict):
        return result
    return {
        k: v
        if k in ("hparams", "argv")
        else name(v)
        if k in NAME_FIELDS and isinstance(v, str)
        else [name(x) for x in v]
        if k in ("strategies", "methods", "impls") and isinstance(v, list)
        else renamed(v, extra)
        for k, v in result.items()
    }
