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

from . import costmodel

ENGINES = ("horovod", "mpi", "torch")
STAGES = (1, 2, 3)
PLACEMENTS = ("dedicated", "colocated")
MODES = ("sync", "async")
SIXTEEN_BIT = ("fp16", "bf16")
# PowerSGD's rank and the local SGD / DiLoCo periods the lab offers. Rank 4 matched full-precision accuracy on
# image models in Vogels et al. (rank 1-2 lose some); H = 4 and 16 bracket the periods post-local SGD (Lin et
# al. 2020) and DiLoCo-style runs use at this scale: 4 sends a quarter of the bytes, 16 a sixteenth.
POWERSGD_RANKS = (4,)
LOCALSGD_PERIODS = (4, 16)
DILOCO_PERIODS = (16,)


@dataclass(frozen=True)
class Method:
    """One way to exchange gradients: its name, the trainer's flags (``--strategy`` first) and what they are."""

    name: str
    flags: tuple[str, ...]
    strategy: str  # the trainer's --strategy: allreduce, sharded or ps
    engine: str = ""  # --allreduce-engine of a ring or sharded method; "" for the PS (its own mpi4py machinery)
    wire: str = "none"  # --compression
    rank: int = 0  # --powersgd-rank (wire powersgd)
    schedule: str = ""  # "", localsgd or diloco
    period: int = 0  # the schedule's H
    stage: int = 0  # the sharded stage, 0 otherwise
    placement: str = ""  # the PS's
    mode: str = "sync"  # the PS's
    servers: int = 0  # processes that only serve (a dedicated PS)

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
    def base(self) -> str:
        """The float32, every-step method on the same engine or placement: ``ring-mpi``, ``ps-sync-colocated``."""
        return f"ps-{self.mode}-{self.placement}" if self.strategy == "ps" else f"ring-{self.engine}"

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
        return costmodel.Method(
            costmodel.POWERSGD if self.rank else self.wire,
            self.rank or 1,
            self.period if self.schedule == "localsgd" else 1,
            self.period if self.schedule == "diloco" else 0,
            self.stage,
        )

    @property
    def description(self) -> str:
        if self.strategy == "ps":
            what = f"parameter server, {self.placement}" + (f" ({self.servers} server)" if self.servers else "")
            what += ", synchronous" if self.synchronous else ", asynchronous"
            return what + (f", push and pull as {self.wire}" if self.wire != "none" else "")
        what = f"{'sharded, ZeRO stage ' + str(self.stage) if self.stage else 'ring allreduce'}, {self.engine} engine"
        if self.rank:
            what += f", PowerSGD rank {self.rank} (error feedback, warm start)"
        elif self.wire != "none":
            what += f", gradients as {self.wire} on the wire"
        if self.schedule == "localsgd":
            what += f", local SGD: parameters averaged every {self.period} steps"
        elif self.schedule == "diloco":
            what += f", DiLoCo: an outer Nesterov step on the parameter delta averaged every {self.period} steps"
        return what


def _ring(engine: str, wire: str, rank: int, schedule: str, period: int) -> Method:
    name = f"ring-{engine}" + (f"-powersgd-r{rank}" if rank else f"-{wire}" if wire != "none" else "")
    flags: tuple[str, ...] = ("--strategy", "allreduce", "--allreduce-engine", engine)
    if wire != "none":
        flags += ("--compression", wire) + (("--powersgd-rank", str(rank)) if rank else ())
    if schedule:
        name += f"-{schedule}-h{period}"
        flags += ("--average-every" if schedule == "localsgd" else "--diloco-every", str(period))
    return Method(name, flags, "allreduce", engine, wire, rank, schedule, period)


def _sharded(engine: str, stage: int) -> Method:
    flags = ("--strategy", "sharded", "--allreduce-engine", engine, "--shard-stage", str(stage))
    return Method(f"ring-{engine}-zero{stage}", flags, "sharded", engine, stage=stage)


def _ps(mode: str, placement: str, wire: str, servers: int) -> Method:
    place = ("--ps-placement", placement) + (("--ps-servers", str(servers)) if placement == "dedicated" else ())
    flags = ("--strategy", "ps", *place, "--ps-mode", mode) + (("--compression", wire) if wire != "none" else ())
    name = f"ps-{mode}-{placement}" + (f"-{wire}" if wire != "none" else "")
    servers = servers if placement == "dedicated" else 0
    return Method(name, flags, "ps", wire=wire, placement=placement, mode=mode, servers=servers)


@functools.cache
def registry(ps_servers: int = 1) -> dict[str, Method]:
    """Every method the trainer accepts, by name, in a stable order: each engine's rings (float32, 16-bit,
    PowerSGD; every step, local SGD, DiLoCo), its sharded stages, then the parameter server's.
    ``ps_servers``: the dedicated placement's server processes."""
    wires = [("none", 0), *((w, 0) for w in SIXTEEN_BIT), *(("powersgd", r) for r in POWERSGD_RANKS)]
    schedules = [("", 0), *(("localsgd", h) for h in LOCALSGD_PERIODS), *(("diloco", h) for h in DILOCO_PERIODS)]
    out = [_ring(e, w, r, s, h) for e in ENGINES for s, h in schedules for w, r in wires]
    out += [_sharded(e, stage) for e in ENGINES for stage in STAGES]
    out += [_ps(m, p, w, ps_servers) for m in MODES for p in PLACEMENTS for w in ("none", *SIXTEEN_BIT)]
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
    name = {
        "allreduce": f"ring-{x.allreduce_engine}",
        "sharded": f"ring-{x.allreduce_engine}-zero{x.shard_stage}",
        "ps": f"ps-{ps.mode}-{ps.placement}",
    }[x.strategy]
    return registry()[name]


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


def canonical_keys(d: dict) -> dict:
    """``d`` with every key under :func:`canonical` (a result file's per-method table)."""
    return {canonical(k) if isinstance(k, str) else k: v for k, v in d.items()}


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
