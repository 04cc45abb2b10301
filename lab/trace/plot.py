"""A rank's step trace (``--trace-steps``, allreduce_train/trace.py) as a Gantt chart: a row per lane (the step,
each phase, each bucket's exchange), a bar per span, time in milliseconds from the first traced step.

    python -m lab.trace.plot RUN_DIR/trace/rank0.json docs/img/trace.png

The same file opens in Perfetto (ui.perfetto.dev) or chrome://tracing; this draws it where no browser is.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

COLOURS = {
    "data": "tab:gray",
    "forward": "tab:blue",
    "backward": "tab:orange",
    "wait": "tab:red",
    "update": "tab:green",
    "evaluation": "tab:purple",
    "checkpoint": "tab:brown",
}


def lanes(doc: dict[str, Any]) -> dict[int, str]:
    """Lane id -> its name, from the trace's metadata events."""
    return {e["tid"]: e["args"]["name"] for e in doc["traceEvents"] if e["ph"] == "M" and e["name"] == "thread_name"}


def plot(doc: dict[str, Any], out: str, title: str = "") -> int:
    """Draw ``doc`` (a Chrome trace) to ``out``; returns how many spans it drew."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    events = [e for e in doc["traceEvents"] if e["ph"] == "X"]
    if not events:
        raise ValueError("the trace holds no span: were the steps of --trace-steps reached?")
    names = lanes(doc)
    used = sorted({e["tid"] for e in events})
    row = {tid: i for i, tid in enumerate(used)}
    t0 = min(e["ts"] for e in events)
    fig, ax = plt.subplots(figsize=(11, 0.32 * len(used) + 1.4))
    for e in events:
        colour = "tab:cyan" if e["cat"] == "bucket" else COLOURS.get(e["name"], "lightgray")
        ax.barh(
            row[e["tid"]], e["dur"] / 1e3, left=(e["ts"] - t0) / 1e3, height=0.7, color=colour, edgecolor="k", lw=0.3
        )
    for e in events:  # each step's number over its bar
        if e["cat"] == "step":
            ax.text((e["ts"] - t0 + e["dur"] / 2) / 1e3, row[e["tid"]], e["name"], ha="center", va="center", fontsize=7)
    ax.set_yticks(range(len(used)), [names.get(tid, str(tid)) for tid in used], fontsize=8)
    ax.invert_yaxis()  # the step first, then the phases in their order, then the buckets
    ax.set_xlabel("ms since the first traced step began")
    ax.set_title(title or f"rank {doc.get('otherData', {}).get('rank', '?')}: --trace-steps", fontsize=9)
    ax.grid(axis="x", lw=0.3)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return len(events)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m lab.trace.plot", description=__doc__.split("\n\n")[0])
    p.add_argument("trace", help="a rank's trace: RUN_DIR/trace/rank<R>.json")
    p.add_argument("out", help="the picture to write (.png, .svg, .pdf)")
    p.add_argument("--title", default="", help="the chart's title (default: the rank)")
    args = p.parse_args(argv)
    try:
        with open(args.trace) as fh:
            doc = json.load(fh)
        n = plot(doc, args.out, args.title)
    except (OSError, ValueError, KeyError) as e:
        print(f"lab.trace.plot: {args.trace}: {e}", file=sys.stderr)
        return 2
    print(f"{n} spans -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
