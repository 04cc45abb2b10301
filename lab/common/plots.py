"""Figures more than one part of the lab draws: the scaling grid's measured speedup (its report, and
tbcheck's redraw for the docs), and the empty panel that says why it is empty (every report's plots)."""

from __future__ import annotations

import math

STYLE = {
    "ring-horovod": ("tab:blue", "o"),
    "ps-sync-dedicated": ("tab:red", "s"),
    "ps-sync-colocated": ("tab:green", "^"),
    "ring-mpi": ("tab:purple", "D"),
}


def plot_measured(path: str, rows: list[dict], models: list[str]) -> list[str]:
    """scaling.png: per model, measured speedup (with its spread) and the calibrated prediction.
    Returns the panels' titles (a panel without data says so in its title)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, max(1, len(models)), figsize=(4.6 * max(1, len(models)), 4.0), squeeze=False)
    if not models:
        no_data(axes[0][0], "no model ran: nothing to plot")
    for ax, m in zip(axes[0], models, strict=False):
        sel = [r for r in rows if r["model"] == m and r["repeats"]]
        ns = sorted({r["workers"] for r in sel}) or [1]
        curves = {
            s: sorted(
                (r for r in sel if r["strategy"] == s and not math.isnan(r["speedup"])), key=lambda r: r["workers"]
            )
            for s in sorted({r["strategy"] for r in sel})
        }
        if not any(curves.values()):
            no_data(
                ax,
                f"{m}: no speedup, "
                + (
                    "every job failed"
                    if not sel
                    else f"no 1-worker baseline (measured N = {', '.join(map(str, ns))}); run --workers 1,..."
                ),
            )
            continue
        ax.plot(ns, ns, color="0.6", ls=":", label="ideal")
        for s, pts in curves.items():
            if not pts:
                continue
            color, marker = STYLE.get(s, ("black", "x"))
            ax.errorbar(
                [r["workers"] for r in pts],
                [r["speedup"] for r in pts],
                yerr=[r["speedup_std"] for r in pts],
                color=color,
                marker=marker,
                capsize=3,
                label=s,
            )
            pred = [
                (r["workers"], r["predicted_efficiency"] * r["workers"])
                for r in pts
                if not math.isnan(r.get("predicted_efficiency", math.nan))
            ]
            if pred:
                ax.plot(
                    *zip(*pred, strict=True),
                    color=color,
                    ls="--",
                    marker=marker,
                    mfc="none",
                    alpha=0.7,
                    label=f"{s} (model)",
                )
        missing = [s for s, pts in curves.items() if not pts]
        ax.set_title(m + (f" ({', '.join(missing)}: no 1-worker baseline)" if missing else ""), fontsize=9)
        ax.set_xlabel("workers N")
        ax.set_ylabel("speedup = throughput(N) / throughput(1)")
        ax.set_xticks(ns)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="best", framealpha=0.6)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    titles = [ax.get_title() for ax in axes[0]]
    plt.close(fig)
    return titles


def no_data(ax, title: str) -> None:
    """A panel without data says why, in its title and in its middle, instead of drawing bare axes."""
    import textwrap

    ax.set_title(textwrap.fill(title, 48), fontsize=9)
    ax.text(0.5, 0.5, "no data", ha="center", va="center", fontsize=14, color="0.5", transform=ax.transAxes)
    ax.set_xticks([])
    ax.set_yticks([])
