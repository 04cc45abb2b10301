"""The task of a run (:func:`make_task`): always a public :class:`~.usertask.Task` -- the user's, image
classification (the Task's defaults) or the language model's (:class:`LanguageModelTask`).

The loop in :mod:`.trainer` is the same for all; a task supplies the data for this worker, the
loss of one (micro-)batch and the evaluation sums. Evaluation returns *sums* (loss, counts) so that
the trainer can add them over workers before dividing: global, token-weighted figures.

The language-model task carries the LSTM's hidden state from one window of ``bptt`` tokens to the
next and detaches it, so gradients flow back at most ``bptt`` steps (truncated BPTT); the state
restarts at zero every epoch and is checkpointed per worker (a resume continues the text from it).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from models import MODELS, ModelSpec

from .config import Config
from .data import ptb
from .data.images import TensorDataset, fashion_mnist, synthetic
from .errors import ConfigError
from .usertask import Task


class LanguageModelTask(Task):
    """Token windows -> next-token logits; truncated BPTT; perplexity over the validation text."""

    def __init__(self, cfg: Config, spec: ModelSpec) -> None:
        from . import usercode

        if usercode.is_reference(cfg.data.dataset):
            raise ConfigError(
                f"--model {spec.name} is a language model over a token stream (--dataset ptb); with your "
                "own --dataset use your own --task (docs/own_model.md)"
            )
        super().__init__()
        self.cfg, self.spec, self.source = cfg, spec, f"--model {spec.name}"
        self.bptt = self.words_per_sample = spec.bptt
        self.vocab_size = spec.num_classes
        self.hidden: dict[
            int, tuple[torch.Tensor, ...]
        ] = {}  # first row of a micro-batch -> its state after the previous window
        self.micro = 0  # which micro-batch of the step the next loss() is (the trainer takes them in order)
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

    def shards(self, cfg: Config, rank: int, num_shards: int) -> tuple[ptb.LMBatches, ptb.EvalStream]:
        """Contiguous rows of the text per worker, in order every epoch (the state follows the text)."""
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
        self.hidden, self.micro = {}, 0  # the text starts over: so does the state

    def state_dict(self) -> dict[str, Any]:
        # the LSTM state after the last window: a resumed run continues the text mid-epoch from it
        return {"hidden": {k: tuple(h.cpu() for h in v) for k, v in self.hidden.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        # on the CPU as saved: loss() moves a state to its batch's device when it takes it
        self.hidden, self.micro = dict(state.get("hidden", {})), 0

    def loss(self, model: torch.nn.Module, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """inputs, targets: (b, bptt), the next micro-batch of this worker's batch (the trainer cuts a batch
        into ``--backward-passes-per-step`` of them, in order): its rows carry their own state."""
        first = self.micro * len(inputs)  # its first row in the worker's batch
        self.micro = (self.micro + 1) % self.cfg.exchange.backward_passes_per_step
        state = self.hidden.get(first)
        if state is not None:
            state = tuple(h.to(inputs.device) for h in state)
        logits, state = model(inputs, state)  # (b, bptt, V); None -> zeros
        # detached: the next window starts from this state, but gradients stop here (truncated BPTT)
        self.hidden[first] = tuple(h.detach() for h in state)
        return F.cross_entropy(logits.flatten(0, 1), targets.flatten())

    def eval_sums(self, model: torch.nn.Module, inputs: torch.Tensor, targets: torch.Tensor) -> dict[str, float]:
        """Summed loss over every target of one block of parallel streams (:meth:`.ptb.EvalStream.batches`),
        read in windows of ``bptt`` that carry the state across."""
        loss, hidden = 0.0, None
        for lo in range(0, inputs.shape[1], self.bptt):
            logits, hidden = model(inputs[:, lo : lo + self.bptt], hidden)
            y = targets[:, lo : lo + self.bptt]
            loss += F.cross_entropy(logits.flatten(0, 1), y.flatten(), reduction="sum").item()
        return {"loss": loss, "tokens": targets.numel()}

    def eval_metrics(self, sums: dict[str, float]) -> dict[str, float]:
        loss = sums["loss"] / sums["tokens"]
        return {"loss": loss, "perplexity": math.exp(min(loss, 700.0))}  # exp overflows past ~709


def make_task(cfg: Config, own: Task | None = None) -> Task:
    """The task of this run, a public :class:`~.usertask.Task` whichever flag names it: the user's
    (``own``, handed to :func:`allreduce_train.fit`; else ``--task``), else the one of ``--model``'s
    kind (a registered model's ``ModelSpec.task``; the user's ``--model MODULE:CALLABLE`` classifies).
    A user's code is imported and called here, on every rank alike; what fails becomes one
    :class:`ConfigError` line."""
    from . import usercode

    m = cfg.model
    if own is not None:
        task, task.source = own, "fit()"
    elif m.task:
        kwargs = usercode.parse_kwargs("--model-arg", m.model_arg)
        task = usercode.call("--task", m.task, usercode.resolve("--task", m.task), **kwargs)
        if not isinstance(task, Task):
            raise ConfigError(
                f"--task {m.task} returned a {type(task).__name__}; return an allreduce_train.Task "
                "(subclass it, docs/own_model.md)"
            )
        task.source = f"--task {m.task}"
    else:
        spec = None if usercode.is_reference(m.model) else MODELS[m.model]
        task = KINDS[spec.task if spec is not None else "classify"](cfg, spec)
    return task


def classification(cfg: Config, spec: ModelSpec | None) -> Task:
    """The public Task's defaults on a registered image model or the user's ``--model MODULE:CALLABLE``
    (``spec`` None), on a built-in image set or the user's ``--dataset MODULE:CALLABLE``."""
    from . import usercode

    m, dataset = cfg.model, cfg.data.dataset
    own_data = usercode.is_reference(dataset)
    if spec is None and not own_data and dataset != "fashion-mnist":
        raise ConfigError(
            f"--model {m.model} with --dataset {dataset}: your own model trains on fashion-mnist or your "
            "own --dataset MODULE:CALLABLE (synthetic data needs a registered model's input shape)"
        )
    build = spec.build if spec is not None else _by_reference("--model", m.model, "--model-arg", m.model_arg)
    if own_data:
        data = _by_reference("--dataset", dataset, "--dataset-arg", cfg.data.dataset_arg)
        task = Task(model=build, data=data)
        task.source = f"--model {m.model} --dataset {dataset}"
    else:
        task = Task(model=build, data=lambda: images(cfg, spec))
        task.source = f"--model {m.model}"
    return task


KINDS: dict[str, Callable[..., Task]] = {"classify": classification, "lm": LanguageModelTask}  # by ModelSpec.task


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
