"""What the trainer does with a batch, per kind of model: image classification (the public
:class:`~.usertask.Task`'s defaults, as a user's task) or language modelling.

The loop in :mod:`.trainer` is the same for both; a task supplies the data for this worker, the
loss of one (micro-)batch and the evaluation sums. Evaluation returns *sums* (loss, counts) so that
the trainer can add them over workers before dividing: global, token-weighted figures.

The language-model task carries the LSTM's hidden state from one window of ``bptt`` tokens to the
next and detaches it, so gradients flow back at most ``bptt`` steps (truncated BPTT); the state
restarts at zero every epoch and after a resume (it is not checkpointed).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from typing import Any, Protocol

import torch
import torch.nn.functional as F

from models import MODELS, ModelSpec

from .config import Config
from .data import ptb
from .data.images import TensorDataset, fashion_mnist, synthetic
from .errors import ConfigError


class Batches(Protocol):
    """A worker's training batches: ``data.images.ShardedBatches`` or ``data.ptb.LMBatches``."""

    steps_per_epoch: int

    def batches(self, epoch: int, start_step: int = 0) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """(inputs, targets) of this worker for the steps ``start_step..`` of ``epoch``, in its order."""
        ...


class Task(Protocol):
    """What the trainer needs from a kind of model; the loop itself is the same for every task."""

    words_per_sample: int  # tokens per sample for a words/s figure, 0 for none
    note: str  # a line for the log about the data (e.g. "NOT Penn Treebank"), or ""

    def data(self, rank: int, num_shards: int) -> tuple[Batches, Any]:
        """This worker's training batches and its share of the evaluation set."""
        ...

    def build_model(self) -> torch.nn.Module: ...

    def start_epoch(self, epoch: int) -> None:
        """Called before every epoch's first step (a language model restarts its state)."""
        ...

    def state_dict(self) -> dict[str, Any]:
        """What this worker carries from step to step besides the model (checkpointed per worker)."""
        ...

    def load_state_dict(self, state: dict[str, Any], device: torch.device | None = None) -> None: ...

    def loss(self, model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, rows: slice) -> torch.Tensor:
        """The mean loss of one (micro-)batch: rows ``rows`` of this worker's batch."""
        ...

    def eval_sums(self, model: torch.nn.Module, eval_set: Any, device: torch.device, batch_size: int) -> torch.Tensor:
        """Sums (loss, counts) over this worker's evaluation share, to be added over workers."""
        ...

    def eval_metrics(self, totals: torch.Tensor) -> dict[str, float]:
        """The figures (``eval/...``) from the sums over all workers."""
        ...


class LanguageModelTask:
    """Token windows -> next-token logits; truncated BPTT; perplexity over the validation text."""

    def __init__(self, cfg: Config, spec: ModelSpec) -> None:
        self.cfg, self.spec = cfg, spec
        self.bptt = self.words_per_sample = spec.bptt
        self.vocab_size = spec.num_classes
        self.hidden: dict[int, Any] = {}  # first row of a micro-batch -> its state after the previous window
        self.note = ""  # for the log: which text, and whether its perplexities compare with PTB's

    def corpus(self) -> ptb.Corpus:
        cfg = self.cfg
        if cfg.data.dataset == "synthetic":
            return ptb.synthetic_lm(self.vocab_size, self.bptt, cfg.data.synthetic_samples, cfg.train.seed)
        if cfg.data.dataset != "ptb":
            raise ConfigError(
                f"--model {self.spec.name} is a language model; use --dataset ptb or synthetic (got {cfg.data.dataset})"
            )
        if cfg.data.data_dir:
            corpus = ptb.load_ptb(cfg.data.data_dir)
            self.note = f"data: {cfg.data.data_dir} (Penn Treebank format, {len(corpus.vocab)} words)"
            return corpus
        path = ptb.offline_corpus()
        corpus = ptb.load_ptb(path)
        self.note = (
            f"data: offline corpus {path} ({len(corpus.vocab)} words of Python documentation in Penn Treebank "
            "format): NOT Penn Treebank, perplexities are not comparable with the paper's; "
            "--data-dir DIR reads a real PTB copy"
        )
        return corpus

    def data(self, rank: int, num_shards: int) -> tuple[ptb.LMBatches, ptb.EvalStream]:
        cfg = self.cfg
        corpus = self.corpus()
        self.vocab_size = len(corpus.vocab)  # the model's embedding and softmax match the data
        k = cfg.exchange.backward_passes_per_step
        batches = ptb.LMBatches(corpus.train, cfg.data.batch_size * k, self.bptt, rank, num_shards)
        if batches.steps_per_epoch == 0:
            raise ConfigError(
                f"{len(corpus.train)} training tokens give no full window of {self.bptt} steps for "
                f"{num_shards} workers x --batch-size {cfg.data.batch_size} x {k} passes; "
                "use fewer ranks (-np) or a smaller --batch-size"
            )
        if len(corpus.valid) <= num_shards:
            raise ConfigError(f"{len(corpus.valid)} validation tokens for {num_shards} workers; use fewer ranks (-np)")
        return batches, ptb.eval_part(corpus.valid, rank, num_shards)

    def build_model(self) -> torch.nn.Module:
        return self.spec.build(vocab_size=self.vocab_size)

    def start_epoch(self, epoch: int) -> None:
        self.hidden = {}  # the text starts over: so does the state

    def state_dict(self) -> dict[str, Any]:
        # the LSTM state after the last window: a resumed run continues the text mid-epoch from it
        return {"hidden": {k: tuple(h.cpu() for h in v) for k, v in self.hidden.items()}}

    def load_state_dict(self, state: dict[str, Any], device: torch.device | None = None) -> None:
        self.hidden = {k: tuple(h.to(device) if device else h for h in v) for k, v in state.get("hidden", {}).items()}

    def loss(self, model, x: torch.Tensor, y: torch.Tensor, rows: slice) -> torch.Tensor:
        """x, y: (b, bptt), rows ``rows`` of this worker's batch (micro-batches cut the rows)."""
        logits, state = model(x, self.hidden.get(rows.start))  # (b, bptt, V); None -> zeros
        # detached: the next window starts from this state, but gradients stop here (truncated BPTT)
        self.hidden[rows.start] = tuple(h.detach() for h in state)
        return F.cross_entropy(logits.flatten(0, 1), y.flatten())

    def eval_sums(self, model, part: ptb.EvalStream, device, batch_size: int) -> torch.Tensor:
        """Summed loss over every target of this worker's part, read as ``batch_size`` parallel
        streams carrying their state across windows; the tail that does not fill a row is read
        as one more stream."""
        totals = torch.zeros(2, dtype=torch.float64)  # loss sum, tokens
        n = len(part)
        rows = max(1, min(batch_size, n))
        length = n // rows
        inputs = part.inputs[: rows * length].view(rows, length).to(device)
        targets = part.targets[: rows * length].view(rows, length).to(device)
        pieces = [(inputs, targets)]
        if rows * length < n:
            pieces.append(
                (
                    part.inputs[rows * length :].view(1, -1).to(device),
                    part.targets[rows * length :].view(1, -1).to(device),
                )
            )
        for x_all, y_all in pieces:
            hidden = None
            for lo in range(0, x_all.shape[1], self.bptt):
                logits, hidden = model(x_all[:, lo : lo + self.bptt], hidden)
                y = y_all[:, lo : lo + self.bptt]
                totals[0] += F.cross_entropy(logits.flatten(0, 1), y.flatten(), reduction="sum").item()
                totals[1] += y.numel()
        return totals

    def eval_metrics(self, totals: torch.Tensor) -> dict[str, float]:
        loss = totals[0].item() / totals[1].item()
        return {"eval/loss": loss, "eval/perplexity": math.exp(min(loss, 700.0))}  # exp overflows past ~709


def make_task(cfg: Config, own: Any = None) -> Task:
    """The task of this run: the user's (``own``: a :class:`~.usertask.Task` handed to
    :func:`allreduce_train.fit`; ``--task``), a registered language model's, else classification
    as a public :class:`~.usertask.Task` with its defaults: a registered model or the user's
    ``--model MODULE:CALLABLE``, on a built-in image set or the user's ``--dataset MODULE:CALLABLE``.
    A user's code is imported and called here, on every rank alike; what fails becomes one
    :class:`ConfigError` line."""
    from . import usercode
    from .usertask import Task as OwnTask
    from .usertask import TaskAdapter

    m, dataset = cfg.model, cfg.data.dataset
    if own is not None:
        return TaskAdapter(own, "fit()", cfg)
    if m.task:
        kwargs = usercode.parse_kwargs("--model-arg", m.model_arg)
        made = usercode.call("--task", m.task, usercode.resolve("--task", m.task), **kwargs)
        if not isinstance(made, OwnTask):
            raise ConfigError(
                f"--task {m.task} returned a {type(made).__name__}; return an allreduce_train.Task "
                "(subclass it, docs/own_model.md)"
            )
        return TaskAdapter(made, f"--task {m.task}", cfg)
    spec = None if usercode.is_reference(m.model) else MODELS[m.model]
    own_data = usercode.is_reference(dataset)
    if spec is not None and spec.task == "lm":
        if own_data:
            raise ConfigError(
                f"--model {m.model} is a language model over a token stream (--dataset ptb); with your "
                "own --dataset use your own --task (docs/own_model.md)"
            )
        return LanguageModelTask(cfg, spec)
    if spec is None and not own_data and dataset != "fashion-mnist":
        raise ConfigError(
            f"--model {m.model} with --dataset {dataset}: your own model trains on fashion-mnist or your "
            "own --dataset MODULE:CALLABLE (synthetic data needs a registered model's input shape)"
        )
    build = spec.build if spec is not None else _by_reference("--model", m.model, "--model-arg", m.model_arg)
    if own_data:
        data = _by_reference("--dataset", dataset, "--dataset-arg", cfg.data.dataset_arg)
        return TaskAdapter(OwnTask(model=build, data=data), f"--model {m.model} --dataset {dataset}", cfg)
    return TaskAdapter(OwnTask(model=build, data=lambda: images(cfg, spec)), f"--model {m.model}", cfg)


def _by_reference(flag: str, ref: str, args_flag: str, args: list[str]) -> Callable[[], Any]:
    """The user's ``MODULE:CALLABLE`` with its ``KEY=VALUE`` arguments: resolved now, called when the task
    needs it."""
    from . import usercode

    fn, kwargs = usercode.resolve(flag, ref), usercode.parse_kwargs(args_flag, args)
    return lambda: usercode.call(flag, ref, fn, **kwargs)


def images(cfg: Config, spec: ModelSpec | None) -> tuple[TensorDataset, TensorDataset]:
    """The built-in image sets, in memory, for ``spec`` (None: the user's own ``--model``, on fashion-mnist)."""
    if cfg.data.dataset == "synthetic" and spec is not None:
        return synthetic(spec.input_shape, spec.num_classes, cfg.data.synthetic_samples, cfg.train.seed)
    if spec is None or (spec.input_shape == (1, 28, 28) and cfg.data.dataset == "fashion-mnist"):
        return fashion_mnist(cfg.data.data_dir)
    raise ConfigError(
        f"--model {spec.name} expects input {spec.input_shape}, --dataset {cfg.data.dataset} "
        "does not provide it; use --dataset synthetic with it"
    )
