"""The training loop, shared by every gradient-exchange strategy.

The distributed recipe, in Horovod's order: the strategy has initialised the process group and
knows the local rank -> pin the device to it -> threads = cores / ranks on this host -> seeds ->
this worker's data shard -> LR scaled by the worker count with linear warm-up -> parameters and
optimizer state broadcast from rank 0 (fresh or resumed) -> the exchange-wrapped optimizer ->
the shard order set per epoch. Figures are reduced over workers before they are logged.
"""

from __future__ import annotations

import dataclasses
import json
import os
import statistics
import time
from dataclasses import dataclass
from typing import Any

import torch

from . import checkpoint
from .config import Config
from .data.images import ShardedBatches
from .distributed.base import GradientExchange
from .errors import ConfigError
from .run_logger import NullLogger
from .tasks import make_task


def local_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def pick_device(cfg: Config, local_rank: int) -> torch.device:
    want = cfg.train.device
    if want == "cuda" or (want == "auto" and torch.cuda.is_available()):
        if not torch.cuda.is_available():
            raise ConfigError("--device cuda: no CUDA device is visible; use --device cpu")
        torch.cuda.set_device(local_rank % torch.cuda.device_count())
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def lr_at(step: int, cfg: Config, workers: int) -> float:
    """Linear warm-up from the one-worker LR to the scaled LR (Goyal et al. 2017), then constant."""
    base = cfg.optim.lr
    target = base * workers if cfg.optim.scale_lr else base
    if cfg.optim.warmup_steps == 0 or step >= cfg.optim.warmup_steps:
        return target
    return base + (target - base) * step / cfg.optim.warmup_steps


@dataclass
class Setup:
    """Everything built before the first step; failures here are reported once and end every rank."""

    device: torch.device
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    batches: ShardedBatches  # or ptb.LMBatches: same interface
    eval_set: Any  # this worker's evaluation share: a TensorDataset or a ptb.EvalStream
    total_steps: int
    start_step: int
    run_dir: str
    resume_state: dict[str, Any] | None


class Trainer:
    def __init__(self, cfg: Config, exchange: GradientExchange, run_dir: str) -> None:
        self.cfg, self.ex, self.run_dir = cfg, exchange, run_dir
        self.log: NullLogger = NullLogger()
        self.task = make_task(cfg)  # classification or language model: data, loss, evaluation

    # ---------------------------------------------------------------- set-up
    def build(self) -> Setup:
        cfg, ex = self.cfg, self.ex
        device = pick_device(cfg, ex.local_rank)
        torch.set_num_threads(cfg.train.threads or max(1, local_cores() // ex.local_size))
        torch.manual_seed(cfg.train.seed)  # same seed everywhere: identical initial parameters

        batches, eval_set = self.task.data(ex.worker_index, ex.num_workers)
        total = cfg.train.steps or cfg.train.epochs * batches.steps_per_epoch

        model = self.task.build_model().to(device)
        # Identical parameters came from the common seed; dropout masks must differ between workers.
        torch.manual_seed(cfg.train.seed + 1_000_003 * (ex.worker_index + 1))
        optimizer = torch.optim.SGD(model.parameters(), lr=lr_at(0, cfg, ex.num_workers),
                                    momentum=cfg.optim.momentum, weight_decay=cfg.optim.weight_decay)
        resume_state, start = None, 0
        if cfg.run.resume and ex.is_main:  # rank 0 reads, prepare() broadcasts
            path = os.path.join(self.run_dir, checkpoint.CHECKPOINT_NAME) if cfg.run.resume == "auto" else cfg.run.resume
            resume_state = checkpoint.load(path)
            saved = resume_state["config"]
            for section, key in (("model", "model"), ("data", "batch_size")):
                if saved[section][key] != getattr(getattr(cfg, section), key):
                    raise ConfigError(f"--resume {path}: checkpoint has {section}.{key}={saved[section][key]!r}, "
                                      f"this run {getattr(getattr(cfg, section), key)!r}; run with the same value")
            model.load_state_dict(resume_state["model"])
            optimizer.load_state_dict(resume_state["optimizer"])
            start = int(resume_state["step"])
        return Setup(device, model, optimizer, batches, eval_set, total, start, self.run_dir, resume_state)

    # ---------------------------------------------------------------- one step
    def train_step(self, model, optimizer, inputs, targets, k: int) -> tuple[torch.Tensor, float]:
        """Forward/backward over ``k`` micro-batches, exchange gradients, update. Returns (loss, wait s)."""
        optimizer.zero_grad()
        loss_sum = torch.zeros((), device=inputs.device)
        rows = len(inputs) // k
        for j in range(k):
            part = slice(j * rows, (j + 1) * rows)
            loss = self.task.loss(model, inputs[part], targets[part], part) / k
            loss.backward()  # the allreduce of each gradient starts from its hook, overlapping backward
            loss_sum += loss.detach()
        t0 = time.perf_counter()
        self.ex.synchronize()
        wait = time.perf_counter() - t0
        if self.cfg.optim.grad_clip > 0:
            # after the exchange: the norm of the averaged gradient, identical on every worker
            torch.nn.utils.clip_grad_norm_(model.parameters(), self.cfg.optim.grad_clip)
        self.ex.apply(optimizer)
        return loss_sum, wait

    @torch.no_grad()
    def evaluate(self, model, eval_set, device) -> dict[str, float]:
        """Figures over the whole evaluation set: each worker scores its share, the sums are reduced
        (loss and accuracy; for a language model, token-weighted loss and perplexity)."""
        model.eval()
        totals = self.task.eval_sums(model, eval_set, device, self.cfg.data.eval_batch_size)
        model.train()
        return self.task.eval_metrics(self.ex.sum_over_workers(totals))  # communication: global sums

    def save_checkpoint(self, s: Setup, model, optimizer, step: int) -> None:
        if self.ex.is_main:
            state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step,
                     "config": self.cfg.to_dict()}
            checkpoint.save(os.path.join(self.run_dir, checkpoint.CHECKPOINT_NAME), state)

    # ---------------------------------------------------------------- the run
    def run(self, s: Setup, log: NullLogger) -> dict[str, Any]:
        cfg, ex, self.log = self.cfg, self.ex, log
        model, device = s.model, s.device
        optimizer = ex.prepare(model, s.optimizer)
        step = ex.broadcast_object(s.start_step)  # communication: the resumed step, from rank 0
        k = cfg.exchange.backward_passes_per_step
        workers, per_step = ex.num_workers, cfg.data.batch_size * k
        spe = s.batches.steps_per_epoch
        eval_every = cfg.train.eval_every or spe
        ckpt_every = cfg.run.checkpoint_every or spe
        stop_at = min(s.total_steps, step + cfg.train.exit_after_steps) if cfg.train.exit_after_steps else s.total_steps

        log.message(f"{cfg.model.model} on {cfg.data.dataset}: {workers} workers x batch {per_step} = global batch "
                    f"{workers * per_step}, {s.total_steps} steps ({spe}/epoch), strategy {ex.name}, from step {step}")
        if self.task.note:  # e.g. which text a language model reads, and whether its figures compare with PTB
            log.message(self.task.note)
            log.text("data", self.task.note)
        step_times: list[float] = []
        waits: list[float] = []
        loss_acc = torch.zeros((), device=device)
        n_acc = 0
        last_eval: dict[str, float] = {}
        last_train_loss = float("nan")
        model.train()
        warm = cfg.train.perf_warmup_steps
        wall_from = wall_to = time.perf_counter()  # wall clock over the measured steps, bookkeeping included
        cpu_from = cpu_to = time.process_time()  # CPU time of every thread of this rank (Horovod's included)
        while step < stop_at:
            epoch, in_epoch = divmod(step, spe)
            self.task.start_epoch()
            for inputs, targets in s.batches.batches(epoch, in_epoch):  # the shard order of this epoch
                t0 = time.perf_counter()
                lr = lr_at(step, cfg, workers)
                for group in optimizer.param_groups:
                    group["lr"] = lr
                inputs, targets = inputs.to(device, non_blocking=True), targets.to(device, non_blocking=True)
                loss, wait = self.train_step(model, optimizer, inputs, targets, k)
                if device.type == "cuda":
                    torch.cuda.synchronize()  # honest step times
                step += 1
                wall_to, cpu_to = time.perf_counter(), time.process_time()
                step_times.append(wall_to - t0)
                if len(step_times) == warm:
                    wall_from, cpu_from = wall_to, cpu_to
                waits.append(wait)
                loss_acc += loss
                n_acc += 1
                log.progress(1)
                if step % cfg.train.log_every == 0 or step == stop_at:
                    # communication: the loss averaged over workers (not rank 0's share)
                    mean_loss = (ex.sum_over_workers(torch.stack([loss_acc.cpu() / n_acc]).double())[0] / workers).item()
                    last_train_loss = mean_loss
                    recent = step_times[-n_acc:]
                    rate = workers * per_step * len(recent) / sum(recent)
                    values = {"train/loss": mean_loss, "train/lr": lr, "train/epoch": step / spe,
                              "perf/step_ms": 1e3 * statistics.median(recent),
                              "perf/samples_per_sec": rate, **words_per_sec(self.task, rate),
                              "comm/wait_ms": 1e3 * statistics.median(waits[-n_acc:])}
                    values.update({f"comm/{k_}": v for k_, v in ex.stats().items()})
                    log.scalars(step, values)
                    log.progress(0, loss=f"{mean_loss:.4f}")
                    loss_acc.zero_()
                    n_acc = 0
                if step % eval_every == 0 or step == s.total_steps:
                    last_eval = self.evaluate(model, s.eval_set, device)
                    log.scalars(step, last_eval)
                    log.message(f"step {step}: " + ", ".join(f"{k_.replace('/', ' ')} {v:.4f}"
                                                             for k_, v in last_eval.items()))
                if step % ckpt_every == 0 or step == stop_at:
                    self.save_checkpoint(s, model, optimizer, step)
                if step >= stop_at:
                    break

        if not last_eval:
            last_eval = self.evaluate(model, s.eval_set, device)
            log.scalars(step, last_eval)
        measured = step_times[cfg.train.perf_warmup_steps:] or step_times
        # communication: CPU seconds of all workers; a busy-polling exchange shows up here
        cpu_s = ex.sum_over_workers(torch.tensor([cpu_to - cpu_from], dtype=torch.float64))[0].item()
        result = {
            "strategy": ex.name,
            "world_size": ex.size,
            "workers": workers,
            "model": cfg.model.model,
            "dataset": cfg.data.dataset,
            "batch_size": cfg.data.batch_size,
            "global_batch": workers * per_step,
            "steps": step,
            "total_steps": s.total_steps,
            "completed": step >= s.total_steps,
            "samples_per_sec": workers * per_step * len(measured) / sum(measured) if measured else 0.0,
            "step_ms": 1e3 * statistics.median(measured) if measured else 0.0,
            # everything between the end of warm-up and the end of the last step: what `bench` compares
            "wall_samples_per_sec": (workers * per_step * (len(step_times) - warm) / (wall_to - wall_from)
                                     if len(step_times) > warm else 0.0),
            "cpu_ms_per_step": 1e3 * cpu_s / (len(step_times) - warm) if len(step_times) > warm else 0.0,
            "comm_wait_ms": 1e3 * statistics.median(waits[cfg.train.perf_warmup_steps:] or waits) if waits else 0.0,
            **{k_.split("/")[1]: v for k_, v in words_per_sec(
                self.task, workers * per_step * len(measured) / sum(measured) if measured else 0.0).items()},
            "final": {"train_loss": last_train_loss, **{k_.replace("/", "_"): v for k_, v in last_eval.items()}},
            **ex.describe(),
        }
        if cfg.run.dump_params:
            torch.save({n: p.detach().cpu() for n, p in model.state_dict().items()},
                       cfg.run.dump_params.replace("{rank}", str(ex.rank)))
        return result


def words_per_sec(task, samples_per_sec: float) -> dict[str, float]:
    """A language model's throughput in tokens (each sample is a window of ``bptt`` words)."""
    return {"perf/words_per_sec": samples_per_sec * task.words_per_sample} if task.words_per_sample else {}


def config_text(cfg: Config) -> str:
    return "```\n" + json.dumps(cfg.to_dict(), indent=2) + "\n```"


def flat_hparams(cfg: Config) -> dict[str, Any]:
    return {f"{sec}.{k}": v for sec, d in dataclasses.asdict(cfg).items() for k, v in d.items()}
