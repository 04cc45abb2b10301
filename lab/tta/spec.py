"""What the time-to-accuracy grid runs: each model's target, the exchange methods, the settings."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from allreduce_train.distributed.wirecost import SIXTEEN_BIT

from ..common import sharded


@dataclass(frozen=True)
class Workload:
    """A model on its own real data, trained until ``target`` (the trainer's ``--target``)."""

    model: str
    dataset: str
    target: str
    max_epochs: int  # a run that has not reached the target by then stops and reports "not reached"
    what: str  # what the target is measured on, for the report
    flags: tuple[str, ...] = ()  # a user's model: the trainer flags naming it
    source: Any = None  # a user's model: its lab.common.usermodel.Workload

    def trainer_flags(self) -> list[str]:
        return list(self.flags) if self.flags else ["--model", self.model, "--dataset", self.dataset]


WORKLOADS = {
    "lenet5": Workload(
        "lenet5",
        "fashion-mnist",
        "eval/accuracy>=0.89",
        10,
        "test accuracy on the real Fashion-MNIST test set (10,000 images)",
    ),
    # The offline corpus is Python documentation, not Penn Treebank: 300 is a perplexity the small
    # LSTM passes a little after one epoch there (docs/workloads.md: 352 after 300 of 296x2 steps at 2 workers).
    "ptb-lstm-small": Workload(
        "ptb-lstm-small",
        "ptb",
        "eval/perplexity<=300",
        4,
        "validation perplexity on the offline corpus (NOT Penn Treebank; not comparable with PTB figures)",
    ),
}


@dataclass(frozen=True)
class Method:
    """One way to exchange gradients, as trainer flags, with the processes it adds beside workers."""

    name: str
    flags: tuple[str, ...]
    servers: int  # processes that only serve
    synchronous: bool
    description: str
    concept: str = "none"  # docs/concepts.md: none, fp16, bf16, powersgd, localsgd, diloco; sharded
    param: int = 0  # PowerSGD's rank r, local SGD's (DiLoCo's) period H or the sharded stage; 0 otherwise

    @property
    def sync_peer(self) -> str:
        """The synchronous method an asynchronous one is compared with (same placement)."""
        return self.name.replace("-async-", "-sync-")

    @property
    def sixteen_bit_allreduce(self) -> bool:
        """A 16-bit allreduce: the baseline a communication-reduction concept must beat (docs/concepts.md)."""
        return self.name.startswith("ring-") and self.concept in SIXTEEN_BIT


# PowerSGD's rank and local SGD's periods in the grid. Rank 4 is the rank Vogels et al. found to match
# full-precision accuracy on their image models (rank 1-2 lose some); H = 4 and 16 bracket the periods
# post-local SGD (Lin et al. 2020) and DiLoCo-style runs use at this scale: 4 sends a quarter of the
# bytes, 16 a sixteenth, at a growing cost in drift between the workers.
POWERSGD_RANKS = (4,)
LOCALSGD_PERIODS = (4, 16)
DILOCO_PERIODS = (16,)  # beside local SGD's longer period: the outer optimizer is what differs

# Method groups --methods accepts besides names: the original six exchanges, and the concepts with their baseline.
EXCHANGES = (
    "ring-horovod",
    "ring-mpi",
    "ps-sync-dedicated",
    "ps-async-dedicated",
    "ps-sync-colocated",
    "ps-async-colocated",
)


def methods() -> dict[str, Method]:
    ps = ("--strategy", "ps")
    engines = {
        "horovod": ("--strategy", "allreduce", "--allreduce-engine", "horovod"),
        "mpi": ("--strategy", "allreduce", "--allreduce-engine", "mpi"),
    }
    placements = {
        "dedicated": (("--ps-placement", "dedicated", "--ps-servers", "1"), 1, "1 dedicated server"),
        "colocated": (("--ps-placement", "colocated"), 0, "colocated with the workers"),
    }
    out = [
        Method("ring-horovod", engines["horovod"], 0, True, "ring allreduce, Horovod"),
        Method(
            "ring-mpi",
            engines["mpi"],
            0,
            True,
            "ring allreduce on mpi4py messages from gradient hooks (the PS's machinery)",
        ),
    ]
    for mode in ("sync", "async"):
        for place in ("dedicated", "colocated"):
            flags, servers, what = placements[place]
            out.append(
                Method(
                    f"ps-{mode}-{place}",
                    (*ps, *flags, "--ps-mode", mode),
                    servers,
                    mode == "sync",
                    f"parameter server, {what}, {'synchronous' if mode == 'sync' else 'asynchronous'}",
                )
            )
    out = sorted(out, key=lambda m: EXCHANGES.index(m.name))
    # The concepts (docs/concepts.md). 16-bit allreduce: Horovod has no bfloat16 allreduce.
    for engine, bits in (("horovod", ("fp16",)), ("mpi", ("fp16", "bf16"))):
        for b in bits:
            out.append(
                Method(
                    f"ring-{engine}-{b}",
                    (*engines[engine], "--compression", b),
                    0,
                    True,
                    f"ring allreduce, {engine} engine, gradients as {b} on the wire",
                    b,
                )
            )
    for engine in engines:
        for r in POWERSGD_RANKS:
            out.append(
                Method(
                    f"ring-{engine}-powersgd-r{r}",
                    (*engines[engine], "--compression", "powersgd", "--powersgd-rank", str(r)),
                    0,
                    True,
                    f"PowerSGD rank {r} (error feedback, warm start) over the {engine} engine's sums",
                    "powersgd",
                    r,
                )
            )
        for h in LOCALSGD_PERIODS:
            out.append(
                Method(
                    f"ring-{engine}-localsgd-h{h}",
                    (*engines[engine], "--average-every", str(h)),
                    0,
                    True,
                    f"local SGD: parameters averaged every {h} steps over the {engine} engine (float32)",
                    "localsgd",
                    h,
                )
            )
        for h in DILOCO_PERIODS:
            out.append(
                Method(
                    f"ring-{engine}-diloco-h{h}",
                    (*engines[engine], "--diloco-every", str(h)),
                    0,
                    True,
                    f"DiLoCo: an outer Nesterov step on the parameter delta averaged every {h} steps "
                    f"over the {engine} engine (float32)",
                    "diloco",
                    h,
                )
            )
    # The sharded concept (ZeRO stages 1-3) on each allreduce engine, where the trainer accepts it: the ring
    # method's name plus the stage (lab/common/sharded.py)
    for engine in engines:
        for stage in sharded.STAGES:
            if sharded.accepted(stage, engine):
                out.append(
                    Method(
                        f"ring-{engine}{sharded.suffix(stage)}",
                        sharded.flags(stage, engine),
                        0,
                        True,
                        f"sharded data parallel, ZeRO stage {stage}, on the {engine} engine's reduce-scatter and "
                        "all-gather",
                        "sharded",
                        stage,
                    )
                )
    for mode in ("sync", "async"):
        for place in ("dedicated", "colocated"):
            flags, servers, what = placements[place]
            for b in ("fp16", "bf16") if (mode, place) == ("sync", "colocated") else ("fp16",):
                out.append(
                    Method(
                        f"ps-{mode}-{place}-{b}",
                        (*ps, *flags, "--ps-mode", mode, "--compression", b),
                        servers,
                        mode == "sync",
                        f"parameter server, {what}, {'synchronous' if mode == 'sync' else 'asynchronous'}, "
                        f"push and pull as {b}",
                        b,
                    )
                )
    return {m.name: m for m in out}


def method_groups() -> dict[str, list[str]]:
    """Names --methods expands: ``exchanges`` (the six without a concept, the default), ``concepts`` (every
    allreduce method: float32, the 16-bit baseline, PowerSGD, local SGD; and the PS's 16-bit methods),
    ``sharded`` (the sharded stages beside the float32 ring on each engine), ``all``."""
    table = methods()
    concepts = [n for n, m in table.items() if m.name.startswith("ring-") and m.concept != "sharded"]
    concepts += [n for n, m in table.items() if m.name.startswith("ps-") and m.concept != "none"]
    zero = [n for n, m in table.items() if m.concept == "sharded"]
    rings = [n for n in ("ring-horovod", "ring-mpi") if any(z.startswith(n + "-") for z in zero)]
    return {"exchanges": list(EXCHANGES), "concepts": concepts, "sharded": [*rings, *zero], "all": list(table)}


@dataclass
class TtaConfig:
    models: list[str] = field(default_factory=lambda: list(WORKLOADS))
    methods: list[str] = field(default_factory=lambda: list(EXCHANGES))
    workers: list[int] = field(default_factory=lambda: [1, 2, 4])
    emulate_from: int = 4  # worker counts from this one up run on emulated hosts (0: never)
    rates: list[str] = field(default_factory=lambda: ["1gbit"])  # the emulated hosts' link rates: one row each
    mpi_allreduce: str = "ring"  # the launcher's --mpi-allreduce for the emulated hosts (launch/mpirun.py)
    targets: dict[str, str] = field(default_factory=dict)  # model -> --target, instead of the workload's
    max_epochs: int = 0  # 0: the workload's
    evals_per_epoch: int = 4
    repeats: int = 1
    seed: int = 42
    out_dir: str = ""
    recipe: list[str] = field(default_factory=list)  # the trainer's recipe flags for every job (lab/common/recipe.py)
    extra: list[str] = field(default_factory=list)
    job_timeout: float = 3600.0
    own: dict[str, Workload] = field(default_factory=dict)  # a user's models (--model/--task MODULE:CALLABLE)

    def workload(self, model: str) -> Workload:
        return self.own.get(model) or WORKLOADS[model]

    def target(self, model: str) -> str:
        return self.targets.get(model) or self.workload(model).target

    def epochs(self, model: str) -> int:
        return self.max_epochs or self.workload(model).max_epochs

    def emulated(self, workers: int) -> bool:
        return bool(self.emulate_from) and workers >= self.emulate_from


class TtaError(Exception):
    """Bad input; the message names the flag."""
