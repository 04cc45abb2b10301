"""The training loop, shared by every gradient-exchange strategy.

The distributed recipe, in Horovod's order: the strategy has initialised the process group and
knows the local rank -> pin the device to it -> threads = cores / ranks on this host -> seeds ->
this worker's data shard -> LR scaled by the worker count with linear warm-up -> parameters and
optimizer state broadcast from rank 0 (fresh or resumed) -> the exchange-wrapped optimizer ->
the shard order set per epoch. Figures are reduced over workers before they are logged.
"""

from __future__ import annotations

import math
import socket
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from . import preempt, trace, watchdog
from .checkpointer import Checkpointer, Parts
from .config import Config, parse_slow_rank
from .devices import local_cores, pick_device
from .distributed import make_schedule
from .distributed.base import GradientExchange
from .distributed.batchnorm import average_buffers, sync_batchnorm
from .errors import ConfigError, Diverged, Preempted
from .memory import MemoryLog, peak_rss_mib
from .metrics import Throughput, TimeToTarget, words_per_sec
from .optim import LRSchedule, build_optimizer
from .precision import Precision
from .run_logger import NullLogger, flat_hparams
from .stragglers import StragglerRule, window_median_ms
from .tasks import make_task
from .usertask import Batches, Task


@dataclass
class Setup:
    """Everything built before the first step; failures here are reported once and end every rank."""

    device: torch.device
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    batches: Batches
    eval_set: Any  # this worker's evaluation share: a TensorDataset or a ptb.EvalStream
    total_steps: int
    start_step: int  # the main rank's: 0, or the resumed checkpoint's (Checkpointer.load)


@dataclass
class Progress:
    """Where a run is, carried from step to step by :meth:`Trainer.run` and what it delegates to."""

    step: int
    stop_at: int  # the schedule's end, --exit-after-steps, or the step --target was reached at
    spe: int  # steps per epoch
    eval_every: int
    meter: Throughput
    ranks: list[int]  # each worker's global rank and host, by worker index
    hosts: list[str]
    rule: StragglerRule
    target: TimeToTarget
    loss_sum: torch.Tensor  # the training loss summed since the last log, on the device (no sync per step)
    since_log: int = 0
    lr: float = 0.0
    train_loss: float = float("nan")
    last_eval: dict[str, float] = field(default_factory=dict)


class Trainer:
    """Builds a run (:meth:`build`), trains it (:meth:`run`) and reports it (:meth:`report`) through
    any :class:`GradientExchange`; ranks that only serve never get here (job.run)."""

    def __init__(self, cfg: Config, exchange: GradientExchange, run_dir: str, task: Task | None = None) -> None:
        """``task``: a user's :class:`~.usertask.Task` object (:func:`allreduce_train.fit`); else the
        configuration names the task (a registered model, or the user's code by reference)."""
        self.cfg, self.ex, self.run_dir = cfg, exchange, run_dir
        self.trace = exchange.tracer = trace.make(cfg.run.trace_steps, exchange.rank, run_dir)  # --trace-steps
        self.own_task = task
        self.task: Task  # made in build(): a user's code fails there, as a set-up error of every rank
        slow = parse_slow_rank(cfg.train.debug_slow_rank) if cfg.train.debug_slow_rank else (-1, 1.0)
        self.slow_factor = slow[1] if slow[0] == exchange.rank else 1.0  # --debug-slow-rank on this rank
        # the schedule (synchronous, local SGD, DiLoCo) with its wire format, over the engine: wraps every step
        self.schedule = make_schedule(cfg.exchange, exchange)
        self.precision = Precision("32", torch.device("cpu"))  # build() sets --precision on the run's device
        self.lr_schedule: LRSchedule  # made in build(), which knows the run's length
        self.optimizer_name = ""
        self.checkpoints = Checkpointer(cfg, exchange, run_dir, agree=self.agree_buffers)  # load, restore, save

    # ---------------------------------------------------------------- set-up
    def build(self) -> Setup:
        cfg, ex = self.cfg, self.ex
        if cfg.train.debug_slow_rank:
            slow, _ = parse_slow_rank(cfg.train.debug_slow_rank)
            if slow >= ex.size:
                raise ConfigError(
                    f"--debug-slow-rank {cfg.train.debug_slow_rank}: there is no rank {slow} (ranks 0-{ex.size - 1})"
                )
            if slow == ex.rank and not ex.is_worker:
                raise ConfigError(
                    f"--debug-slow-rank {cfg.train.debug_slow_rank}: rank {slow} only serves "
                    "(a dedicated parameter server) and computes no gradients; name a worker's rank"
                )
        device = pick_device(cfg.train.device, ex.local_rank, announce=ex.is_main)
        torch.set_num_threads(cfg.train.threads or max(1, local_cores() // ex.local_size))
        if cfg.train.flush_denormal and not torch.set_flush_denormal(True) and ex.is_main:
            print(
                "--flush-denormal: this CPU cannot flush denormal floats (torch.set_flush_denormal needs SSE3); "
                "they stay as they are",
                flush=True,
            )
        torch.manual_seed(cfg.train.seed)  # same seed everywhere: identical initial parameters

        # classification, language model or the user's own: data, loss, evaluation
        self.task = make_task(cfg, self.own_task)
        batches, eval_set = self.task.shards(cfg, ex.worker_index, ex.num_workers)
        total = cfg.train.steps or cfg.train.epochs * batches.steps_per_epoch

        model = self.task.checked_model().to(device)
        x, y = batches.sample_batch()  # one batch through the model and the loss before any rank trains
        self.task.check(model, x.to(device), y.to(device))
        if cfg.exchange.sync_batchnorm:  # before the optimizer takes the parameters and prepare() broadcasts them
            model, swapped = sync_batchnorm(model, cfg.exchange.engine, ex, device)
            if not swapped and ex.is_main:
                print("--sync-batchnorm: the model has no BatchNorm layer; the flag changes nothing", flush=True)
        # Identical parameters came from the common seed; dropout masks must differ between workers.
        torch.manual_seed(cfg.train.seed + 1_000_003 * (ex.worker_index + 1))
        self.precision = Precision(cfg.train.precision, device)  # 16-mixed without CUDA: one line here
        optimizer = build_optimizer(cfg.optim, model, self.task)  # --optimizer, or the task's own
        self.optimizer_name = type(optimizer).__name__
        if cfg.exchange.strategy == "ps":  # what the servers cannot run fails here, with every rank's set-up
            from .distributed.ps.optimizer import describe

            describe(optimizer, list(model.parameters()))
        self.memory = MemoryLog.check(cfg, ex, model, optimizer, device)  # refuses a run that cannot fit its limit
        self.lr_schedule = LRSchedule.make(cfg.optim, ex.num_workers, total, batches.steps_per_epoch)
        self.lr_schedule.set(optimizer, 0)
        start = self.checkpoints.load(model, optimizer)  # rank 0: --resume's state, or --init-from's weights
        return Setup(device, model, optimizer, batches, eval_set, total, start)

    # ---------------------------------------------------------------- one step
    def train_step(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        inputs: Any,  # a batch of the task's, as its loss() takes it
        targets: Any,
        k: int,
        step: int = 0,
        after_backward: Callable[[], None] | None = None,
    ) -> tuple[torch.Tensor, float, bool]:
        """Forward/backward over ``k`` micro-batches, exchange gradients, update step ``step`` (1-based).

        ``after_backward`` runs once backward is done, while the last gradients are still in flight (the loop
        fetches the next batch there). Returns (loss, wait s, stop): ``stop`` when a worker received a stop
        signal (see :mod:`.preempt`). Raises :class:`Diverged` on every worker alike, before the update, when
        a worker's loss or the averaged gradient's norm is not finite.
        """
        began = time.perf_counter()
        self.schedule.begin(step)  # e.g. local SGD: does this step's gradient travel?
        optimizer.zero_grad()
        rows = len(inputs) // k
        loss_sum: torch.Tensor | None = None
        precision = self.precision
        for j in range(k):
            part = slice(j * rows, (j + 1) * rows)
            self.trace.mark("forward")
            with precision.forward_context():  # --precision: autocast (bf16-mixed, 16-mixed) or nothing
                loss = self.task.loss(model, inputs[part] if k > 1 else inputs, targets[part] if k > 1 else targets)
            if k > 1:
                loss = loss / k  # the mean over the micro-batches (dividing by 1 would only add an op)
            loss_sum = loss.detach() if loss_sum is None else loss_sum + loss.detach()
            if j == k - 1:
                # communication: the step's vote, summed over workers: [stop signals, losses]; a sum is
                # finite only if every worker's loss is, so all decide alike. Started before the last
                # backward (the loss is known), so it travels while backward runs and is back with the
                # gradients: started after backward it came back after them, behind a poll of its own.
                # (.item(): on a GPU this waits for the forward pass's kernels.)
                self.ex.start_vote(
                    torch.tensor([float(bool(preempt.requested())), loss_sum.item()], dtype=torch.float64)
                )
            self.trace.mark("backward")
            precision.backward(loss)  # the allreduce of each gradient starts from its hook, overlapping backward
        if self.slow_factor > 1:  # --debug-slow-rank: a straggler on purpose (tests)
            time.sleep((self.slow_factor - 1) * (time.perf_counter() - began))
        if after_backward is not None:
            self.trace.mark("data")
            after_backward()
        t0 = time.perf_counter()  # the wait starts: whatever follows is exchange, not this rank's compute
        self.trace.mark("wait")
        watchdog.note(step, watchdog.EXCHANGING)
        self.schedule.synchronize()  # the engine's gradient sums (and a wire format's own: PowerSGD's)
        stops, losses = self.ex.end_vote().tolist()
        wait = time.perf_counter() - t0
        self.trace.mark("update")
        if not math.isfinite(losses):
            raise Diverged(step, "the training loss (mean over workers)", losses / self.ex.num_workers)
        if precision.scaler is not None:  # 16-mixed: unscaled before clipping; inf/NaN skips the step everywhere
            vote = None if self.schedule.averaged(step) else self.ex.sum_over_workers  # local steps: workers vote
            precision.unscale(list(model.parameters()), vote=vote)
        if self.cfg.optim.grad_clip > 0:
            # after the exchange: the norm of the averaged gradient, identical on every worker
            norm = torch.nn.utils.clip_grad_norm_(model.parameters(), self.cfg.optim.grad_clip)
            if not torch.isfinite(norm):
                raise Diverged(step, "the gradient norm", norm.item())
        self.schedule.apply(optimizer, model, step)  # the update (local SGD, DiLoCo: and the period's average)
        assert loss_sum is not None  # k >= 1 micro-batches
        return loss_sum, wait, stops > 0

    @torch.no_grad()
    def evaluate(self, model: torch.nn.Module, eval_set: Any, device: torch.device) -> dict[str, float]:
        """Figures over the whole evaluation set: each worker scores its share, the sums are reduced
        (loss and accuracy; for a language model, token-weighted loss and perplexity)."""
        self.trace.mark("evaluation")
        self.agree_buffers(model)
        model.eval()
        with self.precision.forward_context():
            totals = self.task.evaluate(model, eval_set, device, self.cfg.data.eval_batch_size)
        model.train()
        return self.task.figures(self.ex.sum_over_workers(totals))  # communication: global sums

    def agree_buffers(self, model: torch.nn.Module) -> None:
        """The parameters whole (--shard-stage 3 gathers them) and BatchNorm's running statistics averaged over the
        workers, unless --no-average-buffers: the model evaluated, saved and returned is the same on every rank."""
        self.ex.whole_parameters(model)  # communication where the parameters are sharded
        if self.cfg.exchange.average_buffers:
            average_buffers(model, self.ex)  # communication: two grouped sums of the buffers

    def log_figures(self, loss_sum: torch.Tensor, steps: int, meter: Throughput) -> tuple[float, torch.Tensor]:
        """The training loss of the last ``steps`` steps averaged over workers (not rank 0's share),
        and every worker's :meth:`Throughput.per_rank` figures as rows by worker index."""
        workers, me = self.ex.num_workers, self.ex.worker_index
        mine = torch.zeros(1 + 3 * workers, dtype=torch.float64)
        mine[0] = (loss_sum.cpu() / steps).double()
        mine[1 + 3 * me : 4 + 3 * me] = torch.tensor(
            meter.per_rank(steps, self.cfg.train.straggler_window), dtype=torch.float64
        )
        # communication: one sum over workers per log interval; each worker fills only its own row
        total = self.ex.sum_over_workers(mine)
        return (total[0] / workers).item(), total[1:].view(workers, 3)

    # ---------------------------------------------------------------- the run
    def run(self, s: Setup, log: NullLogger) -> dict[str, Any]:
        """Train from ``s.start_step`` to the end of the schedule (or ``--exit-after-steps``): a loop of
        delegations (the step, the log, the evaluation, the checkpoint) over one :class:`Progress`."""
        optimizer = self.schedule.prepare(s.model, s.optimizer)  # communication: rank 0's state to every worker
        parts = Parts(
            s.model, optimizer, self.schedule, self.task, self.precision, self.lr_schedule, s.batches, s.device
        )
        step = self.checkpoints.restore(parts, s.start_step, log)  # communication: the step, each worker's state
        p = self.begin(s, step, log)
        s.model.train()
        while p.step < p.stop_at:
            epoch, in_epoch = divmod(p.step, p.spe)
            self.task.start_epoch(epoch)
            self.checkpoints.resume_task(in_epoch)  # resumed mid-epoch: the task's state of the saved step
            batches = s.batches.batches(epoch, in_epoch)  # the shard order of this epoch
            ahead = [next(batches, None)]

            def gather_next(ahead: list = ahead, batches: Iterator = batches) -> None:  # this epoch's, bound here
                ahead[0] = next(batches, None)

            while ahead[0] is not None:
                # the next batch is gathered while this step's last gradients travel (the same batches in
                # the same order; at 2 ranks the gather leaves the step's critical path)
                stop = self.one_step(s, optimizer, ahead[0], p, gather_next, log)
                if p.step % self.cfg.train.log_every == 0 or p.step == p.stop_at:
                    self.log_interval(p, log)
                improved = False
                if p.step % p.eval_every == 0 or p.step == s.total_steps:
                    improved = self.evaluate_now(s, p, log)
                latest = self.checkpoints.due(p.step, last=p.step == p.stop_at or stop)
                if latest or improved:
                    self.trace.mark("checkpoint")
                    self.checkpoints.save(p.step, latest, improved)
                if stop:  # every worker saw the same vote: all stop after this step
                    raise Preempted(p.step, preempt.requested() or "a signal to another rank")
                if p.step >= p.stop_at:
                    break
        return self.finish(s, optimizer, p, log)

    def begin(self, s: Setup, step: int, log: NullLogger) -> Progress:
        """The run's banner and its :class:`Progress` from ``step`` (communication: every worker's rank and host,
        by worker index, for naming a straggler)."""
        cfg, ex = self.cfg, self.ex
        workers, per_step = ex.num_workers, cfg.data.batch_size * cfg.exchange.backward_passes_per_step
        spe = s.batches.steps_per_epoch
        stop_at = min(s.total_steps, step + cfg.train.exit_after_steps) if cfg.train.exit_after_steps else s.total_steps
        data = "its own data" if cfg.model.task else cfg.data.dataset
        log.message(
            f"{cfg.model.task or cfg.model.model} on {data}: {workers} workers x batch {per_step} = global batch "
            f"{workers * per_step}, {s.total_steps} steps ({spe}/epoch), strategy {ex.name}, from step {step}"
        )
        if self.task.note:  # e.g. which text a language model reads, and whether its figures compare with PTB
            log.message(self.task.note)
            log.text("data", self.task.note)
        meter = Throughput(workers * per_step, cfg.train.perf_warmup_steps)
        ranks, hosts = zip(*ex.gather_from_workers((ex.rank, socket.gethostname())), strict=True)
        return Progress(
            step=step,
            stop_at=stop_at,
            spe=spe,
            eval_every=cfg.train.eval_every or spe,
            meter=meter,
            ranks=list(ranks),
            hosts=list(hosts),
            rule=StragglerRule(cfg.train.straggler_factor, cfg.train.straggler_window, ranks, hosts),
            target=TimeToTarget(cfg.train.target),
            loss_sum=torch.zeros((), device=s.device),
        )

    def one_step(
        self,
        s: Setup,
        optimizer: torch.optim.Optimizer,
        batch: tuple[Any, Any],
        p: Progress,
        gather_next: Callable[[], None],
        log: NullLogger,
    ) -> bool:
        """One optimizer step on ``batch``, timed and counted in ``p``; whether every worker is to stop after it
        (a preemption vote)."""
        device, k = s.device, self.cfg.exchange.backward_passes_per_step
        inputs, targets = batch
        self.trace.step(p.step)  # --trace-steps: phases from here (data first) to the next step
        started = time.perf_counter()
        p.lr = self.lr_schedule.set(optimizer, p.step)  # every group's LR for this update
        watchdog.note(p.step + 1, watchdog.COMPUTING)
        inputs, targets = inputs.to(device, non_blocking=True), targets.to(device, non_blocking=True)
        loss, wait, stop = self.train_step(
            s.model, optimizer, inputs, targets, k, p.step + 1, after_backward=gather_next
        )
        self.trace.mark("")  # the update ends; log steps are the step's, no phase's
        if device.type == "cuda":
            torch.cuda.synchronize()  # honest step times
        p.step += 1
        watchdog.note(p.step, watchdog.AFTER)
        p.meter.record(started, wait)
        self.memory.after_step(p.step, s.model, optimizer, log)  # communication: every rank's, after the first
        p.loss_sum += loss
        p.since_log += 1
        log.progress(1)
        return stop

    def log_interval(self, p: Progress, log: NullLogger) -> None:
        """The figures of the steps since the last log, reduced over the workers (communication), the
        straggler rule's verdict on them, and the exchange's own counters."""
        p.train_loss, figures = self.log_figures(p.loss_sum, p.since_log, p.meter)
        values = {
            "train/loss": p.train_loss,
            "train/lr": p.lr,
            "train/epoch": p.step / p.spe,
            **p.meter.recent(p.since_log),
        }
        for r, (compute_ms, wait_ms, _) in zip(p.ranks, figures.tolist(), strict=True):
            values.update({f"perf/compute_ms/rank{r}": compute_ms, f"perf/wait_ms/rank{r}": wait_ms})
        if window_median_ms(p.meter.computes, self.cfg.train.straggler_window, p.meter.warmup) is not None:
            for found in p.rule.check(p.step, figures[:, 2].tolist()):  # the same figures on every worker
                log.message(found.line())
                log.text("perf/straggler", found.line())
        values.update(words_per_sec(self.task, values["perf/samples_per_sec"]))
        values.update({f"comm/{key}": v for key, v in self.ex.stats().items()})
        log.scalars(p.step, values)
        log.progress(0, loss=f"{p.train_loss:.4f}")
        p.loss_sum.zero_()
        p.since_log = 0

    def evaluate_now(self, s: Setup, p: Progress, log: NullLogger) -> bool:
        """Evaluate, log, and check ``--target`` (reached: every rank stops at this step); whether the figures
        are the best so far (``--keep-best``)."""
        p.last_eval = self.evaluate(s.model, s.eval_set, s.device)
        improved = self.checkpoints.record(p.step, p.last_eval)
        log.scalars(p.step, p.last_eval)
        log.message(
            f"step {p.step}: " + ", ".join(f"{key.replace('/', ' ')} {v:.4f}" for key, v in p.last_eval.items())
        )
        if p.target.record(p.step, p.step / p.spe, p.last_eval):
            seconds = p.target.reached["seconds"] if p.target.reached else float("nan")
            log.message(
                f"target {self.cfg.train.target} reached at step {p.step} (epoch {p.step / p.spe:.2f}) "
                f"after {seconds:.1f} s"
            )
            p.stop_at = p.step  # every rank evaluated the same global figures: all stop here
        return improved

    def finish(self, s: Setup, optimizer: torch.optim.Optimizer, p: Progress, log: NullLogger) -> dict[str, Any]:
        """The end of the run: the trace written, the model agreed, a last evaluation if none ran, and the
        run's figures (communication: every worker's CPU seconds, medians and peak memory)."""
        cfg, ex, model = self.cfg, self.ex, s.model
        self.trace.close()  # writes the trace, if the run ended before --trace-steps' last step
        self.agree_buffers(model)  # the model every rank dumps and returns
        if not p.last_eval:
            p.last_eval = self.evaluate(model, s.eval_set, s.device)
            log.scalars(p.step, p.last_eval)
        # communication: CPU seconds of all workers (a busy-polling exchange shows up here) and, in
        # each worker's own row, its median compute and wait over the run and its peak resident memory
        workers = ex.num_workers
        own = torch.zeros(1 + 3 * workers, dtype=torch.float64)
        own[0] = p.meter.cpu_seconds
        own[1 + 3 * ex.worker_index : 4 + 3 * ex.worker_index] = torch.tensor(
            [*p.meter.run_medians(), peak_rss_mib()], dtype=torch.float64
        )
        total = ex.sum_over_workers(own)
        cpu_s = total[0].item()
        per_rank = [
            {"rank": r, "host": h, "compute_ms": c, "wait_ms": w, "peak_rss_mib": m}
            for r, h, (c, w, m) in zip(p.ranks, p.hosts, total[1:].view(workers, 3).tolist(), strict=True)
        ]
        if cfg.run.dump_params:
            torch.save(
                {n: t.detach().cpu() for n, t in model.state_dict().items()},
                cfg.run.dump_params.replace("{rank}", str(ex.rank)),
            )
        return {
            **self.result(p.step, s.total_steps, p.meter.summary(cpu_s), p.train_loss, p.last_eval),
            **p.target.summary(),
            "ranks": per_rank,
            "stragglers": [found.record() for found in p.rule.found],
            "straggler_rule": {"factor": cfg.train.straggler_factor, "window": cfg.train.straggler_window},
            "memory": self.memory.finish(p.step, model, optimizer, log),  # communication: every rank's figures
        }

    def result(
        self, step: int, total: int, perf: dict[str, float], train_loss: float, last_eval: dict[str, float]
    ) -> dict[str, Any]:
        """metrics.json: what ran, how fast, and where it ended."""
        cfg, ex = self.cfg, self.ex
        per_step = cfg.data.batch_size * cfg.exchange.backward_passes_per_step
        return {
            "strategy": ex.name,
            "world_size": ex.size,
            "workers": ex.num_workers,
            "model": cfg.model.task or cfg.model.model,
            "dataset": cfg.data.dataset,
            "batch_size": cfg.data.batch_size,
            "global_batch": ex.num_workers * per_step,
            "steps": step,
            "total_steps": total,
            "completed": step >= total,
            **perf,
            **{key.split("/")[1]: v for key, v in words_per_sec(self.task, perf["samples_per_sec"]).items()},
            "final": {"train_loss": train_loss, **{key.replace("/", "_"): v for key, v in last_eval.items()}},
            **ex.describe(),
            **self.schedule.describe(),
            "optimizer": self.optimizer_name,
            **self.lr_schedule.describe(),
            **self.precision.describe(),
        }

    def report(self, result: dict[str, Any], log: NullLogger) -> None:
        """The end of a run on the main rank: HParams, metrics.json and the one-line summary."""
        evals = {key: v for key, v in result["final"].items() if key.startswith("eval_")}  # accuracy or perplexity
        log.hparams(
            flat_hparams(self.cfg),
            {**{f"hparam/{key}": v for key, v in evals.items()}, "hparam/samples_per_sec": result["samples_per_sec"]},
        )
        log.write_json("metrics.json", result)
        words = f", {result['words_per_sec']:.0f} words/s" if "words_per_sec" in result else ""
        log.message(
            f"done: {result['steps']} steps, "
            + ", ".join(f"{key.replace('_', ' ')} {v:.4f}" for key, v in evals.items())
            + f", {result['samples_per_sec']:.0f} samples/s{words} "
            f"({result['workers']} workers), step {result['step_ms']:.2f} ms -> {result['run_dir']}"
        )
