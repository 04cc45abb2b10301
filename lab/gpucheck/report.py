"""What the GPU check prints: the table of its rows, the regime line per model, the trainer's per-step
accounting against DDP, where the trainer's step goes (``--parts``) and the machine line."""

from __future__ import annotations

import torch

from .ways import LABELS, PRECISION


def _num(value: float | None, fmt: str) -> str:
    return "-" if value is None or value != value else format(value, fmt)


def table(rows: list[dict], device: str) -> str:
    mem = "peak GPU MB" if device == "cuda" else "peak GPU MB (CPU run)"
    lines = [
        f"| model | way | ranks | batch | samples/s | step ms | {mem} | loss first -> last | |",
        "|---|---|--:|--:|--:|--:|--:|---|---|",
    ]
    for r in rows:
        head = f"| {r['model']} | {LABELS[r['way']]} | {r['ranks']} | {r['batch']} |"
        if "skipped" in r:
            lines.append(f"{head} - | - | - | - | skipped: {r['skipped']} |")
        elif "error" in r:
            lines.append(f"{head} - | - | - | - | FAILED: {r['error']} |")
        else:
            lines.append(
                f"{head} {r['samples_per_sec']:.0f} | {r['step_ms']:.2f} | {_num(r['peak_mb'], '.0f')} | "
                f"{_num(r['loss_first'], '.3f')} -> {_num(r['loss_last'], '.3f')} | {r['note']} |"
            )
    return "\n".join(lines + [""] + regimes(rows))


def regimes(rows: list[dict]) -> list[str]:
    """Per model, the bare Horovod loop at the model's own batch against the busy one: when a batch
    k times larger takes much less than k times as long, the small batch left the GPU waiting on
    kernel launches (launch-bound); close to k times, the GPU was busy already."""
    out = []
    done = {(r["model"], r["batch"]): r for r in rows if r["way"] == "horovod" and "samples_per_sec" in r}
    for model in dict.fromkeys(r["model"] for r in rows):
        small = [b for (m, b) in done if m == model]
        if len(small) < 2:
            continue
        lo, hi = min(small), max(small)
        k, t = hi / lo, done[(model, hi)]["step_ms"] / done[(model, lo)]["step_ms"]
        regime = "launch-bound" if t < k / 2 else "busy"
        out.append(
            f"{model}: batch {hi} is {k:.0f}x batch {lo} and its step takes {t:.1f}x as long (bare Horovod): "
            f"at batch {lo} the device is {regime}."
        )
    return out


def precision_lines(rows: list[dict]) -> list[str]:
    """Per model and batch, the trainer's mixed-precision rows against its float32 one (``trainer``, no
    exchange): samples/s as a multiple of float32's, or why the row did not run."""
    done = {(r["model"], r["batch"], r["way"]): r for r in rows if r.get("ranks") == 1}
    out = []
    for m, b in dict.fromkeys((m, b) for m, b, _ in done):
        base = done.get((m, b, "trainer"))
        parts = []
        for way in PRECISION:
            r = done.get((m, b, way))
            if r is None:
                continue
            if "samples_per_sec" in r and base and "samples_per_sec" in base:
                parts.append(f"{PRECISION[way]} {r['samples_per_sec'] / base['samples_per_sec']:.2f}x")
            else:
                # the reason's head ("needs CUDA"); the table's row has the whole line
                parts.append(f"{PRECISION[way]} {(r.get('skipped') or 'failed').partition(':')[0]}")
        if parts:
            out.append(f"{m} batch {b}, the trainer's samples/s over float32's: " + "; ".join(parts))
    return [*out, ""] if out else []


def accounting(rows: list[dict]) -> list[str]:
    """Per model and batch at one rank: the trainer's step (exchanging through Horovod, and without
    an exchange) against DDP's and the bare Horovod loop's, and the microseconds per step the
    trainer adds over DDP (issue 28's accounting; negative: the trainer is faster)."""
    done = {(r["model"], r["batch"], r["way"]): r for r in rows if r.get("ranks") == 1 and "step_ms" in r}
    keys = list(dict.fromkeys((m, b) for m, b, _ in done))
    out = []
    for m, b in keys:
        ddp = done.get((m, b, "ddp"))
        mine = [(w, done[(m, b, w)]) for w in ("trainer-exchange", "trainer") if (m, b, w) in done]
        if not ddp or not mine:
            continue
        hvd = done.get((m, b, "horovod"))
        for way, r in mine:
            out.append(
                f"| {m} | {b} | {LABELS[way]} | {r['step_ms']:.3f} | {ddp['step_ms']:.3f} | "
                f"{_num(hvd['step_ms'] if hvd else None, '.3f')} | {1e3 * (r['step_ms'] - ddp['step_ms']):+.0f} | "
                f"{ddp['step_ms'] / r['step_ms']:.3f} |"
            )
    if not out:
        return []
    return [
        "The trainer's per-step cost against DDP (one rank; DDP-NCCL on a GPU, gloo on the CPU):",
        "",
        "| model | batch | trainer | trainer step ms | DDP step ms | bare Horovod step ms | "
        "trainer - DDP µs/step | trainer / DDP throughput |",
        "|---|--:|---|--:|--:|--:|--:|--:|",
        *out,
        "",
    ]


def parts_table(rows: list[dict]) -> list[str]:
    """``--parts``: where the trainer's step goes, per model and batch (:mod:`lab.common.stepparts`)."""
    from ..common.stepparts import table as by_part

    found = {(f"{r['model']} batch {r['batch']}", LABELS[r["way"]]): [r["parts"]] for r in rows if "parts" in r}
    if not found:
        return []
    return [
        "Where the trainer's step goes (--parts: the same run again, each part timed; on a GPU the wall time "
        "is where the CPU waited for the kernels):",
        "",
        by_part(found),
        "",
    ]


def nccl_version() -> str:
    v = torch.cuda.nccl.version()  # (2, 29, 7); an int such as 22907 in older torch
    return ".".join(map(str, v)) if isinstance(v, tuple) else str(v)


def describe_machine(device: str) -> str:
    parts = [f"torch {torch.__version__}"]
    if device == "cuda":
        props = torch.cuda.get_device_properties(0)
        parts += [
            f"CUDA {torch.version.cuda}",
            f"{props.name} ({props.total_memory / 2**30:.0f} GiB, sm_{props.major}{props.minor})",
            f"NCCL {nccl_version()}",
        ]
    else:
        parts.append("CPU only (dry run: checks the code path, the figures mean nothing for a GPU)")
    return ", ".join(parts)
