"""``python -m lab gpucheck``: the flags and the whole check, run by run (the package's docstring says what
it runs and why; tools/gpu_check.sh starts it)."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import torch

from models import MODELS

from ..common import recipe
from .one import run_one
from .report import accounting, describe_machine, parts_table, precision_lines, table
from .tworanks import run_two
from .ways import DEFAULT_BUSY, DEFAULT_MODELS, LABELS, NEEDS_CUDA, OLD_NAMES, TWO_RANK_WAYS, WAYS, batch_for, log


def parse_busy(text: str) -> dict[str, int]:
    """``--busy lenet5=1024,resnet18=256``: the extra batch per model ("" for none)."""
    busy = {}
    for item in filter(None, text.split(",")):
        model, _, batch = item.partition("=")
        if model not in MODELS or not batch.isdigit() or int(batch) < 1:
            raise ValueError(f"--busy {item!r}: use MODEL=BATCH with a model of {', '.join(sorted(MODELS))}")
        busy[model] = int(batch)
    return busy


def run_single(args: argparse.Namespace, tmp: str, model: str, way: str, batch: int, parts: bool = False) -> dict:
    result = os.path.join(tmp, f"{model}-{way}-{batch}{'-parts' if parts else ''}.json")
    cmd = [
        sys.executable,
        "-m",
        "lab",
        "gpucheck",
        "--one",
        way,
        "--model",
        model,
        "--device",
        args.device,
        "--result",
        result,
        "--steps",
        str(args.steps),
        "--warmup-steps",
        str(args.warmup_steps),
        "--batch-size",
        str(batch),
        "--synthetic-samples",
        str(args.synthetic_samples),
        "--threads",
        str(args.threads),
        *(["--parts"] if parts else []),
    ]
    rc: int | str  # "timeout" when the job gave no result in time
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
        rc, out = proc.returncode, proc.stdout + proc.stderr
    except subprocess.TimeoutExpired as e:
        rc, out = "timeout", f"no result after {args.timeout} s; " + str(e.stdout or "")[-500:]
    if rc == 0 and os.path.exists(result):
        with open(result) as fh:
            return json.load(fh)
    tail = [ln for ln in out.strip().splitlines() if ln.strip()][-1:] or ["no output"]
    log(f"  FAILED (exit {rc}); its output ends:\n" + "\n".join(out.strip().splitlines()[-15:]))
    return {"model": model, "way": way, "batch": batch, "ranks": 1, "error": f"exit {rc}: {tail[0][:200]}"}


def run_all(args: argparse.Namespace) -> int:
    models = [m for m in args.models.split(",") if m]
    unknown = [m for m in models if m not in MODELS]
    if unknown:
        print(
            f"gpucheck: unknown model(s) {', '.join(unknown)}; choose from: {', '.join(sorted(MODELS))}",
            file=sys.stderr,
        )
        return 2
    ways = [w for w in args.ways.split(",") if w]
    if any(w not in WAYS for w in ways):
        print(f"gpucheck: --ways {args.ways!r}: choose from {', '.join(WAYS)}", file=sys.stderr)
        return 2
    two = [OLD_NAMES.get(w, w) for w in args.two_ranks.split(",") if w]
    if any(w not in TWO_RANK_WAYS for w in two):
        print(
            f"gpucheck: --two-ranks {args.two_ranks!r}: choose from {', '.join(TWO_RANK_WAYS)} (or '')", file=sys.stderr
        )
        return 2
    try:
        busy = parse_busy(args.busy)
    except ValueError as e:
        print(f"gpucheck: {e}", file=sys.stderr)
        return 2
    if args.device == "cuda" and not torch.cuda.is_available():
        print(
            f"gpucheck: no GPU visible to torch {torch.__version__} (CUDA {torch.version.cuda}); "
            "for a CPU run of the same code: tools/gpu_check.sh --dry-run",
            file=sys.stderr,
        )
        return 2
    log(describe_machine(args.device))
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for model in models:
            own = batch_for(model, args.batch_size)
            for batch in [own] + ([busy[model]] if model in busy and busy[model] != own else []):
                for way in ways:
                    if way in NEEDS_CUDA and args.device != "cuda":  # not a failure: this device cannot run it
                        log(f"{model} / {LABELS[way]}, batch {batch}: {NEEDS_CUDA[way]}")
                        rows.append(
                            {"model": model, "way": way, "batch": batch, "ranks": 1, "skipped": NEEDS_CUDA[way]}
                        )
                        continue
                    log(
                        f"{model} / {LABELS[way]}: {args.warmup_steps} warm-up + {args.steps} timed steps, "
                        f"batch {batch}, on {args.device}"
                    )
                    t0 = time.perf_counter()
                    row = run_single(args, tmp, model, way, batch)
                    if "error" not in row:
                        log(
                            f"  {row['samples_per_sec']:.0f} samples/s, {row['step_ms']:.2f} ms/step "
                            f"({time.perf_counter() - t0:.1f} s with start-up); {row['note']}"
                        )
                    rows.append(row)
                timed = next(
                    (
                        r
                        for r in rows[::-1]
                        if r["model"] == model
                        and r["batch"] == batch
                        and r["way"] in ("trainer-exchange", "trainer")
                        and "samples_per_sec" in r
                    ),
                    None,
                )
                if args.parts and timed:  # the same run again, its steps traced phase by phase
                    log(f"{model} / {LABELS[timed['way']]}, batch {batch}: once more, each part of the step timed")
                    again = run_single(args, tmp, model, timed["way"], batch, parts=True)
                    if "parts" in again:
                        timed["parts"] = again["parts"]
    for model in [m for m in args.two_rank_models.split(",") if m in models] if two else []:
        for way in two:
            log(
                f"{model} / {LABELS[way]} on one {args.device} device: {args.two_rank_steps} steps, "
                f"batch {batch_for(model, args.batch_size)} a rank"
            )
            row = run_two(args, way, model, batch_for(model, args.batch_size))
            log(f"  {row.get('note') or row.get('skipped') or row.get('error')}")
            rows.append(row)
    text = "\n".join([table(rows, args.device), "", *precision_lines(rows), *accounting(rows), *parts_table(rows)])
    print("\n" + text, flush=True)
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(
                {
                    "machine": describe_machine(args.device),
                    "steps": args.steps,
                    "warmup_steps": args.warmup_steps,
                    "two_rank_steps": args.two_rank_steps,
                    "rows": rows,
                },
                fh,
                indent=1,
            )
        log(f"rows written to {args.out}")
    failed = [r for r in rows if "error" in r or r.get("params_identical") is False]
    return 1 if failed else 0


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help="cpu: the dry run (default: cuda)")
    p.add_argument("--models", default=DEFAULT_MODELS, help=f"comma-separated (default: {DEFAULT_MODELS})")
    p.add_argument(
        "--ways", default=",".join(WAYS), help="one-rank runs, comma-separated subset of: " + ", ".join(WAYS)
    )
    p.add_argument(
        "--busy",
        default=DEFAULT_BUSY,
        help=f"a second batch per model, MODEL=BATCH,... ('' for none; default: {DEFAULT_BUSY})",
    )
    p.add_argument(
        "--two-ranks",
        default=",".join(TWO_RANK_WAYS),
        help="two-rank jobs on the one device, subset of: " + ", ".join(TWO_RANK_WAYS) + " ('' for none)",
    )
    p.add_argument("--two-rank-models", default=DEFAULT_MODELS, help="the models of the two-rank jobs (of --models)")
    p.add_argument("--two-rank-steps", type=int, default=50, help="steps of each two-rank job (default: 50)")
    p.add_argument(
        "--gloo-pythonpath",
        default="",
        help="where the ring-gloo ranks find a Horovod built without GPU operations (tools/gpu_check.sh sets it)",
    )
    p.add_argument("--steps", type=int, default=200, help="timed steps per run (default: 200)")
    p.add_argument("--warmup-steps", type=int, default=20, help="untimed steps first (default: 20)")
    p.add_argument("--batch-size", type=int, default=0, help="0: each model's own (default)")
    recipe.add_trainer_flag(p, "synthetic_samples", "the trainer's synthetic dataset size")
    p.add_argument("--threads", type=int, default=1, help="torch threads on the CPU (dry run)")
    recipe.add_trainer_flag(p, "lr", "the bare loops' SGD learning rate, the trainer's for one worker")
    recipe.add_trainer_flag(p, "seed")
    p.add_argument("--timeout", type=float, default=300, help="seconds for one run or two-rank job")
    p.add_argument("--out", default="", help="also write the rows as JSON here")
    p.add_argument(
        "--parts",
        action="store_true",
        help="run the trainer once more per model and batch with each part of its step timed (issue 28)",
    )
    p.add_argument("--one", choices=WAYS, dest="way", help=argparse.SUPPRESS)  # one run, in its own process
    p.add_argument("--model", default="lenet5", help=argparse.SUPPRESS)
    p.add_argument("--result", default="", help=argparse.SUPPRESS)


def main(args: argparse.Namespace) -> int:
    if args.steps < 1 or args.warmup_steps < 1 or args.two_rank_steps < 2:
        print("gpucheck: --steps and --warmup-steps must be >= 1, --two-rank-steps >= 2", file=sys.stderr)
        return 2
    return run_one(args) if args.way else run_all(args)
