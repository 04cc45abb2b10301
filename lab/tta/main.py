"""``time-to-accuracy``: how long each exchange method takes to train a model to a quality target.

    python -m lab time-to-accuracy                     # make time-to-accuracy
    python -m lab time-to-accuracy --models lenet5 --methods ring-horovod,ps-async-colocated \\
        --workers 1,2 --target lenet5=eval/accuracy>=0.85

Throughput alone flatters an asynchronous parameter server: it updates without waiting, but its
gradients are stale (computed on parameters that other workers' updates have since moved), so it
may need more steps to reach the same model. MLPerf's metric is the wall-clock time to a target
quality; this grid measures it. Every point is a real mpirun job of the trainer on the model's
own real data with ``--target`` (the trainer stops at the first evaluation that reaches it and
records every evaluation's time in metrics.json); evaluations run a fixed number of times per epoch.
Worker counts from ``--emulate-from`` up run on emulated hosts (network namespaces, one rank per
host, ``--link-rate`` per link; root), smaller ones on this machine.

Output in ``runs/time-to-accuracy/<time>/``: ``report.md``, ``results.json``, ``results.csv``,
``runs/<model>/<method>-n<N>-r<k>/`` (each job's TensorBoard run and metrics.json), ``logs/``,
``summary/`` (TensorBoard: every job's evaluations against the training step and against the
wall-clock time, one run per job so that they overlay).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from dataclasses import asdict
from typing import Any

from ..common.jobs import Launcher, loadavg, local_launcher, read_json
from ..common.jobs import run as run_job
from .report import markdown, plot_time_to_accuracy, write_csv, write_tensorboard
from .spec import WORKLOADS, Method, TtaConfig, TtaError, methods


def trainer_args(cfg: TtaConfig, model: str, method: Method, run_dir: str, name: str, eval_every: int) -> list[str]:
    w = WORKLOADS[model]
    return ["--model", model, "--dataset", w.dataset, *method.flags, "--target", cfg.target(model),
            "--epochs", str(cfg.epochs(model)), "--eval-every", str(eval_every), "--seed", str(cfg.seed),
            # one thread per rank, as in the scaling grid: N workers use N cores, whatever the host
            "--threads", "1", "--log-every", str(max(1, eval_every // 2)),
            "--checkpoint-every", str(10 ** 9),  # the final one only: a checkpoint is no part of the figure
            "--no-progress", "--run-dir", run_dir, "--name", name, *cfg.extra]


def steps_per_epoch(cfg: TtaConfig, model: str, workers: int) -> int:
    """The trainer's steps per epoch for ``workers`` workers, from the same data and settings it reads."""
    from allreduce_train.cli import make_parser
    from allreduce_train.config import build_config
    from allreduce_train.errors import UserError
    from allreduce_train.tasks import make_task

    args = ["--model", model, "--dataset", WORKLOADS[model].dataset, *cfg.extra]
    try:
        tcfg = build_config(make_parser().parse_args(["train", *args]))
        return make_task(tcfg).data(0, workers)[0].steps_per_epoch
    except UserError as e:
        raise TtaError(f"{model} at {workers} workers: {e}") from None


def run_point(cfg: TtaConfig, out: str, model: str, method: Method, workers: int, repeat: int,
              launcher: Launcher) -> dict[str, Any]:
    """One job: train to the target (or the epoch limit) and read back when it got there."""
    name = f"{method.name}-n{workers}-r{repeat}"
    run_dir = os.path.join(out, "runs", model)
    spe = steps_per_epoch(cfg, model, workers)
    eval_every = max(1, spe // cfg.evals_per_epoch)
    world = workers + method.servers
    argv = launcher(world, trainer_args(cfg, model, method, run_dir, name, eval_every))
    log_path = os.path.join(out, "logs", f"{model}-{name}.log")
    load = loadavg()
    res = run_job(argv, env={**os.environ, "OMP_NUM_THREADS": "1", "ALLREDUCE_TRAIN_PROGRESS": "0"},
                  timeout=cfg.job_timeout, log_path=log_path)
    rec: dict[str, Any] = {
        "model": model, "method": method.name, "workers": workers, "servers": method.servers, "world_size": world,
        "synchronous": method.synchronous, "repeat": repeat, "emulated": cfg.emulated(workers),
        "hosts": f"{world} emulated, {cfg.link_rate}" if cfg.emulated(workers) else "this machine",
        "target": cfg.target(model), "steps_per_epoch": spe, "eval_every": eval_every, "job_seconds": res.seconds,
        "loadavg_before": load[0] if load else None, "loadavg_after": (loadavg() or [None])[0],
        "log": os.path.relpath(log_path, out), "run": os.path.relpath(os.path.join(run_dir, name), out),
        "argv": argv}
    m = read_json(os.path.join(run_dir, name, "metrics.json")) if res.ok else None
    if m is None:
        return {**rec, "ok": False, "error": res.error_line() if not res.ok else "no metrics.json"}
    t = m.get("target", {})
    rec.update(ok=True, reached=bool(t.get("reached")), evals=m.get("evals", []), steps=m["steps"],
               samples_per_sec=m["samples_per_sec"], step_ms=m["step_ms"], global_batch=m["global_batch"],
               final=m["final"], staleness_mean=m.get("staleness_mean"), staleness_max=m.get("staleness_max"))
    if rec["reached"]:
        rec.update(steps_to_target=t["step"], epochs_to_target=t["epoch"], seconds_to_target=t["seconds"],
                   samples_to_target=t["step"] * m["global_batch"])
    return rec


def emulation_note(cfg: TtaConfig) -> str | None:
    """Why the emulated points cannot run here, or None."""
    if not any(cfg.emulated(n) for n in cfg.workers):
        return None
    from lab.emulation.netns import unavailable_reason

    return unavailable_reason()


def run(cfg: TtaConfig, launcher: Launcher = local_launcher) -> dict[str, Any]:
    """Run the grid and write every output; returns the results (as in results.json)."""
    from lab.common.jobs import emulated_launcher

    started, t0 = time.strftime("%Y-%m-%d %H:%M:%S"), time.monotonic()
    out = cfg.out_dir or os.path.join("runs", "time-to-accuracy", time.strftime("%Y%m%d-%H%M%S"))
    os.makedirs(os.path.join(out, "logs"), exist_ok=True)
    print(f"time to accuracy -> {out}", flush=True)
    notes: list[str] = []
    workers = list(cfg.workers)
    reason = emulation_note(cfg)
    if reason:
        notes.append(f"worker counts >= {cfg.emulate_from} skipped: emulated hosts unavailable ({reason})")
        workers = [n for n in workers if not cfg.emulated(n)]
    emulated = None if reason else emulated_launcher(cfg.link_rate, timeout=max(60.0, cfg.job_timeout - 60),
                                                     mpi_allreduce=cfg.mpi_allreduce)
    table = methods()
    # One asynchronous worker is its synchronous twin (nothing can be stale), so it is not run.
    points = [(r, m, table[name], n) for r in range(1, cfg.repeats + 1) for m in cfg.models for name in cfg.methods
              for n in workers if table[name].synchronous or n > 1]
    if any(not table[name].synchronous for name in cfg.methods) and 1 in workers:
        notes.append("asynchronous methods at N=1 not run: one worker has no stale gradients, so it is the "
                     "synchronous run")
    records = []
    for i, (r, model, method, n) in enumerate(points, 1):
        try:
            rec = run_point(cfg, out, model, method, n, r, emulated if cfg.emulated(n) else launcher)
        except KeyboardInterrupt:  # Ctrl-C also ended the job's ranks: report what was measured
            notes.append(f"interrupted after {i - 1} of {len(points)} jobs")
            break
        records.append(rec)
        if not rec["ok"]:
            figure = f"FAILED ({rec['error']})"
            notes.append(f"{model} {method.name} N={n} r{r} failed: {rec['error']} (see {rec['log']})")
        elif rec["reached"]:
            figure = (f"{rec['target']} after {rec['seconds_to_target']:.1f} s, {rec['steps_to_target']} steps, "
                      f"{rec['epochs_to_target']:.2f} epochs")
        else:
            figure = f"{rec['target']} not reached in {rec['steps']} steps"
        print(f"[{i:3d}/{len(points)}] {model:15s} {method.name:19s} N={n} r{r}: {figure} "
              f"(job {rec['job_seconds']:.0f} s, load {rec['loadavg_before']})", flush=True)

    res = {"started": started, "minutes": (time.monotonic() - t0) / 60,
           "command": ["python", "-m", "lab", *sys.argv[1:]], "out_dir": out,
           "machine": {"cores": os.cpu_count(), "platform": platform.platform()}, "config": asdict(cfg),
           "targets": {m: cfg.target(m) for m in cfg.models}, "what": {m: WORKLOADS[m].what for m in cfg.models},
           "methods": {name: table[name].description for name in cfg.methods}, "jobs": records, "notes": notes,
           "loadavg_end": loadavg()}
    with open(os.path.join(out, "results.json"), "w") as fh:
        json.dump(res, fh, indent=2, default=str)
        fh.write("\n")
    write_csv(os.path.join(out, "results.csv"), records)
    write_tensorboard(os.path.join(out, "summary"), records)
    plot_time_to_accuracy(os.path.join(out, "time_to_accuracy.png"), res)
    with open(os.path.join(out, "report.md"), "w") as fh:
        fh.write(markdown(res))
    print(f"done in {res['minutes']:.1f} min: {out}/report.md; make tensorboard RUN={out}/summary", flush=True)
    return res


# ------------------------------------------------------------------------- command line

def add_arguments(p: argparse.ArgumentParser) -> None:
    from launch.mpirun import add_mpi_allreduce_arg

    d = TtaConfig()
    p.add_argument("--models", default=",".join(d.models), help=f"comma-separated subset of {', '.join(WORKLOADS)}")
    p.add_argument("--methods", default=",".join(d.methods),
                   help=f"comma-separated subset of {', '.join(methods())} (default: all)")
    p.add_argument("--workers", default=",".join(map(str, d.workers)), help="worker counts (default: 1,2,4)")
    p.add_argument("--emulate-from", type=int, default=d.emulate_from,
                   help="worker counts from this one up run on emulated hosts, one rank per host (root; "
                        "0 = never; default: 4)")
    p.add_argument("--link-rate", default=d.link_rate, help="emulated hosts' link rate per direction (default: 1gbit)")
    add_mpi_allreduce_arg(p, d.mpi_allreduce, f"{d.mpi_allreduce}, as `python -m launch --emulate-hosts`")
    p.add_argument("--target", action="append", default=[], metavar="MODEL=METRIC>=VALUE",
                   help="a model's target instead of its default (" + "; ".join(
                       f"{m}: {w.target}" for m, w in WORKLOADS.items()) + "); repeatable")
    p.add_argument("--max-epochs", type=int, default=0,
                   help="stop a run that has not reached its target after this many epochs (default: per model, "
                        + ", ".join(f"{m} {w.max_epochs}" for m, w in WORKLOADS.items()) + ")")
    p.add_argument("--evals-per-epoch", type=int, default=d.evals_per_epoch,
                   help="evaluations per epoch: the resolution of the steps to the target (default: 4)")
    p.add_argument("--repeats", type=int, default=d.repeats, help="jobs per point (default: 1)")
    p.add_argument("--seed", type=int, default=d.seed, help="the trainer's --seed for every job (default: 42)")
    p.add_argument("--out-dir", default="", help="output directory (default: runs/time-to-accuracy/<time>)")
    p.add_argument("--extra", action="append", default=[], metavar="ARG",
                   help="an extra trainer argument for every job, e.g. --extra=--lr --extra=0.02")
    p.add_argument("--job-timeout", type=float, default=d.job_timeout, help="seconds before a job is stopped")


def _list(text: str, flag: str) -> list[str]:
    vals = [v.strip() for v in text.split(",") if v.strip()]
    if not vals:
        raise TtaError(f"{flag}: empty list")
    return vals


def config_from_args(args: argparse.Namespace) -> TtaConfig:
    from allreduce_train.config import parse_target
    from allreduce_train.errors import UserError
    from lab.emulation.netns import parse_rate

    models = _list(args.models, "--models")
    bad = [m for m in models if m not in WORKLOADS]
    if bad:
        raise TtaError(f"--models: no time-to-accuracy workload for {bad[0]!r}; choose from: {', '.join(WORKLOADS)}")
    names = _list(args.methods, "--methods")
    bad = [m for m in names if m not in methods()]
    if bad:
        raise TtaError(f"--methods: unknown method {bad[0]!r}; choose from: {', '.join(methods())}")
    try:
        workers = sorted({int(v) for v in _list(args.workers, "--workers")})
    except ValueError:
        raise TtaError(f"--workers: expected comma-separated integers (got {args.workers!r})") from None
    if workers[0] < 1:
        raise TtaError(f"--workers: counts must be >= 1 (got {args.workers!r})")
    targets = {}
    for t in args.target:
        model, sep, target = t.partition("=")
        if not sep or model not in WORKLOADS:
            raise TtaError(f"--target {t!r}: write MODEL=METRIC>=VALUE with MODEL one of {', '.join(WORKLOADS)}, "
                           "e.g. lenet5=eval/accuracy>=0.85")
        try:
            parse_target(target)
        except UserError as e:
            raise TtaError(str(e)) from None
        targets[model] = target
    for flag, v, lo in (("--max-epochs", args.max_epochs, 0), ("--evals-per-epoch", args.evals_per_epoch, 1),
                        ("--repeats", args.repeats, 1), ("--emulate-from", args.emulate_from, 0)):
        if v < lo:
            raise TtaError(f"{flag} must be >= {lo} (got {v})")
    if args.job_timeout < 120:
        raise TtaError(f"--job-timeout must be >= 120 s (got {args.job_timeout:g})")
    try:
        parse_rate(args.link_rate)
    except ValueError as e:
        raise TtaError(str(e)) from None
    return TtaConfig(models=models, methods=names, workers=workers, emulate_from=args.emulate_from,
                     link_rate=args.link_rate, mpi_allreduce=args.mpi_allreduce, targets=targets,
                     max_epochs=args.max_epochs, evals_per_epoch=args.evals_per_epoch, repeats=args.repeats,
                     seed=args.seed, out_dir=args.out_dir, extra=args.extra, job_timeout=args.job_timeout)


def main(args: argparse.Namespace) -> int:
    try:
        cfg = config_from_args(args)
        res = run(cfg)
    except TtaError as e:
        print(f"time-to-accuracy: error: {e}", file=sys.stderr)
        return 2
    if any(n.startswith("interrupted") for n in res["notes"]):
        return 130
    return 0 if res["jobs"] and all(j["ok"] for j in res["jobs"]) else 1
