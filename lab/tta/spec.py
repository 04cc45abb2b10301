"""What the time-to-accuracy grid runs: each model's target, the exchange methods, the settings."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Workload:
    """A model on its own real data, trained until ``target`` (the trainer's ``--target``)."""

    model: str
    dataset: str
    target: str
    max_epochs: int  # a run that has not reached the target by then stops and reports "not reached"
    what: str  # what the target is measured on, for the report


WORKLOADS = {
    "lenet5": Workload("lenet5", "fashion-mnist", "eval/accuracy>=0.89", 10,
                       "test accuracy on the real Fashion-MNIST test set (10,000 images)"),
    # The offline corpus is Python documentation, not Penn Treebank: 300 is a perplexity the small
    # LSTM passes a little after one epoch there (docs/workloads.md: 352 after 300 of 296x2 steps at 2 workers).
    "ptb-lstm-small": Workload("ptb-lstm-small", "ptb", "eval/perplexity<=300", 4,
                               "validation perplexity on the offline corpus (NOT Penn Treebank; not comparable "
                               "with PTB figures)"),
}


@dataclass(frozen=True)
class Method:
    """One way to exchange gradients, as trainer flags, with the processes it adds beside workers."""

    name: str
    flags: tuple[str, ...]
    servers: int  # processes that only serve
    synchronous: bool
    description: str

    @property
    def sync_peer(self) -> str:
        """The synchronous method an asynchronous one is compared with (same placement)."""
        return self.name.replace("-async-", "-sync-")


def methods() -> dict[str, Method]:
    ps = ("--strategy", "ps")
    out = [
        Method("ring-horovod", ("--strategy", "allreduce", "--allreduce-engine", "horovod"), 0, True,
               "ring allreduce, Horovod"),
        Method("ring-mpi", ("--strategy", "allreduce", "--allreduce-engine", "mpi"), 0, True,
               "ring allreduce on mpi4py messages from gradient hooks (the PS's machinery)"),
        Method("ps-sync-dedicated", (*ps, "--ps-placement", "dedicated", "--ps-servers", "1", "--ps-mode", "sync"), 1,
               True, "parameter server, 1 dedicated server, synchronous"),
        Method("ps-async-dedicated", (*ps, "--ps-placement", "dedicated", "--ps-servers", "1", "--ps-mode", "async"),
               1, False, "parameter server, 1 dedicated server, asynchronous"),
        Method("ps-sync-colocated", (*ps, "--ps-placement", "colocated", "--ps-mode", "sync"), 0, True,
               "parameter server colocated with the workers, synchronous"),
        Method("ps-async-colocated", (*ps, "--ps-placement", "colocated", "--ps-mode", "async"), 0, False,
               "parameter server colocated with the workers, asynchronous"),
    ]
    return {m.name: m for m in out}


@dataclass
class TtaConfig:
    models: list[str] = field(default_factory=lambda: list(WORKLOADS))
    methods: list[str] = field(default_factory=lambda: list(methods()))
    workers: list[int] = field(default_factory=lambda: [1, 2, 4])
    emulate_from: int = 4  # worker counts from this one up run on emulated hosts (0: never)
    link_rate: str = "1gbit"
    mpi_allreduce: str = "ring"  # the launcher's --mpi-allreduce for the emulated hosts (launch/mpirun.py)
    targets: dict[str, str] = field(default_factory=dict)  # model -> --target, instead of the workload's
    max_epochs: int = 0  # 0: the workload's
    evals_per_epoch: int = 4
    repeats: int = 1
    seed: int = 42
    out_dir: str = ""
    extra: list[str] = field(default_factory=list)
    job_timeout: float = 3600.0

    def target(self, model: str) -> str:
        return self.targets.get(model) or WORKLOADS[model].target

    def epochs(self, model: str) -> int:
        return self.max_epochs or WORKLOADS[model].max_epochs

    def emulated(self, workers: int) -> bool:
        return bool(self.emulate_from) and workers >= self.emulate_from


class TtaError(Exception):
    """Bad input; the message names the flag."""
