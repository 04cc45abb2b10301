"""``make paper`` = ``python -m lab paper``: the design of Jäger et al. (2018) run on this project's grids.

    python -m lab paper                               # the whole design (needs root: emulated hosts)
    python -m lab paper --dry-run                     # the commands it would run, nothing run
    python -m lab paper --report runs/paper/<time>    # the report again from the grids' results

The paper compared a centralized parameter server (TensorFlow 1.8: dedicated server processes) with a
decentralized one (MXNet 1.3: a server beside each worker) by throughput and speedup over workers, LeNet-5
on Fashion-MNIST and a 2x200 LSTM language model. Here the same trainer, models, data and engine serve both
placements, and the ring on two engines stands beside them, so concept and implementation come apart.
No runner of its own: it runs two existing grids, one after the other, and reads their results.json:

1. throughput and speedup: ``python -m lab scaling-netns`` -- both models, 1, 2 and 4 workers, one emulated
   host each (a dedicated server on a host of its own), at 1 Gbit/s and 100 Mbit/s per link; the dedicated
   PS (state K = --ps-servers), the colocated PS, the ring on Horovod and on the mpi4py engine; synchronous
   (the grid's plans, synthetic data; every job's no-exchange bound beside it);
2. time to a stated quality: ``python -m lab time-to-accuracy`` -- LeNet-5 on the real Fashion-MNIST to test
   accuracy 0.89 with the six exchanges (the ring on both engines; the PS synchronous and asynchronous, as
   both of the paper's frameworks offer, dedicated and colocated) on 4 emulated hosts at the same rates.

Output in ``runs/paper/<time>/``: ``report.md`` (a verdict per finding, with its conditions and the cost
model beside the measurement), ``paper.png`` (the paper's style of figure: throughput and speedup over
workers, one line per concept and rate; time to quality), ``paper.json``, ``tensorboard/`` (the same as a
Custom Scalars comparison: ``make tensorboard RUN=.../tensorboard``), and the grids' own outputs in
``throughput/`` and ``tta/``.
"""

from __future__ import annotations

import argparse
import math
import os
import shlex
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from ..common import tblog
from ..common.links import RateError, parse_rates
from .report import PAPER_MODELS, SMALL, STRATEGIES, TTA_RUNS, read_json, report


@dataclass
class PaperConfig:
    models: list[str] = field(default_factory=lambda: list(PAPER_MODELS))
    hosts: list[int] = field(default_factory=lambda: [1, 2, 4])
    rates: list[str] = field(default_factory=lambda: ["1gbit", "100mbit"])
    ps_servers: int = 1  # K, the dedicated PS's servers (TensorFlow's ps tasks)
    steps: int = 0  # measured steps per throughput job; 0: the scaling grid's plan
    tta_models: list[str] = field(default_factory=lambda: [SMALL])
    tta_workers: list[int] = field(default_factory=lambda: [4])
    tta_rates: list[str] = field(default_factory=list)  # empty: the throughput grid's rates
    tta_max_epochs: int = 0  # 0: the workload's
    tta_target: str = ""  # MODEL=METRIC>=VALUE instead of the workload's (time-to-accuracy's --target)
    out_dir: str = ""


class PaperError(Exception):
    """Bad input; the message names the flag."""


def _ints(text: str, flag: str) -> list[int]:
    try:
        vals = sorted({int(v) for v in text.split(",") if v.strip()})
    except ValueError:
        raise PaperError(f"{flag}: expected comma-separated integers (got {text!r})") from None
    if not vals or vals[0] < 1:
        raise PaperError(f"{flag}: give worker counts >= 1, e.g. 1,2,4 (got {text!r})")
    return vals


def _models(text: str, flag: str, allow_none: bool = False) -> list[str]:
    vals = [v.strip() for v in text.split(",") if v.strip()]
    if allow_none and vals == ["none"]:
        return []
    bad = [v for v in vals if v not in PAPER_MODELS]
    if not vals or bad:
        raise PaperError(
            f"{flag}: the paper's models are {', '.join(PAPER_MODELS)} (got {text!r})"
            + ("; 'none' skips the time-to-quality grid" if allow_none else "")
        )
    return vals


def config_from_args(args: argparse.Namespace) -> PaperConfig:
    rates = _rates(args.rates, "--rates")
    tta_rates = _rates(args.tta_rates, "--tta-rates") if args.tta_rates else []
    hosts = _ints(args.hosts, "--hosts")
    if 1 not in hosts:
        raise PaperError(f"--hosts: include 1, the speedup's baseline (got {args.hosts!r})")
    for flag, v, lo in (
        ("--ps-servers", args.ps_servers, 1),
        ("--steps", args.steps, 0),
        ("--tta-max-epochs", args.tta_max_epochs, 0),
    ):
        if v < lo:
            raise PaperError(f"{flag} must be >= {lo} (got {v})")
    return PaperConfig(
        models=_models(args.models, "--models"),
        hosts=hosts,
        rates=rates,
        ps_servers=args.ps_servers,
        steps=args.steps,
        tta_models=_models(args.tta_models, "--tta-models", allow_none=True),
        tta_workers=_ints(args.tta_workers, "--tta-workers"),
        tta_rates=tta_rates,
        tta_max_epochs=args.tta_max_epochs,
        tta_target=_target(args.tta_target),
        out_dir=args.out_dir,
    )


def _target(text: str) -> str:
    """time-to-accuracy's --target, checked here so that a typo fails before the throughput grid runs."""
    if not text:
        return ""
    model, sep, target = text.partition("=")
    op = ">=" if ">=" in target else "<=" if "<=" in target else ""
    metric, _, value = target.partition(op) if op else ("", "", "")
    try:
        float(value)
    except ValueError:
        op = ""
    if not sep or model not in PAPER_MODELS or not op or not metric:
        raise PaperError(f"--tta-target {text!r}: write MODEL=METRIC>=VALUE (or <=), e.g. lenet5=eval/accuracy>=0.89")
    return text


def _rates(text: str, flag: str) -> list[str]:
    try:
        return parse_rates(text)
    except RateError as e:
        raise PaperError(str(e).replace("--rates", flag)) from None


def plan(cfg: PaperConfig, out: str) -> list[tuple[str, list[str]]]:
    """The grids to run, as (what, argv): the existing ``python -m lab`` commands, nothing of its own."""
    py = [sys.executable, "-m", "lab"]
    steps = [
        (
            "throughput",
            [
                *py,
                "scaling-netns",
                "--hosts",
                ",".join(map(str, cfg.hosts)),
                "--rates",
                ",".join(cfg.rates),
                "--models",
                ",".join(cfg.models),
                "--strategies",
                ",".join(STRATEGIES),
                "--ps-servers",
                str(cfg.ps_servers),
                *(["--steps", str(cfg.steps)] if cfg.steps else []),
                "--out-dir",
                os.path.join(out, "throughput"),
            ],
        )
    ]
    if cfg.tta_models:
        workers = ",".join(map(str, cfg.tta_workers))
        steps.append(
            (
                "time to quality",
                [
                    *py,
                    "time-to-accuracy",
                    "--models",
                    ",".join(cfg.tta_models),
                    "--methods",
                    ",".join(TTA_RUNS),
                    "--workers",
                    workers,
                    "--emulate-from",
                    str(min(cfg.tta_workers)),
                    "--rates",
                    ",".join(cfg.tta_rates or cfg.rates),
                    *(["--max-epochs", str(cfg.tta_max_epochs)] if cfg.tta_max_epochs else []),
                    *(["--target", cfg.tta_target] if cfg.tta_target else []),
                    "--out-dir",
                    os.path.join(out, "tta"),
                ],
            )
        )
    return steps


# ------------------------------------------------------------------------- command line


def add_arguments(p: argparse.ArgumentParser) -> None:
    d = PaperConfig()
    p.add_argument(
        "--models",
        default=",".join(d.models),
        help="throughput grid's models (default: both of the paper's: lenet5,ptb-lstm-small)",
    )
    p.add_argument(
        "--hosts",
        default=",".join(map(str, d.hosts)),
        help="worker counts, one emulated host each; 1 is the speedup's baseline (default: 1,2,4)",
    )
    p.add_argument(
        "--rates",
        default=",".join(d.rates),
        help="link rates per direction (default: 1gbit,100mbit: a commodity cluster's Ethernet and a tenth of it)",
    )
    p.add_argument("--ps-servers", type=int, default=d.ps_servers, help="K, the dedicated PS's servers (default: 1)")
    p.add_argument("--steps", type=int, default=0, help="measured steps per throughput job (default: the plan's)")
    p.add_argument(
        "--tta-models",
        default=",".join(d.tta_models),
        help="models of the time-to-quality grid, or none (default: lenet5)",
    )
    p.add_argument("--tta-workers", default=",".join(map(str, d.tta_workers)), help="its worker counts (default: 4)")
    p.add_argument("--tta-rates", default="", help="its link rates (default: --rates)")
    p.add_argument("--tta-max-epochs", type=int, default=0, help="its epoch limit (default: the workload's)")
    p.add_argument(
        "--tta-target",
        default="",
        metavar="MODEL=METRIC>=VALUE",
        help="its quality target (default: the workload's, lenet5=eval/accuracy>=0.89)",
    )
    p.add_argument("--out-dir", default="", help="default: runs/paper/<time>")
    p.add_argument("--dry-run", action="store_true", help="print the commands and run nothing")
    p.add_argument("--report", default="", metavar="DIR", help="run nothing: write DIR's report again")


def main(args: argparse.Namespace) -> int:
    try:
        cfg = config_from_args(args)
    except PaperError as e:
        print(f"paper: error: {e}", file=sys.stderr)
        return 2
    command = shlex.join(["python", "-m", "lab", *sys.argv[1:]])
    if args.report:
        if not os.path.isfile(os.path.join(args.report, "paper.json")) and not os.path.isdir(
            os.path.join(args.report, "throughput")
        ):
            print(
                f"paper: error: --report {args.report}: no paper run there (no throughput/ nor paper.json)",
                file=sys.stderr,
            )
            return 2
        old = read_json(os.path.join(args.report, "paper.json")) or {}
        meta = {k: old.get(k, v) for k, v in _meta(command, cfg, 0.0).items()}
        report(args.report, meta)
        print(f"-> {args.report}/report.md, paper.png", flush=True)
        return 0
    out = cfg.out_dir or os.path.join("runs", "paper", time.strftime("%Y%m%d-%H%M%S"))
    steps = plan(cfg, out)
    if args.dry_run:
        for what, argv in steps:
            print(f"# {what}\n{shlex.join(argv)}")
        return 0
    os.makedirs(out, exist_ok=True)
    t0, rcs, started = time.monotonic(), [], time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    for what, argv in steps:
        print(f"== {what}\n+ {shlex.join(argv)}", flush=True)
        rcs.append(subprocess.run(argv, check=False).returncode)
        if rcs[-1] in (2, 130):  # bad input or Ctrl-C: the next grid would fail or be unwanted too
            break
    meta = _meta(command, cfg, (time.monotonic() - t0) / 60, started)
    meta["grids"] = {
        what: {"command": shlex.join(argv), "returncode": rc} for (what, argv), rc in zip(steps, rcs, strict=False)
    }
    report(out, meta)
    print(f"-> {out}/report.md, {out}/paper.png; make tensorboard RUN={out}/{tblog.COMPARISON_DIR}", flush=True)
    return 0 if rcs and all(rc == 0 for rc in rcs) and len(rcs) == len(steps) else 1


def _meta(command: str, cfg: PaperConfig, minutes: float, started: str = "") -> dict[str, Any]:
    load = os.getloadavg() if hasattr(os, "getloadavg") else (math.nan,) * 3
    return {
        "command": command,
        "started": started or time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "minutes": minutes,
        "cpus": os.cpu_count(),
        "load": f"{load[0]:.1f} at the end",
        "config": asdict(cfg),
    }
