"""What the time-to-accuracy grid runs: each model's target, the exchange methods, the settings."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from allreduce_train.config import TrainConfig

from ..common.jobs import EMULATED_ALLREDUCE
from ..common.methods import Method, registry


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


# The grid's methods: every method of the lab's registry (lab/common/methods.py) on the Horovod and mpi engines,
# except a 16-bit wire under a local SGD period (the concepts are compared one at a time) and the PS's bf16 but
# once (synchronous, colocated: where it meets fp16 and the ring's 16-bit methods).
ENGINES = ("horovod", "mpi")
PS_BF16 = ("ps-sync-colocated-bf16",)

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
    """The grid's methods by name: the six exchanges first, then each engine's concepts, the sharded stages and
    the PS's 16-bit methods (the registry's order)."""
    table = {
        n: m
        for n, m in registry().items()
        if (m.strategy == "ps" or m.engine in ENGINES)
        and not (m.schedule and m.wire != "none")
        and (m.wire != "bf16" or m.strategy != "ps" or n in PS_BF16)
    }
    return {**{n: table[n] for n in EXCHANGES}, **table}


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
    mpi_allreduce: str = EMULATED_ALLREDUCE  # the launcher's --mpi-allreduce for the emulated hosts (launch/mpirun.py)
    targets: dict[str, str] = field(default_factory=dict)  # model -> --target, instead of the workload's
    max_epochs: int = 0  # 0: the workload's
    evals_per_epoch: int = 4
    repeats: int = 1
    seed: int = TrainConfig.seed  # the trainer's default
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
