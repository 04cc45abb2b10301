"""What the trainer does with a batch, per kind of model: image classification or language modelling.

The loop in :mod:`.trainer` is the same for both; a task supplies the data for this worker, the
loss of one (micro-)batch and the evaluation sums. Evaluation returns *sums* (loss, counts) so that
the trainer can add them over workers before dividing: global, token-weighted figures.

The language-model task carries the LSTM's hidden state from one window of ``bptt`` tokens to the
next and detaches it, so gradients flow back at most ``bptt`` steps (truncated BPTT); the state
restarts at zero every epoch and after a resume (it is not checkpointed).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any, Protocol

import torch
import torch.nn.functional as F

from models import MODELS, ModelSpec

from .config import Config
from .data import ptb
from .data.images import ShardedBatches, TensorDataset, eval_shard, fashion_mnist, synthetic
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


class ClassifyTask:
    """Images -> class logits; cross-entropy; loss and accuracy over the test set."""

    words_per_sample = 0  # no words/sec figure
    note = ""

    def __init__(self, cfg: Config, spec: ModelSpec) -> None:
        self.cfg, self.spec = cfg, spec

    def data(self, rank: int, num_shards: int) -> tuple[ShardedBatches, TensorDataset]:
        """This worker's training batches and evaluation shard."""
        cfg, spec = self.cfg, self.spec
        if cfg.data.dataset == "synthetic":
            train_set, test_set = synthetic(
                spec.input_shape, spec.num_classes, cfg.data.synthetic_samples, cfg.train.seed
            )
        elif cfg.data.dataset == "fashion-mnist" and spec.input_shape in ((1, 28, 28), ()):  # (): your own model
            train_set, test_set = fashion_mnist(cfg.data.data_dir)
        else:
            raise ConfigError(
                f"--model {spec.name} expects input {spec.input_shape}, --dataset {cfg.data.dataset} "
                "does not provide it; use --dataset synthetic with it"
            )
        k = cfg.exchange.backward_passes_per_step
        batches = ShardedBatches(train_set, cfg.data.batch_size * k, rank, num_shards, cfg.train.seed)
        if batches.steps_per_epoch == 0:
            raise ConfigError(
                f"{len(train_set)} training samples are fewer than one global batch "
                f"({num_shards} workers x --batch-size {cfg.data.batch_size} x {k} passes); "
                "use fewer ranks (-np) or a smaller --batch-size"
            )
        if len(test_set) < num_shards:
            raise ConfigError(f"{len(test_set)} evaluation samples for {num_shards} workers; use fewer ranks (-np)")
        return batches, eval_shard(test_set, rank, num_shards)

    def build_model(self) -> torch.nn.Module:
        model = self.spec.build()
        if not isinstance(model, torch.nn.Module):
            raise ConfigError(f"--model {self.spec.name} returned a {type(model).__name__}; return a torch.nn.Module")
        return model

    def check(self, model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> None:
        """Your own model's output on one batch fits the cross-entropy loss (before any rank trains)."""
        if self.spec.input_shape:  # a registered model: its input shape is known to fit
            return
        from .usertask import Task as OwnTask
        from .usertask import TaskAdapter

        TaskAdapter(OwnTask(), f"--model {self.spec.name}", self.cfg).check(model, x, y)

    def start_epoch(self, epoch: int) -> None:
        pass

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any], device: torch.device | None = None) -> None:
        pass

    def loss(self, model, x: torch.Tensor, y: torch.Tensor, rows: slice) -> torch.Tensor:
        return F.cross_entropy(model(x), y)

    def eval_sums(self, model, eval_set: TensorDataset, device, batch_size: int) -> torch.Tensor:
        totals = torch.zeros(3, dtype=torch.float64)  # loss sum, correct, count
        for lo in range(0, len(eval_set), batch_size):
            x = eval_set.inputs[lo : lo + batch_size].to(device)
            y = eval_set.targets[lo : lo + batch_size].to(device)
            logits = model(x)
            totals[0] += F.cross_entropy(logits, y, reduction="sum").item()
            totals[1] += (logits.argmax(1) == y).sum().item()
            totals[2] += len(y)
        return totals

    def eval_metrics(self, totals: torch.Tensor) -> dict[str, float]:
        return {"eval/loss": totals[0].item() / totals[2].item(), "eval/accuracy": totals[1].item() / totals[2].item()}


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
    """The task of this run: a built-in one for a registered model, else the user's
    (``--task``, ``--model``/``--dataset MODULE:CALLABLE``, or ``own``: a :class:`~.usertask.Task`
    handed to :func:`allreduce_train.fit`). A user's code is imported and called here, on every rank
    alike; what fails becomes one :class:`ConfigError` line."""
    from . import usercode
    from .usertask import Task as OwnTask
    from .usertask import TaskAdapter

    m = cfg.model
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
    own_model = usercode.is_reference(m.model)
    own_data = usercode.is_reference(cfg.data.dataset)
    if not own_model and not own_data:
        spec = MODELS[m.model]
        return LanguageModelTask(cfg, spec) if spec.task == "lm" else ClassifyTask(cfg, spec)
    if own_model:
        ref, kwargs = m.model, usercode.parse_kwargs("--model-arg", m.model_arg)
        fn = usercode.resolve("--model", ref)
        spec = ModelSpec(
            name=ref,
            build=lambda: usercode.call("--model", ref, fn, **kwargs),
            input_shape=(),
            num_classes=0,
            description="your own model",
        )
    else:
        spec = MODELS[m.model]
        if spec.task == "lm":
            raise ConfigError(
                f"--model {m.model} is a language model over a token stream (--dataset ptb); with your "
                "own --dataset use your own --task (docs/own_model.md)"
            )
    if not own_data:
        if cfg.data.dataset != "fashion-mnist":
            raise ConfigError(
                f"--model {m.model} with --dataset {cfg.data.dataset}: your own model trains on "
                "fashion-mnist or your own --dataset MODULE:CALLABLE (synthetic data needs a registered "
                "model's input shape)"
            )
        return ClassifyTask(cfg, spec)
    ref, dkwargs = cfg.data.dataset, usercode.parse_kwargs("--dataset-arg", cfg.data.dataset_arg)
    data_fn = usercode.resolve("--dataset", ref)
    task = OwnTask(model=spec.build, data=lambda: usercode.call("--dataset", ref, data_fn, **dkwargs))
    return TaskAdapter(task, f"--model {m.model} --dataset {ref}", cfg)
