"""``time-to-accuracy``: how long each exchange method takes to train a model to a quality target.

    python -m lab time-to-accuracy                     # make time-to-accuracy
    python -m lab time-to-accuracy --models lenet5 --methods ring-horovod,ps-async-colocated \\
        --workers 1,2 --target lenet5=eval/accuracy>=0.85
    python -m lab time-to-accuracy --task examples.gpt.task:build --target 'eval/loss<=2.5' \\
        --optimizer adamw --lr 3e-4 --lr-schedule cosine --precision bf16-mixed --methods concepts

Throughput alone flatters an asynchronous parameter server: it updates without waiting, but its
gradients are stale (computed on parameters that other workers' updates have since moved), so it
may need more steps to reach the same model. MLPerf's metric is the wall-clock time to a target
quality; this grid measures it. Every point is a real mpirun job of the trainer on the model's
own real data with ``--target`` (the trainer stops at the first evaluation that reaches it and
records every evaluation's time in metrics.json); evaluations run a fixed number of times per epoch.
The recipe flags (lab/common/recipe.py: ``--optimizer``, its arguments, ``--lr-schedule``, ``--precision``)
reach every job; the report states them and what each job ran (its metrics.json).
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

from ..common import recipe
from ..common.jobs import EMULATED_ALLREDUCE_HELP, Launcher, loadavg, local_launcher, read_json
from ..common.jobs import run as run_job
from .report import add_model_ratios, markdown, plot_time_to_accuracy, write_csv, write_tensorboard
from .spec import WORKLOADS, Method, TtaConfig, TtaError, Workload, method_groups, methods


def trainer_args(cfg: TtaConfig, model: str, method: Method, run_dir: str, name: str, eval_every: int) -> list[str]:
    w = cfg.workload(model)
    return [
        *w.trainer_flags(),
        *method.flags,
        "--target",
        cfg.target(model),
        "--epochs",
        str(cfg.epochs(model)),
        "--eval-every",
        str(eval_every),
        "--seed",
        str(cfg.seed),
        # one thread per rank, as in the scaling grid: N workers use N cores, whatever the host
        "--threads",
        "1",
        "--log-every",
        str(max(1, eval_every // 2)),
        "--checkpoint-every",
        str(10**9),  # the final one only: a checkpoint is no part of the figure
        "--no-progress",
        "--run-dir",
        run_dir,
        "--name",
        name,
        *cfg.recipe,
        *cfg.extra,
    ]


def steps_per_epoch(cfg: TtaConfig, model: str, workers: int) -> int:
    """The trainer's steps per epoch for ``workers`` workers, from the same data and settings it reads."""
    from allreduce_train.cli import make_parser
    from allreduce_train.config import build_config
    from allreduce_train.errors import UserError
    from allreduce_train.tasks import make_task

    args = [*cfg.workload(model).trainer_flags(), *cfg.recipe, *cfg.extra]
    try:
        tcfg = build_config(make_parser().parse_args(["train", *args]))
        return make_task(tcfg).shards(tcfg, 0, workers)[0].steps_per_epoch
    except UserError as e:
        raise TtaError(f"{model} at {workers} workers: {e}") from None


def slug(model: str) -> str:
    """A model's name in file names: a registered name, or ``module.callable`` for MODULE:CALLABLE."""
    from allreduce_train.usercode import is_reference, label

    return label(model) if is_reference(model) else model


def job_name(method: str, workers: int, repeat: int, rate: str | None) -> str:
    """``<method>-n<N>-r<k>``, with the link rate after N on emulated hosts (one grid runs several rates)."""
    return f"{method}-n{workers}{f'-{rate}' if rate else ''}-r{repeat}"


def run_point(
    cfg: TtaConfig,
    out: str,
    model: str,
    method: Method,
    workers: int,
    repeat: int,
    launcher: Launcher,
    rate: str | None = None,
) -> dict[str, Any]:
    """One job: train to the target (or the epoch limit) and read back when it got there; ``rate``: the
    emulated hosts' link rate (None on this machine)."""
    name = job_name(method.name, workers, repeat, rate)
    run_dir = os.path.join(out, "runs", slug(model))
    spe = steps_per_epoch(cfg, model, workers)
    eval_every = max(1, spe // cfg.evals_per_epoch)
    world = workers + method.servers
    argv = launcher(world, trainer_args(cfg, model, method, run_dir, name, eval_every))
    log_path = os.path.join(out, "logs", f"{slug(model)}-{name}.log")
    load = loadavg()
    res = run_job(
        argv,
        env={**os.environ, "OMP_NUM_THREADS": "1", "ALLREDUCE_TRAIN_PROGRESS": "0"},
        timeout=cfg.job_timeout,
        log_path=log_path,
    )
    rec: dict[str, Any] = {
        "model": model,
        "method": method.name,
        "workers": workers,
        "servers": method.servers,
        "world_size": world,
        "synchronous": method.synchronous,
        "repeat": repeat,
        "emulated": rate is not None,
        "link_rate": rate,
        "name": name,
        "concept": method.concept,
        "hosts": f"{world} emulated, {rate}" if rate is not None else "this machine",
        "target": cfg.target(model),
        "steps_per_epoch": spe,
        "eval_every": eval_every,
        "job_seconds": res.seconds,
        "loadavg_before": load[0] if load else None,
        "loadavg_after": after[0] if (after := loadavg()) else None,
        "log": os.path.relpath(log_path, out),
        "run": os.path.relpath(os.path.join(run_dir, name), out),
        "argv": argv,
    }
    if model in cfg.own:  # the cost model's gradient (report.add_model_ratios) without importing the user's code
        from ..common import usermodel

        rec["grad_shapes"] = [list(s) for s in usermodel.shapes(cfg.own[model].source)]
    m = read_json(os.path.join(run_dir, name, "metrics.json")) if res.ok else None
    if m is None:
        return {**rec, "ok": False, "error": res.error_line() if not res.ok else "no metrics.json"}
    t = m.get("target", {})
    rec.update(
        ok=True,
        reached=bool(t.get("reached")),
        evals=m.get("evals", []),
        steps=m["steps"],
        samples_per_sec=m["samples_per_sec"],
        step_ms=m["step_ms"],
        comm_wait_ms=m.get("comm_wait_ms"),
        global_batch=m["global_batch"],
        final=m["final"],
        staleness_mean=m.get("staleness_mean"),
        staleness_max=m.get("staleness_max"),
        recipe=recipe.ran(m),
    )
    if rec["reached"]:
        rec.update(
            steps_to_target=t["step"],
            epochs_to_target=t["epoch"],
            seconds_to_target=t["seconds"],
            samples_to_target=t["step"] * m["global_batch"],
        )
    return rec


def grid_points(cfg: TtaConfig, workers: list[int]) -> list[tuple[int, str, Method, int, str | None]]:
    """The jobs in the order they run: (repeat, model, method, N, link rate or None on this machine).
    One asynchronous worker is its synchronous twin (nothing can be stale), so it is not run. Emulated
    worker counts run once per link rate, the others once (this machine has no emulated link)."""
    table = methods()
    return [
        (r, m, table[name], n, rate)
        for r in range(1, cfg.repeats + 1)
        for m in cfg.models
        for rate in ([None] + cfg.rates)
        for n in workers
        for name in cfg.methods
        if (table[name].synchronous or n > 1) and (rate is not None) == cfg.emulated(n)
    ]


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
    launchers: dict[str | None, Launcher] = {None: launcher}
    if not reason:
        for link in cfg.rates:
            launchers[link] = emulated_launcher(
                link, timeout=max(60.0, cfg.job_timeout - 60), mpi_allreduce=cfg.mpi_allreduce
            )
    table = methods()
    points = grid_points(cfg, workers)
    if any(not table[name].synchronous for name in cfg.methods) and 1 in workers:
        notes.append(
            "asynchronous methods at N=1 not run: one worker has no stale gradients, so it is the synchronous run"
        )
    records = []
    for i, (r, model, method, n, rate) in enumerate(points, 1):
        try:
            rec = run_point(cfg, out, model, method, n, r, launchers[rate], rate)
        except KeyboardInterrupt:  # Ctrl-C also ended the job's ranks: report what was measured
            notes.append(f"interrupted after {i - 1} of {len(points)} jobs")
            break
        records.append(rec)
        if not rec["ok"]:
            figure = f"FAILED ({rec['error']})"
            notes.append(
                f"{model} {method.name} N={n}{f' {rate}' if rate else ''} r{r} failed: {rec['error']} "
                f"(see {rec['log']})"
            )
        elif rec["reached"]:
            figure = (
                f"{rec['target']} after {rec['seconds_to_target']:.1f} s, {rec['steps_to_target']} steps, "
                f"{rec['epochs_to_target']:.2f} epochs"
            )
        else:
            figure = f"{rec['target']} not reached in {rec['steps']} steps"
        print(
            f"[{i:3d}/{len(points)}] {model:15s} {method.name:25s} N={n}{f' {rate}' if rate else ''} r{r}: {figure} "
            f"(job {rec['job_seconds']:.0f} s, load {rec['loadavg_before']})",
            flush=True,
        )

    res = {
        "started": started,
        "minutes": (time.monotonic() - t0) / 60,
        "command": ["python", "-m", "lab", *sys.argv[1:]],
        "out_dir": out,
        "machine": {"cores": os.cpu_count(), "platform": platform.platform()},
        "config": asdict(cfg),
        "targets": {m: cfg.target(m) for m in cfg.models},
        "what": {m: cfg.workload(m).what for m in cfg.models},
        "methods": {name: table[name].description for name in cfg.methods},
        "jobs": records,
        "notes": notes,
        "loadavg_end": loadavg(),
    }
    write_outputs(out, res)
    print(f"done in {res['minutes']:.1f} min: {out}/report.md; make tensorboard RUN={out}/summary", flush=True)
    return res


def write_outputs(out: str, res: dict[str, Any]) -> None:
    """results.json (with the cost model's prediction per emulated job), results.csv, the TensorBoard
    summary, time_to_accuracy.png and report.md, from the grid's results."""
    add_model_ratios(res["jobs"])
    with open(os.path.join(out, "results.json"), "w") as fh:
        json.dump(res, fh, indent=2, default=str)
        fh.write("\n")
    write_csv(os.path.join(out, "results.csv"), res["jobs"])
    write_tensorboard(os.path.join(out, "summary"), res["jobs"])
    plot_time_to_accuracy(os.path.join(out, "time_to_accuracy.png"), res)
    with open(os.path.join(out, "report.md"), "w") as fh:
        fh.write(markdown(res))


def report_again(out: str) -> dict[str, Any]:
    """Write a finished grid's outputs again from its results.json with this version's report (figures a
    grid of an earlier version did not record, such as the exchange wait, come from each job's metrics.json)."""
    res = read_json(os.path.join(out, "results.json"))
    if res is None:
        raise TtaError(f"--report {out}: no readable results.json there")
    for j in res["jobs"]:
        m = read_json(os.path.join(out, j["run"], "metrics.json")) if j.get("ok") else None
        if m is not None and j.get("comm_wait_ms") is None:
            j["comm_wait_ms"] = m.get("comm_wait_ms")
    write_outputs(out, res)
    print(f"{out}/report.md written again", flush=True)
    return res


def merge_grids(dirs: list[str], out: str) -> dict[str, Any]:
    """One report, figure and TensorBoard summary in ``out`` for several finished grids (their results.json):
    every job of each, its run and log paths made relative to ``out``; the targets and link rates of all."""
    if not out:
        raise TtaError(f"--report {','.join(dirs)}: several grids go into one new report; name it with --out-dir")
    merged: dict[str, Any] | None = None
    for d in dirs:
        res = read_json(os.path.join(d, "results.json"))
        if res is None:
            raise TtaError(f"--report {d}: no readable results.json there")
        for j in res["jobs"]:
            for key in ("run", "log"):
                if j.get(key):
                    j[key] = os.path.relpath(os.path.join(d, j[key]), out)
        if merged is None:
            merged = {**res, "jobs": [], "targets": {}, "what": {}, "minutes": 0.0, "merged_from": []}
            merged["config"] = dict(res["config"])
        cfg = merged["config"]
        if "rates" in res["config"]:
            cfg["rates"] = list(dict.fromkeys([*cfg.get("rates", []), *res["config"]["rates"]]))
        merged["jobs"] += res["jobs"]
        merged["targets"].update(res["targets"])
        merged["what"].update(res["what"])
        merged["minutes"] += res["minutes"]
        merged["merged_from"].append(" ".join(res["command"]))
        merged["notes"] = [*merged.get("notes", []), *(n for n in res["notes"] if n not in merged.get("notes", []))]
        merged["loadavg_end"] = res.get("loadavg_end")
    assert merged is not None
    merged["command"] = ["python", "-m", "lab", "time-to-accuracy", "--report", ",".join(dirs), "--out-dir", out]
    merged["out_dir"] = out
    os.makedirs(out, exist_ok=True)
    write_outputs(out, merged)
    print(f"{out}/report.md: {len(dirs)} grids, {len(merged['jobs'])} jobs", flush=True)
    return merged


# ------------------------------------------------------------------------- command line


def add_arguments(p: argparse.ArgumentParser) -> None:
    from launch.mpirun import add_mpi_allreduce_arg

    d = TtaConfig()
    p.add_argument(
        "--models",
        default=None,
        help=f"comma-separated subset of {', '.join(WORKLOADS)} (default: all of them, or none with --model/--task)",
    )
    add_own_arguments(p)
    p.add_argument(
        "--methods",
        default="exchanges",
        help=f"comma-separated methods or groups: {', '.join(methods())}; groups: "
        + "; ".join(f"{g} ({len(v)} methods)" for g, v in method_groups().items())
        + " (default: exchanges, the six without a concept; docs/concepts.md for the others)",
    )
    p.add_argument("--workers", default=",".join(map(str, d.workers)), help="worker counts (default: 1,2,4)")
    p.add_argument(
        "--emulate-from",
        type=int,
        default=d.emulate_from,
        help="worker counts from this one up run on emulated hosts, one rank per host (root; 0 = never; default: 4)",
    )
    p.add_argument(
        "--rates",
        default=None,
        help="emulated hosts' link rates per direction, comma-separated, one row of emulated points each, "
        f"e.g. 1gbit,100mbit,10mbit (default: {','.join(d.rates)})",
    )
    p.add_argument("--link-rate", default=None, help="one emulated link rate (the same as --rates with one rate)")
    add_mpi_allreduce_arg(p, d.mpi_allreduce, EMULATED_ALLREDUCE_HELP)
    p.add_argument(
        "--target",
        action="append",
        default=[],
        metavar="MODEL=METRIC>=VALUE",
        help="a model's target instead of its default ("
        + "; ".join(f"{m}: {w.target}" for m, w in WORKLOADS.items())
        + "); repeatable",
    )
    p.add_argument(
        "--max-epochs",
        type=int,
        default=0,
        help="stop a run that has not reached its target after this many epochs (default: per model, "
        + ", ".join(f"{m} {w.max_epochs}" for m, w in WORKLOADS.items())
        + ")",
    )
    p.add_argument(
        "--evals-per-epoch",
        type=int,
        default=d.evals_per_epoch,
        help="evaluations per epoch: the resolution of the steps to the target (default: 4)",
    )
    p.add_argument("--repeats", type=int, default=d.repeats, help="jobs per point (default: 1)")
    p.add_argument("--seed", type=int, default=d.seed, help="the trainer's --seed for every job (default: 42)")
    p.add_argument("--out-dir", default="", help="output directory (default: runs/time-to-accuracy/<time>)")
    p.add_argument(
        "--extra",
        action="append",
        default=[],
        metavar="ARG",
        help="an extra trainer argument for every job, e.g. --extra=--lr --extra=0.02",
    )
    p.add_argument("--job-timeout", type=float, default=d.job_timeout, help="seconds before a job is stopped")
    recipe.add_arguments(p)
    p.add_argument(
        "--report",
        default="",
        metavar="DIR[,DIR...]",
        help="run nothing: write the report of the grid in DIR (its results.json) again; several "
        "grids: one report of all their jobs in --out-dir",
    )


def add_own_arguments(p: argparse.ArgumentParser) -> None:
    """--model/--task/--dataset and their keyword arguments: a user's model (docs/own_model.md)."""
    p.add_argument(
        "--model",
        default="",
        metavar="MODULE:CALLABLE",
        help="your own model (a callable returning an nn.Module), trained on --dataset; give its --target",
    )
    p.add_argument(
        "--task",
        default="",
        metavar="MODULE:CALLABLE",
        help="your own task (a callable returning an allreduce_train.Task); give its --target",
    )
    p.add_argument(
        "--model-arg",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="keyword argument for --model's/--task's callable (repeatable)",
    )
    p.add_argument("--dataset", default="", help="your own --model's data: fashion-mnist (default) or MODULE:CALLABLE")
    p.add_argument(
        "--dataset-arg",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="keyword argument for --dataset's callable (repeatable)",
    )


def own_workloads(args: argparse.Namespace) -> dict[str, Workload]:
    """The user's model of the command line as a workload ({} without --model/--task); its code is imported
    and called here, so a bad reference is one line before any job."""
    from allreduce_train.errors import UserError

    from ..common import usermodel

    if not (args.model or args.task):
        if args.model_arg or args.dataset or args.dataset_arg:
            raise TtaError("--model-arg/--dataset/--dataset-arg go with your own --model or --task")
        return {}
    if args.model and args.task:
        raise TtaError("--model and --task: give one (a task names its own model and data)")
    if args.model and not usermodel.is_reference(args.model):
        raise TtaError(
            f"--model {args.model}: a registered model is chosen with --models; --model is your own MODULE:CALLABLE"
        )
    w = usermodel.from_args(
        args.model, task=args.task, dataset=args.dataset, model_args=args.model_arg, dataset_args=args.dataset_arg
    )
    try:
        usermodel.task_of(w)
    except UserError as e:
        raise TtaError(str(e)) from None
    what = "your own task's evaluation" if w.task else f"evaluation on {w.dataset or 'fashion-mnist'}"
    return {w.name: Workload(w.name, w.dataset, "", 10, what, tuple(w.flags()), w)}


def _list(text: str, flag: str) -> list[str]:
    vals = [v.strip() for v in text.split(",") if v.strip()]
    if not vals:
        raise TtaError(f"{flag}: empty list")
    return vals


def config_from_args(args: argparse.Namespace) -> TtaConfig:
    from allreduce_train.config import parse_target
    from allreduce_train.errors import UserError
    from lab.emulation.netns import parse_rate

    from ..common import usermodel
    from ..common.links import parse_rates

    own = own_workloads(args)
    given = args.models if args.models is not None else ("" if own else ",".join(TtaConfig().models))
    models = [*(_list(given, "--models") if given else []), *own]
    bad = [m for m in models if m not in WORKLOADS and m not in own]
    if bad:
        raise TtaError(f"--models: no time-to-accuracy workload for {bad[0]!r}; choose from: {', '.join(WORKLOADS)}")
    groups = method_groups()
    names = []
    for v in _list(args.methods, "--methods"):
        if v not in methods() and v not in groups:
            raise TtaError(
                f"--methods: unknown method {v!r}; choose from: {', '.join(methods())} or a group: {', '.join(groups)}"
            )
        names += [n for n in groups.get(v, [v]) if n not in names]
    try:
        workers = sorted({int(v) for v in _list(args.workers, "--workers")})
    except ValueError:
        raise TtaError(f"--workers: expected comma-separated integers (got {args.workers!r})") from None
    if workers[0] < 1:
        raise TtaError(f"--workers: counts must be >= 1 (got {args.workers!r})")
    targets = {}
    for t in args.target:
        model, sep, target = t.partition("=")
        if own and model not in WORKLOADS:  # your own model's target is the trainer's: METRIC>=VALUE
            model, sep, target = next(iter(own)), "=", t
        if not sep or (model not in WORKLOADS and model not in own):
            raise TtaError(
                f"--target {t!r}: write MODEL=METRIC>=VALUE with MODEL one of {', '.join(WORKLOADS)}, "
                "e.g. lenet5=eval/accuracy>=0.85 (your own --model: METRIC>=VALUE)"
            )
        try:
            parse_target(target)
        except UserError as e:
            raise TtaError(str(e)) from None
        targets[model] = target
    for flag, v, lo in (
        ("--max-epochs", args.max_epochs, 0),
        ("--evals-per-epoch", args.evals_per_epoch, 1),
        ("--repeats", args.repeats, 1),
        ("--emulate-from", args.emulate_from, 0),
    ):
        if v < lo:
            raise TtaError(f"{flag} must be >= {lo} (got {v})")
    if args.job_timeout < 120:
        raise TtaError(f"--job-timeout must be >= 120 s (got {args.job_timeout:g})")
    if args.rates is not None and args.link_rate is not None:
        raise TtaError("--link-rate: give the rates with --rates alone (--link-rate is one rate)")
    try:
        if args.link_rate is not None:
            parse_rate(args.link_rate)
            rates = [args.link_rate]
        else:
            rates = parse_rates(args.rates) if args.rates is not None else TtaConfig().rates
    except ValueError as e:
        raise TtaError(str(e)) from None
    missing = [m for m in own if m not in targets]
    if missing:
        raise TtaError(
            f"--target: your own model {missing[0]} has no default target; give one, e.g. "
            "--target 'eval/accuracy>=0.85' or --target 'eval/loss<=2.0'"
        )
    if len(set(rates)) < len(rates):
        raise TtaError(f"--rates: a rate given twice ({args.rates})")
    flags = recipe.argv(args)
    for m in models if flags else []:  # the recipe built once per model here: a bad one is one line before any job
        w = own[m].source if m in own else usermodel.from_args(m, dataset=WORKLOADS[m].dataset)
        try:
            recipe.check(w, [*flags, *args.extra])
        except UserError as e:
            raise TtaError(str(e)) from None
    return TtaConfig(
        models=models,
        methods=names,
        workers=workers,
        emulate_from=args.emulate_from,
        rates=rates,
        mpi_allreduce=args.mpi_allreduce,
        targets=targets,
        max_epochs=args.max_epochs,
        evals_per_epoch=args.evals_per_epoch,
        repeats=args.repeats,
        seed=args.seed,
        out_dir=args.out_dir,
        recipe=flags,
        extra=args.extra,
        job_timeout=args.job_timeout,
        own={m: own[m] for m in own if m in models},
    )


def main(args: argparse.Namespace) -> int:
    try:
        if args.report:
            dirs = _list(args.report, "--report")
            if len(dirs) == 1 and not args.out_dir:
                report_again(dirs[0])
            else:
                merge_grids(dirs, args.out_dir)
            return 0
        cfg = config_from_args(args)
        res = run(cfg)
    except TtaError as e:
        print(f"time-to-accuracy: error: {e}", file=sys.stderr)
        return 2
    if any(n.startswith("interrupted") for n in res["notes"]):
        return 130
    return 0 if res["jobs"] and all(j["ok"] for j in res["jobs"]) else 1
