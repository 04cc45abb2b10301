"""One typed configuration tree for a training run.

Each section is a small dataclass; every field carries its help text in ``metadata`` and the
command-line flags are generated from the fields (``--batch-size`` for ``data.batch_size``) by the
launchers' own generator, launch/specflags.py (standard library only). Each
exchange engine has a section of its own, read by that engine only (``[horovod]``, ``[mpi]``,
``[ps]``), whose flags carry the section's name (``--ps-servers`` for ``ps.servers``).
Values come from, in increasing priority: the defaults (which run on a CPU laptop), an optional
TOML file (``--config run.toml`` with one table per section), and the command line.
Validation lives in each section's ``__post_init__`` and raises :class:`ConfigError` naming the
flag to fix, so a bad value fails before any process group is formed.
"""

from __future__ import annotations

import argparse
import dataclasses
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, NoReturn, get_type_hints

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - the project targets 3.11; tomli is its backport
    import tomli as tomllib

from launch.specflags import add_flag, choices, flag, option

from .errors import ConfigError

DEFAULT_FASHION_MNIST_DIR = "/usr/share/datasets/fashion-mnist"
DATASETS = ("fashion-mnist", "ptb", "synthetic")
STRATEGIES = ("allreduce", "ps", "sharded", "none")  # distributed.create_exchange builds each
SHARD_STAGES = (1, 2, 3)  # --shard-stage: what of the training state --strategy sharded cuts into shards


def _f(default: Any, help: str, choices: tuple | None = None) -> Any:
    """A config field and its flag (launch/specflags.py generates the flags; a list is a fresh one per config)."""
    return option(default, help, choices=choices)


def key(section: Any, name: str) -> str:
    """A field's name as its flag spells it: an engine section's fields carry the section's name
    (``ps.servers`` -> ``ps_servers``, the flag ``--ps-servers``), the others' do not."""
    prefix = getattr(section, "prefix", "")
    return f"{prefix}_{name}" if prefix else name


def _check(cond: bool, name: str, what: str, value: Any) -> None:
    if not cond:
        raise ConfigError(f"{flag(name)} {what} (got {value!r})")


def _check_choices(section: Any) -> None:
    """Every field with ``choices`` in its metadata holds one of them (a TOML file bypasses argparse)."""
    for f in dataclasses.fields(section):
        allowed = choices(f)
        value = getattr(section, f.name)
        if allowed and value not in allowed:
            raise ConfigError(
                f"{flag(key(section, f.name))}: unknown value {value!r}; choose one of: {', '.join(map(str, allowed))}"
            )


@dataclass
class ModelConfig:
    """Which network to train: a name from models/, or your own code (docs/own_model.md)."""

    model: str = _f(
        "lenet5",
        "a registered model (see the `models` subcommand), or MODULE:CALLABLE returning your "
        "own nn.Module, e.g. mypkg.net:build (docs/own_model.md)",
    )
    model_arg: list = _f(
        [], "KEY=VALUE keyword argument for --model's or --task's callable (repeatable), e.g. --model-arg depth=4"
    )
    task: str = _f(
        "",
        "MODULE:CALLABLE returning an allreduce_train.Task (model, data, loss, evaluation, state) "
        "for anything beyond classification; replaces --model and --dataset (docs/own_model.md)",
    )

    def __post_init__(self) -> None:
        from models import MODELS

        from .usercode import check_reference, is_reference, parse_kwargs

        if self.task:
            check_reference("--task", self.task)
        elif is_reference(self.model):
            check_reference("--model", self.model)
        elif self.model not in MODELS:
            raise ConfigError(
                f"--model: unknown model {self.model!r}; choose one of: {', '.join(sorted(MODELS))}, "
                "or name your own as MODULE:CALLABLE (docs/own_model.md)"
            )
        if self.model_arg and not (self.task or is_reference(self.model)):
            raise ConfigError(
                f"--model-arg is for your own --model MODULE:CALLABLE or --task; --model {self.model} "
                "is registered: drop --model-arg"
            )
        parse_kwargs("--model-arg", self.model_arg)

    @property
    def label(self) -> str:
        """The model's short name for run directories and logs (``mypkg.net:build`` -> ``net.build``)."""
        from .usercode import is_reference, label

        ref = self.task or self.model
        return label(ref) if is_reference(ref) else ref


@dataclass
class DataConfig:
    """Dataset and batching. Batch sizes are per worker; the global batch is batch x workers."""

    dataset: str = _f(
        "fashion-mnist",
        "dataset to train on: " + " | ".join(DATASETS) + " (ptb: Penn-Treebank-format "
        "text, language models), or MODULE:CALLABLE returning your own (train, eval) "
        "map-style torch Datasets of (input, target) pairs (docs/own_model.md)",
    )
    dataset_arg: list = _f([], "KEY=VALUE keyword argument for --dataset's callable (repeatable)")
    data_dir: str = _f(
        "",
        "directory with the dataset files, used as they are (default: fashion-mnist "
        f"{DEFAULT_FASHION_MNIST_DIR}; ptb: an offline corpus built from Python's "
        "documentation, NOT the real Penn Treebank, which you must supply)",
    )
    data_workers: int = _f(
        0,
        "background processes that load your own --dataset's batches (torch DataLoader; the "
        "batch order is the same for a given seed and worker count); 0 = load in the training "
        "process",
    )
    batch_size: int = _f(64, "training batch size per worker")
    eval_batch_size: int = _f(1000, "evaluation batch size per worker")
    synthetic_samples: int = _f(6400, "samples in the synthetic dataset (fixed-shape random data, no I/O)")

    def __post_init__(self) -> None:
        from .usercode import check_reference, is_reference, parse_kwargs

        if is_reference(self.dataset):
            check_reference("--dataset", self.dataset)
        elif self.dataset not in DATASETS:
            raise ConfigError(
                f"--dataset: unknown value {self.dataset!r}; choose one of: {', '.join(DATASETS)}, "
                "or name your own as MODULE:CALLABLE (docs/own_model.md)"
            )
        if self.dataset_arg and not is_reference(self.dataset):
            raise ConfigError(
                f"--dataset-arg is for your own --dataset MODULE:CALLABLE; drop it with --dataset {self.dataset}"
            )
        parse_kwargs("--dataset-arg", self.dataset_arg)
        if not self.data_dir and self.dataset == "fashion-mnist":
            self.data_dir = DEFAULT_FASHION_MNIST_DIR
        _check(self.data_workers >= 0, "data_workers", "must be >= 0", self.data_workers)
        _check(self.batch_size >= 1, "batch_size", "must be >= 1", self.batch_size)
        _check(self.eval_batch_size >= 1, "eval_batch_size", "must be >= 1", self.eval_batch_size)
        _check(self.synthetic_samples >= 1, "synthetic_samples", "must be >= 1", self.synthetic_samples)


OPTIMIZERS = ("sgd", "adam", "adamw")  # or MODULE:CALLABLE (allreduce_train/optim.py builds each)
LR_SCHEDULES = ("constant", "step", "cosine", "linear")  # or MODULE:CALLABLE (step -> factor)
PRECISIONS = ("32", "bf16-mixed", "16-mixed")  # Lightning's names (allreduce_train/precision.py)


@dataclass
class OptimConfig:
    """The optimizer and its learning-rate schedule; the LR is given for one worker and scaled by the
    worker count (docs/training.md, "the recipe")."""

    optimizer: str = _f(
        "sgd",
        "sgd (with --momentum), adam, adamw (decoupled --weight-decay), or MODULE:CALLABLE taking the "
        "model's parameter groups and returning a torch.optim.Optimizer (docs/own_model.md)",
    )
    optimizer_arg: list = _f([], "KEY=VALUE keyword argument for --optimizer's callable (repeatable)")
    lr: float = _f(0.01, "learning rate for one worker (multiplied by the worker count unless --no-scale-lr)")
    momentum: float = _f(0.9, "SGD momentum")
    betas: str = _f("0.9,0.999", "adam, adamw: the moving averages' coefficients B1,B2")
    eps: float = _f(1e-8, "adam, adamw: added to the denominator")
    weight_decay: float = _f(0.0, "weight decay: L2 in the gradient for sgd and adam, decoupled for adamw")
    decay_norm_bias: bool = _f(
        True,
        "weight decay on every parameter; --no-decay-norm-bias puts biases and norm weights (every "
        "parameter of fewer than 2 dimensions) in a group without decay, as GPT-style recipes do",
    )
    scale_lr: bool = _f(True, "multiply the LR by the number of workers (Goyal et al. 2017)")
    lr_schedule: str = _f(
        "step",
        "step = constant after the warm-up, times --lr-decay per epoch past --lr-decay-after; constant; "
        "cosine or linear decay to --min-lr over the run after the warm-up; or MODULE:CALLABLE: "
        "step -> factor of the peak LR (its own warm-up included)",
    )
    warmup_steps: int = _f(
        100,
        "linear LR warm-up over this many steps: step schedule from lr/workers to the scaled LR "
        "(Goyal et al.), constant/cosine/linear from 0 to the peak",
    )
    min_lr: float = _f(0.0, "cosine, linear: the LR the decay ends at (for one worker, scaled like --lr)")
    grad_clip: float = _f(0.0, "clip the averaged gradient to this global L2 norm (0 = off)")
    lr_decay: float = _f(
        1.0,
        "step schedule: multiply the LR by this after every epoch past --lr-decay-after (Zaremba "
        "et al.'s schedule for the LSTMs; 1 = constant)",
    )
    lr_decay_after: int = _f(0, "epochs at the full LR before --lr-decay applies")

    def __post_init__(self) -> None:
        from .usercode import check_reference, is_reference, parse_kwargs

        for name, known in (("optimizer", OPTIMIZERS), ("lr_schedule", LR_SCHEDULES)):
            value = getattr(self, name)
            if is_reference(value):
                check_reference(flag(name), value)
            elif value not in known:
                raise ConfigError(
                    f"{flag(name)}: unknown value {value!r}; choose one of: {', '.join(known)}, "
                    "or name your own as MODULE:CALLABLE (docs/own_model.md)"
                )
        if self.optimizer_arg and not is_reference(self.optimizer):
            raise ConfigError(
                "--optimizer-arg is for your own --optimizer MODULE:CALLABLE; drop it with "
                f"--optimizer {self.optimizer}"
            )
        parse_kwargs("--optimizer-arg", self.optimizer_arg)
        self.beta_pair()
        _check(self.lr > 0, "lr", "must be > 0", self.lr)
        _check(0 <= self.momentum < 1, "momentum", "must be in [0, 1)", self.momentum)
        _check(self.eps > 0, "eps", "must be > 0", self.eps)
        _check(self.weight_decay >= 0, "weight_decay", "must be >= 0", self.weight_decay)
        _check(self.warmup_steps >= 0, "warmup_steps", "must be >= 0", self.warmup_steps)
        _check(0 <= self.min_lr <= self.lr, "min_lr", "must be in [0, --lr]", self.min_lr)
        _check(self.grad_clip >= 0, "grad_clip", "must be >= 0", self.grad_clip)
        _check(0 < self.lr_decay <= 1, "lr_decay", "must be in (0, 1]", self.lr_decay)
        _check(self.lr_decay_after >= 0, "lr_decay_after", "must be >= 0", self.lr_decay_after)

    def beta_pair(self) -> tuple[float, float]:
        """``--betas 0.9,0.95`` -> (0.9, 0.95)."""
        try:
            b1, b2 = (float(x) for x in self.betas.split(","))
        except ValueError:
            b1 = b2 = -1.0
        if not (0 <= b1 < 1 and 0 <= b2 < 1):
            raise ConfigError(f"--betas {self.betas!r}: write B1,B2 with both in [0, 1), e.g. 0.9,0.95")
        return b1, b2


@dataclass
class ExchangeConfig:
    """How gradients travel between workers."""

    strategy: str = _f(
        "allreduce",
        "gradient exchange: ring allreduce (Horovod) or parameter servers (ps); sharded = ZeRO "
        "(--shard-stage; on --allreduce-engine's collectives); none = every rank trains alone on "
        "its shard, the bound of docs/performance.md",
        STRATEGIES,
    )
    shard_stage: int = _f(
        2,
        "--strategy sharded (ZeRO): 1 = each worker keeps the optimizer state of 1/N of the parameters; "
        "2 = also only its 1/N of the gradients (reduce-scattered while backward runs); 3 = also only its "
        "1/N of the parameters (each module's gathered for its forward and again for its backward) "
        "(docs/training.md)",
        SHARD_STAGES,
    )
    allreduce_engine: str = _f(
        "horovod",
        "allreduce: horovod, or mpi = a ring of mpi4py messages from gradient hooks, "
        "the PS's machinery, or torch = torch.distributed (Gloo on CPU, NCCL on "
        "GPU) (docs/engines.md)",
        ("horovod", "mpi", "torch"),
    )
    compression: str = _f(
        "none",
        "fp16/bf16: 16 bits on the wire for gradients (allreduce; bf16 not with Horovod) "
        "and with ps also the pulled parameters; powersgd: rank-r factors with error "
        "feedback (allreduce) (docs/concepts.md)",
        ("none", "fp16", "bf16", "powersgd"),
    )
    powersgd_rank: int = _f(1, "--compression powersgd: the rank r of each gradient matrix's approximation")
    backward_passes_per_step: int = _f(1, "local gradient accumulation steps per exchange (allreduce)")
    average_every: int = _f(
        0,
        "local SGD (allreduce): workers step on their own gradients and every H-th step "
        "averages gradients and then parameters; 1 = synchronous SGD through that path, "
        "0 = off (docs/concepts.md)",
    )
    average_warmup_steps: int = _f(0, "local SGD: the first W steps are synchronous (post-local SGD)")
    diloco_every: int = _f(
        0,
        "DiLoCo (allreduce): H inner steps on each worker's own gradients, then an outer "
        "Nesterov step on the averaged parameter delta; 0 = off (docs/concepts.md)",
    )
    diloco_outer_lr: float = _f(0.7, "DiLoCo: the outer optimizer's learning rate (1 with momentum 0 = averaging)")
    diloco_outer_momentum: float = _f(0.9, "DiLoCo: the outer optimizer's Nesterov momentum")
    reduce_op: str = _f(
        "average",
        "allreduce reduction: average the gradients, or adasum = Horovod's Adasum of each worker's own update "
        "(power-of-2 ranks, no --grad-clip; docs/engines.md)",
        ("average", "adasum"),
    )
    average_buffers: bool = _f(
        True,
        "average floating-point buffers (BatchNorm's running statistics) over the workers before every "
        "evaluation and checkpoint and at the end, so every rank evaluates and saves the same model; "
        "--no-average-buffers: each worker keeps its own, the checkpoint rank 0's (docs/training.md)",
    )
    sync_batchnorm: bool = _f(
        False,
        "BatchNorm with the global batch's statistics in every training forward pass (Horovod: its "
        "SyncBatchNorm on CUDA, the same sums through Horovod on CPU; torch's with --allreduce-engine torch, "
        "CUDA only): workers x batch B train as one process with the global batch (docs/training.md)",
    )
    stall_timeout: float = _f(
        120.0,
        "seconds without progress after which every live rank ends the job, naming the "
        "rank(s) that did not arrive (exit 69; 0 = wait forever; docs/faults.md)",
    )

    def __post_init__(self) -> None:
        _check_choices(self)
        _check(
            self.backward_passes_per_step >= 1,
            "backward_passes_per_step",
            "must be >= 1",
            self.backward_passes_per_step,
        )
        _check(self.stall_timeout >= 0, "stall_timeout", "must be >= 0 (0 = off)", self.stall_timeout)
        _check(self.average_every >= 0, "average_every", "must be >= 0 (0 = off)", self.average_every)
        _check(self.average_warmup_steps >= 0, "average_warmup_steps", "must be >= 0", self.average_warmup_steps)
        _check(self.powersgd_rank >= 1, "powersgd_rank", "must be >= 1", self.powersgd_rank)
        _check(self.diloco_every >= 0, "diloco_every", "must be >= 0 (0 = off)", self.diloco_every)
        _check(self.diloco_outer_lr > 0, "diloco_outer_lr", "must be > 0", self.diloco_outer_lr)
        _check(
            0 <= self.diloco_outer_momentum < 1,
            "diloco_outer_momentum",
            "must be in [0, 1)",
            self.diloco_outer_momentum,
        )
        check_combination(self)

    @property
    def engine(self) -> str:
        """The engine that sums: horovod, mpi or torch (allreduce, sharded), ps, or none."""
        return self.allreduce_engine if self.strategy in ("allreduce", "sharded") else self.strategy


# The one table of combinations. distributed/ composes three kinds of thing -- an engine sums
# (horovod, mpi, torch, ps; none sums nothing), a wire format says what travels (--compression),
# a schedule says when (synchronous; --average-every: local SGD; --diloco-every: DiLoCo) -- and
# these rows are every combination that does not exist, each with the one line a user gets,
# checked before any process group forms (every rank fails alike). First match wins.
# A row: (refused when, the line; both functions of the exchange section and, for the rows that
# read other sections, the whole Config, which is None while the exchange section alone is checked).
SIXTEEN_BIT = ("fp16", "bf16")
SYNC_BATCHNORM_REFUSED = {  # --sync-batchnorm: why an engine has none, and what has one
    "mpi": ("the mpi engine has no SyncBatchNorm", "--allreduce-engine horovod (or torch on CUDA)"),
    "ps": ("the parameter servers sum gradients only", "--strategy allreduce"),
    "none": ("--strategy none exchanges nothing", "--strategy allreduce"),
}
COMBINATIONS: tuple[tuple[Any, Any], ...] = (
    (
        lambda x, c: x.strategy == "sharded" and (x.average_every or x.diloco_every),
        lambda x: (
            "--average-every and --diloco-every let every worker step a whole model of its own; --strategy "
            "sharded keeps 1/N of the training state per worker: use --strategy allreduce"
        ),
    ),
    (
        lambda x, c: x.strategy == "sharded" and x.compression == "powersgd",
        lambda x: (
            "--compression powersgd with --strategy sharded: low-rank factors cannot be reduce-scattered to "
            "shard owners; use --compression fp16, bf16 or none"
        ),
    ),
    (
        lambda x, c: x.strategy == "sharded" and x.reduce_op != "average",
        lambda x: (
            "--reduce-op adasum with --strategy sharded: Adasum combines whole per-worker updates, the shard "
            "owners sum gradients; use --reduce-op average"
        ),
    ),
    (
        lambda x, c: x.strategy == "sharded" and c is not None and c.train.precision == "16-mixed",
        lambda x: (
            "--precision 16-mixed with --strategy sharded: the loss scaler's unscale and inf/NaN check read "
            "whole gradients, which the shards do not keep; use --precision bf16-mixed (no loss scaler)"
        ),
    ),
    (
        lambda x, c: x.strategy == "sharded" and x.engine == "mpi" and c is not None and c.mpi.algorithm != "ring",
        lambda x: (
            "--strategy sharded --allreduce-engine mpi runs the ring's reduce-scatter and allgather phases "
            "apart; use --mpi-algorithm ring"
        ),
    ),
    (
        lambda x, c: x.average_every and x.strategy == "ps",
        lambda x: (
            "--average-every is local SGD over an allreduce (workers average parameters with each other); "
            "--strategy ps keeps one copy on the servers: use --strategy allreduce"
        ),
    ),
    (
        lambda x, c: x.diloco_every and x.strategy == "ps",
        lambda x: (
            "--diloco-every is DiLoCo over an allreduce (workers average parameter deltas with each other); "
            "--strategy ps keeps one copy on the servers: use --strategy allreduce"
        ),
    ),
    (
        lambda x, c: x.average_every and x.reduce_op != "average",
        lambda x: "--average-every with --reduce-op adasum: local SGD averages; use --reduce-op average",
    ),
    (
        lambda x, c: (
            x.compression == "powersgd" and (x.strategy == "ps" or x.average_every or x.reduce_op != "average")
        ),
        lambda x: (
            "--compression powersgd runs over an allreduce of gradients every step: not with --strategy ps, "
            "--average-every or --reduce-op adasum; use --compression fp16 or none"
        ),
    ),
    (
        lambda x, c: x.strategy == "none" and (x.average_every or x.diloco_every or x.compression != "none"),
        lambda x: (
            "--strategy none exchanges nothing: drop --average-every and --compression, or use --strategy allreduce"
        ),
    ),
    (
        lambda x, c: x.average_warmup_steps and not x.average_every,
        lambda x: "--average-warmup-steps without --average-every: set --average-every H (local SGD)",
    ),
    (
        lambda x, c: x.diloco_every and x.average_every,
        lambda x: "--diloco-every with --average-every: DiLoCo is local SGD with an outer optimizer; choose one",
    ),
    (
        lambda x, c: x.diloco_every and x.compression != "none",
        lambda x: (
            f"--diloco-every with --compression {x.compression}: DiLoCo sends no gradients, only float32 "
            "parameter deltas; drop --compression"
        ),
    ),
    (
        lambda x, c: x.diloco_every and x.reduce_op != "average",
        lambda x: "--diloco-every with --reduce-op adasum: DiLoCo averages; use --reduce-op average",
    ),
    (
        lambda x, c: x.engine == "horovod" and x.compression == "bf16",
        lambda x: (
            "--compression bf16: Horovod 0.28.1's PyTorch binding has no bfloat16 allreduce; use "
            "--allreduce-engine mpi (it sums bfloat16 itself) or --compression fp16"
        ),
    ),
    (
        lambda x, c: x.engine in ("mpi", "torch") and x.reduce_op != "average",
        lambda x: (
            f"--reduce-op adasum is Horovod's; --allreduce-engine {x.engine} averages (use --reduce-op average, "
            "or --allreduce-engine horovod)"
        ),
    ),
    (
        lambda x, c: x.engine == "ps" and x.reduce_op != "average",
        lambda x: "--reduce-op adasum is an allreduce option; --strategy ps averages (use --reduce-op average)",
    ),
    (
        lambda x, c: x.engine == "none" and x.reduce_op != "average",
        lambda x: "--reduce-op adasum with --strategy none: nothing is reduced; use --strategy allreduce",
    ),
    (
        # Horovod's Adasum optimizer steps each parameter inside its backward hook and combines the updates
        # (horovod/torch/optimizer.py, _DistributedAdasumOptimizer): no averaged gradient exists to clip
        lambda x, c: x.reduce_op == "adasum" and c is not None and c.optim.grad_clip > 0,
        lambda x: (
            "--grad-clip with --reduce-op adasum: Horovod's Adasum combines each parameter's update, made in "
            "backward, so there is no averaged gradient to clip; set --grad-clip 0 or use --reduce-op average"
        ),
    ),
    (
        lambda x, c: x.reduce_op == "adasum" and c is not None and c.horovod.backend == "gloo",
        lambda x: "--reduce-op adasum: Horovod 0.28.1 runs Adasum over MPI only; use --horovod-backend mpi",
    ),
    (
        lambda x, c: c is not None and c.train.precision == "16-mixed" and x.strategy == "ps",
        lambda x: (
            "--precision 16-mixed with --strategy ps: the servers apply each gradient as it arrives, before a "
            "worker could unscale it and skip an inf/NaN step; use --precision bf16-mixed (no loss scaler) or "
            "--strategy allreduce"
        ),
    ),
    (
        lambda x, c: c is not None and c.train.precision == "16-mixed" and x.reduce_op == "adasum",
        lambda x: (
            "--precision 16-mixed with --reduce-op adasum: Horovod's Adasum steps each worker's own (scaled) "
            "gradient inside backward, before the loss scaler could unscale it; use --precision bf16-mixed"
        ),
    ),
    (
        lambda x, c: x.sync_batchnorm and x.engine in SYNC_BATCHNORM_REFUSED,
        lambda x: (
            "--sync-batchnorm: {}; use {}, or drop the flag (the running statistics are then averaged over "
            "the workers before every evaluation and checkpoint)".format(*SYNC_BATCHNORM_REFUSED[x.engine])
        ),
    ),
    (
        lambda x, c: (
            x.engine == "mpi" and c is not None and c.mpi.algorithm == "iallreduce" and x.compression in SIXTEEN_BIT
        ),
        lambda x: (
            f"--compression {x.compression} with --mpi-algorithm iallreduce: MPI has no 16-bit float sum; use "
            "--mpi-algorithm ring (it sums 16-bit floats itself) or --compression none"
        ),
    ),
)


def check_combination(x: ExchangeConfig, whole: Any = None) -> None:
    """Refuse what :data:`COMBINATIONS` refuses, with its line (:class:`ConfigError`); ``whole``: the
    :class:`Config` (None: the exchange section's rows only)."""
    for refused, line in COMBINATIONS:
        if refused(x, whole):
            raise ConfigError(line(x))


@dataclass
class HorovodConfig:
    """--allreduce-engine horovod (the default): Horovod's own settings (distributed/horovod.py)."""

    prefix: ClassVar[str] = "horovod"  # the flags: --horovod-backend, --horovod-bucket-bytes
    backend: str = _f(
        "mpi",
        "Horovod's controller and CPU collectives; gloo (one host only under mpirun) waits in "
        "blocking sockets, which helps on an oversubscribed host (docs/performance.md)",
        ("mpi", "gloo"),
    )
    bucket_bytes: int = _f(
        1 << 20,
        "--strategy sharded: gradients reduce-scattered together (bytes on the wire, as --mpi-bucket-bytes), "
        "each bucket enqueued as soon as backward has produced it; Horovod fuses the buckets ready in one "
        "cycle up to HOROVOD_FUSION_THRESHOLD (docs/engines.md)",
    )

    def __post_init__(self) -> None:
        _check_choices(self)
        _check(self.bucket_bytes >= 4, "horovod_bucket_bytes", "must be >= 4 (one float32)", self.bucket_bytes)


@dataclass
class MPIConfig:
    """--allreduce-engine mpi: the ring of mpi4py messages from gradient hooks (distributed/ring.py)."""

    prefix: ClassVar[str] = "mpi"  # the flags: --mpi-bucket-bytes, --mpi-algorithm
    bucket_bytes: int = _f(
        1 << 20, "gradients reduced together (bytes on the wire), started as soon as backward has produced them"
    )
    algorithm: str = _f(
        "ring",
        "ring = reduce-scatter + allgather of Isend/Irecv; iallreduce = MPI_Iallreduce per "
        "bucket (Open MPI's algorithm)",
        ("ring", "iallreduce"),
    )

    def __post_init__(self) -> None:
        _check_choices(self)
        _check(self.bucket_bytes >= 4, "mpi_bucket_bytes", "must be >= 4 (one float32)", self.bucket_bytes)


@dataclass
class TorchConfig:
    """--allreduce-engine torch: torch.distributed's process group under mpirun (distributed/c10d.py)."""

    prefix: ClassVar[str] = "torch"  # the flags: --torch-backend, --torch-bucket-bytes
    backend: str = _f("auto", "auto = NCCL for a CUDA device, Gloo on CPU", ("auto", "gloo", "nccl"))
    bucket_bytes: int = _f(
        1 << 20,
        "gradients summed together (bytes on the wire, as --mpi-bucket-bytes), started "
        "from gradient hooks as soon as backward has produced them",
    )

    def __post_init__(self) -> None:
        _check_choices(self)
        _check(self.bucket_bytes >= 4, "torch_bucket_bytes", "must be >= 4 (one float32)", self.bucket_bytes)


@dataclass
class PSConfig:
    """--strategy ps: the parameter servers (distributed/ps/)."""

    prefix: ClassVar[str] = "ps"  # the flags: --ps-placement, --ps-servers, ...
    placement: str = _f(
        "dedicated",
        "dedicated = the first --ps-servers ranks only serve (TensorFlow-style); "
        "colocated = every rank trains and serves 1/N (MXNet-style)",
        ("dedicated", "colocated"),
    )
    servers: int = _f(0, "server ranks (0 = 1 with dedicated placement, every rank with colocated)")
    mode: str = _f(
        "sync",
        "sync = average every worker's gradient, then update (allreduce's maths); "
        "async = apply each worker's gradient as it arrives",
        ("sync", "async"),
    )
    bucket_bytes: int = _f(
        1 << 20,
        "gradients pushed in one message per server (bytes on the wire, as "
        "--mpi-bucket-bytes) as soon as backward has produced them",
    )
    split_bytes: int = _f(
        1 << 16, "parameters larger than this are cut into chunks of at most this size, spread over the servers"
    )

    def __post_init__(self) -> None:
        _check_choices(self)
        _check(self.servers >= 0, "ps_servers", "must be >= 0", self.servers)
        _check(self.bucket_bytes >= 4, "ps_bucket_bytes", "must be >= 4 (one float32)", self.bucket_bytes)
        _check(self.split_bytes >= 4, "ps_split_bytes", "must be >= 4 (one float32)", self.split_bytes)


@dataclass
class TrainConfig:
    """Length of the run, seeding, evaluation and logging cadence."""

    epochs: int = _f(2, "passes over the training data (ignored when --steps is set)")
    steps: int = _f(0, "total optimizer steps of the schedule (0 = derive from --epochs)")
    exit_after_steps: int = _f(
        0,
        "stop after this many steps in this invocation, checkpoint, exit 0; "
        "continue later with --resume (0 = run to the end)",
    )
    seed: int = _f(42, "seed for parameters and data order (identical on every rank)")
    log_every: int = _f(20, "log training figures every N steps")
    eval_every: int = _f(0, "evaluate every N steps (0 = at the end of every epoch)")
    perf_warmup_steps: int = _f(10, "steps excluded from throughput figures")
    threads: int = _f(0, "torch intra-op threads per rank (0 = cores on this host / ranks on this host)")
    flush_denormal: bool = _f(
        False,
        "CPU: treat denormal floats as zero (torch.set_flush_denormal; TensorFlow's "
        "default): a step whose values underflow otherwise runs up to ~6x slower "
        "(docs/performance.md)",
    )
    device: str = _f("auto", "auto = CUDA pinned to the local rank when present, else CPU", ("auto", "cpu", "cuda"))
    precision: str = _f(
        "32",
        "compute: 32 = float32; bf16-mixed = torch.autocast to bfloat16 (CPU and CUDA); 16-mixed = "
        "autocast to float16 with a loss scaler (CUDA). Parameters, gradients, optimizer state and "
        "the wire stay float32 (--compression sets the wire) (docs/training.md)",
        PRECISIONS,
    )
    target: str = _f(
        "",
        "stop once an evaluation reaches this, e.g. eval/accuracy>=0.89 or eval/perplexity<=150; "
        "metrics.json records the steps and seconds to it (time to accuracy)",
    )
    straggler_factor: float = _f(
        1.5,
        "name a rank (once, with its host) whose median compute time per step over "
        "--straggler-window steps is at least this many times the other ranks' median, "
        "and still is a window later; 0 = off (docs/faults.md)",
    )
    straggler_window: int = _f(50, "steps that --straggler-factor's medians cover (checked at every --log-every)")
    debug_slow_rank: str = _f(
        "",
        "for tests: R:FACTOR makes global rank R's forward and backward FACTOR times as "
        "long (a sleep before the exchange), a straggler on purpose",
    )

    def __post_init__(self) -> None:
        _check(self.epochs >= 1, "epochs", "must be >= 1", self.epochs)
        _check(self.steps >= 0, "steps", "must be >= 0", self.steps)
        _check(self.exit_after_steps >= 0, "exit_after_steps", "must be >= 0", self.exit_after_steps)
        _check(self.log_every >= 1, "log_every", "must be >= 1", self.log_every)
        _check(self.eval_every >= 0, "eval_every", "must be >= 0", self.eval_every)
        _check(self.perf_warmup_steps >= 0, "perf_warmup_steps", "must be >= 0", self.perf_warmup_steps)
        _check(self.threads >= 0, "threads", "must be >= 0", self.threads)
        if self.target:
            parse_target(self.target)
        _check(
            self.straggler_factor == 0 or self.straggler_factor > 1,
            "straggler_factor",
            "must be > 1 (or 0 = off)",
            self.straggler_factor,
        )
        _check(self.straggler_window >= 1, "straggler_window", "must be >= 1", self.straggler_window)
        if self.debug_slow_rank:
            parse_slow_rank(self.debug_slow_rank)
        _check_choices(self)


TARGET_RE = re.compile(r"^(eval/[A-Za-z0-9_.]+)\s*(>=|<=)\s*([-+0-9.eE]+)$")


def parse_target(text: str) -> tuple[str, str, float]:
    """``eval/accuracy>=0.89`` -> ("eval/accuracy", ">=", 0.89)."""
    m = TARGET_RE.match(text.strip())
    try:
        return m.group(1), m.group(2), float(m.group(3))  # type: ignore[union-attr]
    except (AttributeError, ValueError):
        raise ConfigError(
            f"--target {text!r}: write METRIC>=VALUE or METRIC<=VALUE with an evaluation metric, "
            "e.g. eval/accuracy>=0.89 or eval/perplexity<=150"
        ) from None


def parse_slow_rank(text: str) -> tuple[int, float]:
    """``--debug-slow-rank 1:3`` -> (1, 3.0): global rank 1, forward and backward 3x as long."""
    rank, _, factor = text.partition(":")
    try:
        out = int(rank), float(factor)
    except ValueError:
        out = (-1, 0.0)
    if out[0] < 0 or not out[1] >= 1:
        raise ConfigError(
            f"--debug-slow-rank {text!r}: write RANK:FACTOR with a global rank >= 0 and a factor >= 1, e.g. 1:3"
        )
    return out


def parse_trace_steps(text: str) -> tuple[int, int]:
    """``--trace-steps 10:15`` -> (10, 15): the steps after the first ten, up to and with the fifteenth."""
    first, _, stop = text.partition(":")
    try:
        out = int(first), int(stop)
    except ValueError:
        out = (-1, -1)
    if not 0 <= out[0] < out[1]:
        raise ConfigError(
            f"--trace-steps {text!r}: write A:B with whole numbers 0 <= A < B, e.g. 0:5 (the first five steps)"
        )
    return out


@dataclass
class RunConfig:
    """Where the run writes and what it writes."""

    run_dir: str = _f("runs", "parent directory of run directories")
    name: str = _f("", "run directory name under --run-dir (default: <model>-<strategy>-np<N>-<time>)")
    checkpoint_every: int = _f(0, "checkpoint every N steps (0 = at the end of every epoch)")
    resume: str = _f("", "checkpoint file to continue from, or 'auto' for <run dir>/checkpoint.pt")
    init_from: str = _f(
        "",
        "start from these weights only (fine-tuning): a state_dict .pt (what `export` writes), a .safetensors "
        "file or a checkpoint; the optimizer, LR schedule and step start afresh. With --resume auto and a "
        "checkpoint in the run directory, --resume wins: a restarted job continues",
    )
    keep_checkpoints: int = _f(
        0,
        "besides checkpoint.pt (the latest, what --resume auto reads) keep the last N step checkpoints as "
        "checkpoints/step-NNNNNN.pt (0 = only the latest)",
    )
    keep_best: bool = _f(
        False,
        "keep the best evaluation by --target's metric (higher for >=, lower for <=) as checkpoint-best.pt, "
        "rewritten whenever an evaluation beats it (give a target the run will not reach to keep the best "
        "without stopping, e.g. eval/loss<=0)",
    )
    tensorboard: bool = _f(True, "write TensorBoard event files (global rank 0)")
    progress: bool = _f(True, "show a progress bar (global rank 0)")
    dump_params: str = _f(
        "", "at the end, every rank saves its parameters to this file with {rank} replaced (tests, debugging)"
    )
    expect_hosts: int = _f(
        0,
        "refuse to train unless the ranks run on at least this many distinct hosts, and print "
        "every rank's host at start (set by the Kubernetes and Slurm launchers; 0 = no check)",
    )
    trace_steps: str = _f(
        "",
        "A:B writes a Chrome trace of the steps A to B-1 (0:5 = the first five) per rank to "
        "<run dir>/trace/rank<R>.json: each phase and each bucket's exchange (docs/training.md)",
    )

    def __post_init__(self) -> None:
        _check(self.checkpoint_every >= 0, "checkpoint_every", "must be >= 0", self.checkpoint_every)
        _check(self.keep_checkpoints >= 0, "keep_checkpoints", "must be >= 0", self.keep_checkpoints)
        if self.init_from and self.resume and self.resume != "auto":
            raise ConfigError(
                f"--init-from with --resume {self.resume}: a resumed run continues with its checkpoint's weights; "
                "drop one (--resume auto beside --init-from lets a restarted fine-tuning continue)"
            )
        _check(self.expect_hosts >= 0, "expect_hosts", "must be >= 0", self.expect_hosts)
        _check("/" not in self.name, "name", "must be a plain directory name", self.name)
        if self.trace_steps:
            parse_trace_steps(self.trace_steps)


@dataclass
class Config:
    """The whole run."""

    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    exchange: ExchangeConfig = field(default_factory=ExchangeConfig)
    horovod: HorovodConfig = field(default_factory=HorovodConfig)
    mpi: MPIConfig = field(default_factory=MPIConfig)
    torch: TorchConfig = field(default_factory=TorchConfig)
    ps: PSConfig = field(default_factory=PSConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    run: RunConfig = field(default_factory=RunConfig)

    def __post_init__(self) -> None:
        check_combination(self.exchange, self)  # the table's rows that read other sections
        if self.run.keep_best and not self.train.target:
            raise ConfigError("--keep-best keeps the best by --target's metric: give --target, e.g. eval/loss<=0")

    def to_dict(self) -> dict[str, dict[str, Any]]:
        return dataclasses.asdict(self)


def _sections() -> dict[str, type]:
    return {f.name: f.default_factory for f in dataclasses.fields(Config)}  # type: ignore[misc]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add one flag per config field; defaults are None so that TOML values are not overridden."""
    parser.add_argument("--config", metavar="FILE.toml", help="TOML file with [model], [data], [optim], ... tables")
    seen: set[str] = set()
    for section, cls in _sections().items():
        group = parser.add_argument_group(section, cls.__doc__)
        for f in dataclasses.fields(cls):
            name = key(cls, f.name)
            assert name not in seen, f"config field {name} appears in two sections"
            seen.add(name)
            add_field_argument(group, section, cls, f)


def add_field_argument(group: Any, section: str, cls: type, f: dataclasses.Field) -> None:
    """One config field's flag on ``group`` (a parser or an argument group), its help and default read from the
    field: the value lands in ``args.<section>.<field>`` (None when not given) for :func:`build_config`. The
    lab's experiments add the recipe's fields with it (lab/common/recipe.py)."""
    add_flag(group, cls, f, section=section, prefix=getattr(cls, "prefix", ""))


def _owners() -> dict[str, tuple[str, str]]:
    """Every field by its flag's name: ``ps_servers`` -> ("ps", "servers"), ``lr`` -> ("optim", "lr")."""
    return {key(cls, f.name): (s, f.name) for s, cls in _sections().items() for f in dataclasses.fields(cls)}


def _apply_model_defaults(values: dict[str, dict[str, Any]]) -> None:
    """Fill in the chosen model's recommended settings (``ModelSpec.defaults``, e.g. the LSTM's
    lr 1.0 and clipping at 5) wherever neither the file nor the command line gave a value."""
    from models import MODELS

    spec = MODELS.get(values["model"].get("model", ModelConfig.model))
    if spec is None:
        return  # ModelConfig reports the unknown name
    owner = _owners()
    for name, v in spec.defaults.items():
        section, field_name = owner[name]
        values[section].setdefault(field_name, v)


def _read_toml(path: str, values: dict[str, dict[str, Any]]) -> None:
    """``--config FILE``: one table per section, keys as the fields are named (``-`` or ``_``)."""
    try:
        with open(path, "rb") as fh:
            data = tomllib.load(fh)
    except FileNotFoundError:
        raise ConfigError(f"--config: file not found: {path}") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"--config: {path} is not valid TOML: {e}") from None
    owner = _owners()
    for section, table in data.items():
        if section not in values or not isinstance(table, dict):
            raise ConfigError(f"--config: unknown table [{section}] in {path}; tables are: {', '.join(values)}")
        known = [f.name for f in dataclasses.fields(_sections()[section])]
        for k, v in table.items():
            name = k.replace("-", "_")
            if name in known:
                values[section][name] = v
                continue
            moved = owner.get(name)
            if section == "exchange" and moved and moved[0] != section:
                raise ConfigError(
                    f"--config: {k!r} in [exchange] of {path} moved to its engine's table: write "
                    f"{moved[1]} = ... in [{moved[0]}] (the flag {flag(name)} is unchanged)"
                )
            raise ConfigError(f"--config: unknown key {k!r} in [{section}] of {path}; keys are: {', '.join(known)}")


class _Refusal(argparse.ArgumentParser):
    """A parser whose usage errors are :class:`ConfigError`s (one line, exit 2, from rank 0 only)."""

    def error(self, message: str) -> NoReturn:
        raise ConfigError(message)


def _parse(argv: Sequence[str]) -> argparse.Namespace:
    parser = _Refusal(add_help=False)
    add_arguments(parser)
    args, unknown = parser.parse_known_args(list(argv))
    if unknown:
        raise ConfigError(
            f"unknown argument {unknown[0]!r}: the arguments are the trainer's flags "
            "(python -m allreduce_train train --help)"
        )
    return args


def build_config(args: argparse.Namespace | Sequence[str] = (), overrides: Mapping[str, Any] | None = None) -> Config:
    """Merge defaults, the TOML file (``--config``), ``overrides`` and the command line, then validate
    every section.

    ``args``: the trainer's flags (``["--epochs", "2"]``, ``sys.argv[1:]``), or what a parser that
    :func:`add_arguments` built made of them. ``overrides``: the same settings by the flag's name with
    ``_`` for ``-`` (``batch_size=32``, ``ps_placement="colocated"``); a flag given in ``args`` wins.
    """
    if not isinstance(args, argparse.Namespace):
        args = _parse(args)
    given = {dest: v for dest, v in vars(args).items() if "." in dest and v is not None}
    owner = _owners()
    for name, v in (overrides or {}).items():
        if name not in owner:
            raise ConfigError(
                f"unknown setting {name}={v!r}: settings are the trainer's flags with _ for -, "
                "e.g. batch_size=32 (python -m allreduce_train train --help)"
            )
        given.setdefault(".".join(owner[name]), v)
    values: dict[str, dict[str, Any]] = {s: {} for s in _sections()}
    if getattr(args, "config", None):
        _read_toml(args.config, values)
    for dest, v in given.items():
        section, name = dest.split(".", 1)
        values[section][name] = v
    _apply_model_defaults(values)
    if values["exchange"].get("diloco_every"):
        # DiLoCo's inner optimizer is AdamW in Douillard et al. 2023 (outer: Nesterov SGD, its own flags)
        values["optim"].setdefault("optimizer", "adamw")
    sections = {}
    for section, cls in _sections().items():
        hints = get_type_hints(cls)
        for name, v in values[section].items():
            want = hints[name]
            if want is list and isinstance(v, dict):  # TOML: model_arg = {depth = 4}
                v = [f"{k}={x!r}" for k, x in v.items()]
            if want is list and not all(isinstance(x, str) for x in v if isinstance(v, list)):
                raise ConfigError(f"{flag(key(cls, name))} must be a list of KEY=VALUE strings or a table (got {v!r})")
            if want is float and isinstance(v, int) and not isinstance(v, bool):
                v = float(v)
            if not isinstance(v, want) or (want is int and isinstance(v, bool)):
                raise ConfigError(f"{flag(key(cls, name))} must be of type {want.__name__} (got {v!r})")
            values[section][name] = v
        sections[section] = cls(**values[section])
    return Config(**sections)
