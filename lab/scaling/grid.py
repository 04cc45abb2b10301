"""``scaling``: ring allreduce and the parameter server side by side, as workers are added.

    python -m lab scaling         # the default grid (make scaling)
    python -m lab scaling --models lenet5 --workers 1,2,4 --repeats 5

The grid is strategies x models x worker counts x repeats, and at every point the no-exchange
bound (the same workers at the same time, each alone on its shard: ``--strategy none``), which
every strategy is also reported as a fraction of; every point is a real mpirun job of
the trainer (synthetic data by default, one thread per rank, fixed warm-up and measured steps)
whose metrics.json is read back. Repeats are the outer loop, so that a change in machine load
spreads over every configuration instead of hitting one. Before the grid, a short ``commbench``
run calibrates the cost model (:mod:`.costmodel`), which then predicts every measured point and
the scaling to 1024 workers on a given network.

Output in ``runs/scaling/<time>/``: ``tensorboard/`` (the comparison: one run per strategy, speedup,
efficiency and samples/s against the worker count as the TensorBoard step, one Custom Scalars
chart per figure; :mod:`..tblog`), ``hparams/`` (one HParams session per job), ``jobs/<model>/
<strategy>-n<N>-r<k>/`` (each job's TensorBoard run and metrics.json), ``results.csv``,
``results.json``, ``report.md``, ``scaling.png``, ``predicted.png``, ``logs/``.

How jobs start is one hook, a launcher (:mod:`..jobs`: worker count and trainer arguments in, argv
out); the emulated-cluster grid (:mod:`.netns`) passes its own to :func:`run`. The variants and
settings are in :mod:`.spec`, the cost model's calibration in :mod:`.calibrate`, every output in
:mod:`.report`.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from typing import Any

from ..common import costmodel, engines, methods, tblog
from ..common.jobs import Launcher, local_launcher, read_json
from ..common.jobs import run as run_job_argv
from .calibrate import CYCLE_CANDIDATES, calibrate, choose_cycle, known_network, predictions, run_commbench
from .report import BOUND as BOUND_STRATEGY
from .report import aggregate, code_version, load_summary, write_outputs
from .spec import GridConfig, GridError, Plan, Variant, parse_list, variants

# The no-exchange bound, run beside every strategy at every N: the same workers at the same time, each
# training alone on its shard (the report's bound rows; every strategy is also reported as a fraction of it).
BOUND = Variant(
    BOUND_STRATEGY,
    "none",
    (),
    0,
    costmodel.ALLREDUCE,
    "",
    "no exchange: each worker trains alone on its shard (--strategy none), the bound",
)


def available(cfg: GridConfig) -> tuple[list[Variant], list[str], list[str]]:
    """(variants, models) to run, and a note for each model that is not in the registry."""
    from models import MODELS

    table = variants(cfg.ps_servers)
    vs = [table[name] for name in cfg.strategies]
    notes, ms = [], []
    for m in cfg.models:
        if m in MODELS:
            ms.append(m)
        else:
            notes.append(f"model {m}: skipped, not in the model registry of this checkout")
    return vs, ms, notes


def gradient_bytes(model: str) -> int:
    from models import MODELS

    return 4 * sum(p.numel() for p in MODELS[model].build().parameters() if p.requires_grad)


def dataset_args(cfg: GridConfig, model: str, plan: Plan) -> list[str]:
    if cfg.data == "synthetic":
        return ["--dataset", "synthetic", "--synthetic-samples", str(plan.samples)]
    from models import MODELS

    # each model's own data: Fashion-MNIST for the CNNs, the PTB-format corpus for the LMs
    return ["--dataset", "ptb" if MODELS[model].task == "lm" else "fashion-mnist"]


@dataclass
class Job:
    model: str
    variant: Variant
    workers: int
    repeat: int

    @property
    def world(self) -> int:
        return self.workers + self.variant.servers

    @property
    def name(self) -> str:
        return f"{self.variant.name}-n{self.workers}-r{self.repeat}"


def trainer_args(cfg: GridConfig, job: Job, run_dir: str) -> list[str]:
    plan = cfg.plan(job.model)
    total = plan.warmup + plan.steps
    return [
        "--model",
        job.model,
        *dataset_args(cfg, job.model, plan),
        "--batch-size",
        str(plan.batch_size),
        "--strategy",
        job.variant.strategy,
        *job.variant.flags,
        "--threads",
        "1",
        "--steps",
        str(total),
        "--perf-warmup-steps",
        str(plan.warmup),
        "--eval-every",
        str(total),
        "--checkpoint-every",
        str(total),
        "--log-every",
        str(max(1, total // 4)),
        # A synchronous PS cannot clip the global gradient norm (no server sees all of it), so no
        # job clips (the LSTM's recipe would): every strategy then does the same work per step.
        "--grad-clip",
        "0",
        # every job with denormal floats flushed, as bench's: the bound's workers, each on its own
        # gradient, can reach them and time the CPU's slow path instead of the code (docs/performance.md)
        "--flush-denormal",
        "--no-progress",
        "--run-dir",
        run_dir,
        "--name",
        job.name,
        *cfg.extra,
    ]


def job_env(cfg: GridConfig, cycle_ms: float | None) -> dict[str, str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "ALLREDUCE_TRAIN_PROGRESS": "0"}
    if cycle_ms is not None:
        env["HOROVOD_CYCLE_TIME"] = f"{cycle_ms:g}"
    if cfg.horovod_fusion_mb >= 0:
        env["HOROVOD_FUSION_THRESHOLD"] = str(int(cfg.horovod_fusion_mb * (1 << 20)))
    return env


def job_hparams(cfg: GridConfig, job: Job) -> dict[str, Any]:
    """What a job ran, as the HParams view shows it (the trainer's defaults where no flag says)."""
    flags = [*job.variant.flags, *cfg.extra]
    ps = job.variant.strategy == "ps"
    # the sharded stages run on the allreduce engines (--allreduce-engine, Horovod by default)
    engine = engines.MPI4PY if ps or tblog.flag_value(flags, "--allreduce-engine", "") == "mpi" else engines.HOROVOD
    return {
        "model": job.model,
        "variant": job.variant.name,
        "strategy": job.variant.strategy,
        "placement": tblog.flag_value(flags, "--ps-placement", "dedicated") if ps else "-",
        "mode": tblog.flag_value(flags, "--ps-mode", "sync") if ps else "sync",
        "engine": engine,
        "workers": job.workers,
        "servers": job.variant.servers,
        "link_rate": cfg.link_rate or "this host",
    }


def run_job(cfg: GridConfig, job: Job, out: str, launcher: Launcher, cycle_ms: float | None = None) -> dict[str, Any]:
    """One grid point: launch it, wait, read back its metrics.json."""
    run_dir = os.path.join(out, tblog.JOBS_DIR, job.model)
    argv = launcher(job.world, trainer_args(cfg, job, run_dir))
    log_path = os.path.join(out, "logs", f"{job.model}-{job.name}.log")
    load = os.getloadavg()[0]
    res = run_job_argv(argv, env=job_env(cfg, cycle_ms), timeout=cfg.job_timeout, log_path=log_path)
    record = {
        "model": job.model,
        "strategy": job.variant.name,
        "workers": job.workers,
        "servers": job.variant.servers,
        "world_size": job.world,
        "repeat": job.repeat,
        "seconds": res.seconds,
        "loadavg_before": load,
        "log": os.path.relpath(log_path, out),
        "run": os.path.relpath(os.path.join(run_dir, job.name), out),
        "argv": argv,
        "hparams": job_hparams(cfg, job),
    }
    m = read_json(os.path.join(run_dir, job.name, "metrics.json")) if res.ok else None
    if m is not None:
        record.update(
            ok=True,
            samples_per_sec=m["samples_per_sec"],
            step_ms=m["step_ms"],
            comm_wait_ms=m["comm_wait_ms"],
            global_batch=m["global_batch"],
        )
        if (m.get("target") or {}).get("reached"):  # --extra=--target ...: the time to that quality
            record["time_to_target_s"] = m["target"]["seconds"]
    else:
        record.update(ok=False, error=res.error_line())
    return record


# ------------------------------------------------------------------------- the run


def run(
    cfg: GridConfig, launcher: Launcher = local_launcher, network: tuple[costmodel.Network, str] | None = None
) -> dict[str, Any]:
    """Run the grid and write every output; returns the results (as in results.json).

    ``network``: the network is known (the emulated grid's link rate) and its (alpha, B) stand for
    every strategy instead of a commbench calibration; the second item says where it came from."""
    started, code = time.strftime("%Y-%m-%d %H:%M:%S"), code_version()
    t_start = time.perf_counter()
    vs, models, notes = available(cfg)
    if not vs or not models:
        raise GridError("nothing to run: " + "; ".join(notes))
    out = cfg.out_dir or os.path.join("runs", "scaling", time.strftime("%Y%m%d-%H%M%S"))
    os.makedirs(os.path.join(out, "logs"), exist_ok=True)
    print(f"scaling grid -> {out}", flush=True)
    for n in notes:
        print(f"  note: {n}", flush=True)

    calib_path = cfg.calibration
    if not calib_path and cfg.commbench:
        try:
            calib_path = run_commbench(cfg, vs, out)
        except (OSError, subprocess.SubprocessError, ValueError, GridError) as e:  # the grid still runs
            notes.append(f"commbench for calibration failed: {e}")

    report = None
    if calib_path and os.path.exists(calib_path):
        with open(calib_path) as fh:
            report = methods.renamed(json.load(fh), methods.COMMBENCH_OLD)  # an older commbench.json too
    cycle_ms, horovod_job = parse_cycle(cfg.horovod_cycle_ms), "default"
    if cycle_ms is not None:
        horovod_job = f"cycle={cycle_ms:g}ms"  # commbench's label of that configuration
    elif cfg.horovod_cycle_ms == "auto" and report:
        cycle_ms, horovod_job = choose_cycle(report)
    knob = "Horovod's default" if cycle_ms is None else f"{cycle_ms:g} ms"
    print(f"HOROVOD_CYCLE_TIME for the allreduce jobs: {knob}", flush=True)

    jobs = [
        Job(m, v, n, r) for r in range(1, cfg.repeats + 1) for m in models for v in [*vs, BOUND] for n in cfg.workers
    ]
    records = []
    for i, job in enumerate(jobs, 1):
        try:
            # the Horovod cycle time of every job on Horovod's collectives: the ring's and the sharded stages'
            on_horovod = job.variant.strategy in ("allreduce", "sharded")
            rec = run_job(cfg, job, out, launcher, cycle_ms if on_horovod else None)
        except KeyboardInterrupt:  # Ctrl-C also ended the job's ranks: report what was measured
            notes.append(f"interrupted after {i - 1} of {len(jobs)} jobs")
            break
        records.append(rec)
        done = time.perf_counter() - t_start
        eta = done / i * (len(jobs) - i)
        figure = f"{rec['samples_per_sec']:9.1f} samples/s" if rec["ok"] else f"FAILED ({rec['error']})"
        print(
            f"[{i:3d}/{len(jobs)}] {job.model:15s} {job.variant.name:13s} N={job.workers} "
            f"(+{job.variant.servers}) r{job.repeat}: {figure}  {rec['seconds']:5.1f} s, eta {eta / 60:4.1f} min",
            flush=True,
        )
        if not rec["ok"]:
            notes.append(f"{job.model} {job.name} failed: {rec['error']} (see {rec['log']})")

    rows = aggregate(records)
    plans = {m: cfg.plan(m) for m in models}
    sizes = {m: gradient_bytes(m) for m in models}
    calib = known_network(vs, *network) if network else calibrate(report, vs, horovod_job) if report else {}
    given = costmodel.Network.from_gbit_us(cfg.net_gbps, cfg.net_latency_us)
    given_label = f"{cfg.net_gbps:g} Gbit/s, {cfg.net_latency_us:g} us"
    compute, compute_source, curves = predictions(rows, vs, models, plans, calib, given, sizes)

    res: dict[str, Any] = {
        "started": started,
        "seconds": time.perf_counter() - t_start,
        "command": ["python", "-m", "lab", *sys.argv[1:]],
        "out_dir": out,
        "code": code,
        "machine": {"cores": os.cpu_count(), "platform": platform.platform()},
        "config": asdict(cfg),
        "models": models,
        "strategies": [v.name for v in vs],
        "plans": {m: asdict(p) for m, p in plans.items()},
        "gradient_bytes": sizes,
        "horovod_cycle": {"setting": cfg.horovod_cycle_ms, "used_ms": cycle_ms, "knob": knob},
        "loadavg": load_summary(records),
        "rows": rows,
        "jobs": records,
        "notes": notes,
        "compute_s": compute,
        "compute_source": compute_source,
        "calibration": calib,
        "calibration_source": os.path.relpath(calib_path, out) if calib_path else "",
        "given_network": {"gbps": cfg.net_gbps, "latency_us": cfg.net_latency_us, "label": given_label},
        "curves": curves,
    }
    with open(os.path.join(out, "results.json"), "w") as fh:
        json.dump(res, fh, indent=2, default=str)
        fh.write("\n")
    write_outputs(res)
    print(
        f"done in {res['seconds'] / 60:.1f} min: {out}/report.md, scaling.png, results.csv; "
        f"make tensorboard RUN={out}/{tblog.COMPARISON_DIR}",
        flush=True,
    )
    return res


# ------------------------------------------------------------------------- command line


def add_arguments(p: argparse.ArgumentParser) -> None:
    d = GridConfig()
    p.add_argument(
        "--strategies",
        default=",".join(d.strategies),
        help=f"comma-separated subset of {', '.join(variants())} (default: all)",
    )
    p.add_argument(
        "--models", default=",".join(d.models), help=f"comma-separated models (default: {','.join(d.models)})"
    )
    p.add_argument(
        "--workers",
        default=",".join(map(str, d.workers)),
        help="comma-separated worker counts; include 1, the speedup baseline (default: 1,2)",
    )
    p.add_argument("--repeats", type=int, default=d.repeats, help=f"jobs per grid point (default: {d.repeats})")
    p.add_argument(
        "--data",
        choices=("synthetic", "real"),
        default=d.data,
        help="synthetic (default) or each model's own dataset (Fashion-MNIST, the PTB-format corpus)",
    )
    p.add_argument("--steps", type=int, default=d.steps, help="measured steps per job (default: per model, 8-40)")
    p.add_argument(
        "--warmup-steps",
        type=int,
        default=d.warmup_steps,
        help="warm-up steps per job, excluded from throughput (default: per model, 2-10)",
    )
    p.add_argument("--batch-size", type=int, default=d.batch_size, help="per-worker batch (default: per model)")
    p.add_argument("--ps-servers", type=int, default=d.ps_servers, help="K for ps-sync-dedicated (default: 1)")
    p.add_argument("--out-dir", default="", help="output directory (default: runs/scaling/<time>)")
    p.add_argument(
        "--no-commbench",
        dest="commbench",
        action="store_false",
        help="skip the calibration commbench (no model column in the report)",
    )
    p.add_argument("--commbench-sizes", default=d.commbench_sizes, help="sizes for the calibration sweep")
    p.add_argument("--calibration", default="", help="calibrate from this commbench.json instead of running one")
    p.add_argument(
        "--net-gbps",
        type=float,
        default=d.net_gbps,
        help="link speed of the network for the prediction to 1024 workers, Gbit/s (default: 10)",
    )
    p.add_argument(
        "--net-latency-us",
        type=float,
        default=d.net_latency_us,
        help="per-message latency of that network, microseconds (default: 50)",
    )
    p.add_argument(
        "--horovod-cycle-ms",
        default=d.horovod_cycle_ms,
        help="HOROVOD_CYCLE_TIME of the allreduce jobs: auto = the fastest of Horovod's default (1 ms) "
        f"and {CYCLE_CANDIDATES} in the calibration commbench; default = Horovod's; or a number "
        "(default: auto)",
    )
    p.add_argument(
        "--horovod-fusion-mb",
        type=float,
        default=d.horovod_fusion_mb,
        help="HOROVOD_FUSION_THRESHOLD in MB for every job (default: Horovod's, 128)",
    )
    p.add_argument(
        "--extra",
        action="append",
        default=[],
        metavar="ARG",
        help="an extra trainer argument for every job, e.g. --extra=--compression --extra=fp16",
    )
    p.add_argument("--job-timeout", type=float, default=d.job_timeout, help="seconds before a job is killed")


def parse_cycle(text: str) -> float | None:
    """--horovod-cycle-ms as a number, None for 'auto' / 'default' (decided later / Horovod's)."""
    if text in ("auto", "default"):
        return None
    try:
        v = float(text)
    except ValueError:
        raise GridError(f"--horovod-cycle-ms: expected auto, default or milliseconds (got {text!r})") from None
    if not v > 0:
        raise GridError(f"--horovod-cycle-ms must be > 0 (got {text!r})")
    return v


def config_from_args(args: argparse.Namespace) -> GridConfig:
    parse_cycle(args.horovod_cycle_ms)
    cfg = GridConfig(
        strategies=parse_list(args.strategies, "--strategies"),
        models=parse_list(args.models, "--models"),
        workers=sorted(set(parse_list(args.workers, "--workers", int))),
        repeats=args.repeats,
        data=args.data,
        steps=args.steps,
        warmup_steps=args.warmup_steps,
        batch_size=args.batch_size,
        ps_servers=args.ps_servers,
        out_dir=args.out_dir,
        commbench=args.commbench,
        commbench_sizes=args.commbench_sizes,
        calibration=args.calibration,
        net_gbps=args.net_gbps,
        net_latency_us=args.net_latency_us,
        horovod_cycle_ms=args.horovod_cycle_ms,
        horovod_fusion_mb=args.horovod_fusion_mb,
        extra=args.extra,
        job_timeout=args.job_timeout,
    )
    cfg.validate()
    return cfg


def main(args: argparse.Namespace) -> int:
    try:
        cfg = config_from_args(args)
        res = run(cfg)
    except GridError as e:
        print(f"scaling: error: {e}", file=sys.stderr)
        return 2
    if any(n.startswith("interrupted") for n in res["notes"]):
        return 130
    return 0 if all(j["ok"] for j in res["jobs"]) else 1
