"""TensorBoard output of the experiments: a comparison logdir that opens right, and HParams.

TensorBoard colours and names lines by *run*, and selects no run by default once a logdir holds
more than 40 of them. So a grid's comparison gets a logdir of its own, ``<out>/tensorboard/``,
with one run per method (``ring-horovod``, ``ps-sync-dedicated``, ...: lab/common/methods.py) and, per model,
the same tags in every run (``scaling/speedup/<model>``, ``scaling/efficiency/<model>``,
``perf/samples_per_sec/<model>``; TensorBoard step = worker count). A Custom Scalars layout
draws one chart per tag, so each chart holds one line per concept, each in its own colour. The
jobs' own runs live elsewhere (``<out>/jobs/``), and ``<out>/hparams/`` holds one HParams session
per job (what it ran, what it measured) for the HParams table and parallel-coordinates view.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Iterable
from typing import Any

COMPARISON_DIR = "tensorboard"  # <out>/tensorboard: one run per concept, the logdir to open
HPARAMS_DIR = "hparams"  # <out>/hparams: one session per job
JOBS_DIR = "jobs"  # <out>/jobs: every job's own TensorBoard run and metrics.json

# What each comparison tag means, as chart titles (TensorBoard step = worker count N).
FIGURES = {
    "scaling/speedup": "speedup = throughput(N) / throughput(1)",
    "scaling/efficiency": "efficiency = speedup / N",
    "perf/samples_per_sec": "samples/s, all workers",
    "perf/step_ms": "step ms (median)",
    "scaling/predicted_efficiency": "predicted efficiency",
    "scaling/predicted_speedup": "predicted speedup",
    "perf/trainer_over": "trainer samples/s / this implementation's (same rounds)",
    "scaling/of_bound": "of the no-exchange bound = samples/s / the same N's with nothing exchanged",
}

Series = dict[str, dict[str, list[tuple[int, float]]]]  # run -> tag -> [(step, value)]


def tag_pattern(tag: str) -> str:
    """The Custom Scalars regex that matches exactly ``tag`` (one line per run that has it)."""
    return "^" + re.escape(tag) + "$"


def add_point(series: Series, run: str, tag: str, step: int, value: float | None) -> None:
    """One point of one run's curve; undefined figures (None, NaN) are left out, not drawn as 0."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return
    series.setdefault(run, {}).setdefault(tag, []).append((int(step), float(value)))


def layout(series: Series, categories: Iterable[tuple[str, list[tuple[str, str]]]]) -> dict[str, dict[str, list]]:
    """A Custom Scalars layout: per category, one Multiline chart per (title, tag) that some run
    holds. A chart whose tag no run has is left out: TensorBoard would draw it empty."""
    have = {tag for tags in series.values() for tag, pts in tags.items() if pts}
    out: dict[str, dict[str, list]] = {}
    for category, charts in categories:
        kept = {title: ["Multiline", [tag_pattern(tag)]] for title, tag in charts if tag in have}
        if kept:
            out[category] = kept
    return out


def model_categories(models: Iterable[str], figures: Iterable[str]) -> list[tuple[str, list[tuple[str, str]]]]:
    """One category per model, one chart per figure: the layout of every scaling comparison."""
    return [(m, [(f"{m}: {FIGURES.get(f, f)}", f"{f}/{m}") for f in figures]) for m in models]


def clear_events(logdir: str) -> None:
    """Remove the event files under ``logdir`` (a redraw would otherwise add a second copy of
    every point) and the folders that this leaves empty; nothing else is touched."""
    for root, _dirs, files in os.walk(logdir, topdown=False):
        for f in files:
            if f.startswith("events.out.tfevents."):
                os.remove(os.path.join(root, f))
        if root != logdir and not os.listdir(root):
            os.rmdir(root)


# Said in every comparison's notes: a plain `tensorboard` opens with the outlier scaling that cuts lines.
SCALING_NOTE = (
    'Opened with a plain `tensorboard`, untick "Ignore outliers in chart scaling" (left): ticked, it '
    "scales each chart to the values between their 5th and 95th percentiles and leaves the lowest and "
    "highest point of a few-point line off the plot. `make tensorboard` starts with it unticked."
)


def write_comparison(
    logdir: str, series: Series, categories: Iterable[tuple[str, list[tuple[str, str]]]], text: str = ""
) -> dict[str, dict[str, list]]:
    """One TensorBoard run per key of ``series`` under ``logdir``, with the layout (in the first
    run: TensorBoard merges the layouts of all runs) and a text (``comparison/notes``: ``text`` and
    :data:`SCALING_NOTE`). Returns the layout written.

    The layout has no y range (TensorBoard's layout.proto has none): the lines stay whole because
    ``make tensorboard`` (lab/tbcheck/tbview.py) serves the page with outlier scaling off, and
    ``make tb-check`` fails when a chart draws a point outside its plot."""
    from torch.utils.tensorboard import SummaryWriter

    lay = layout(series, categories)
    clear_events(logdir)
    for i, (run, tags) in enumerate(sorted(series.items())):
        w = SummaryWriter(log_dir=os.path.join(logdir, run))
        for tag, pts in tags.items():
            for step, value in sorted(pts):
                w.add_scalar(tag, value, step)
        if i == 0:
            if lay:
                w.add_custom_scalars(lay)
            w.add_text("comparison/notes", f"{text}\n\n{SCALING_NOTE}" if text else SCALING_NOTE)
        w.close()
    return lay


def write_hparams(logdir: str, sessions: list[tuple[str, dict[str, Any], dict[str, float]]]) -> None:
    """The HParams view of a grid: the experiment (every hparam with the values that occur, every
    metric) at ``logdir`` itself, and one session per (name, hparams, metrics) in ``logdir/<name>``.

    A metric that is undefined for a job (NaN, None) is left out of its session rather than logged.
    """
    from torch.utils.tensorboard import SummaryWriter
    from torch.utils.tensorboard.summary import hparams as hparams_summary

    clear_events(logdir)
    if not sessions:
        return
    values: dict[str, list] = {}
    for _, hp, _ in sessions:
        for k, v in hp.items():
            if v not in values.setdefault(k, []):
                values[k].append(v)
    metric_names = list(dict.fromkeys(k for _, _, ms in sessions for k in ms))
    # discrete domains for the text hparams: the HParams table then offers them as filters
    discrete = {k: vs for k, vs in values.items() if all(isinstance(v, str) for v in vs)}
    exp, _, _ = hparams_summary({k: vs[0] for k, vs in values.items()}, dict.fromkeys(metric_names, 0.0), discrete)
    mark_differing(exp, {k for k, vs in values.items() if len(vs) > 1})
    w = SummaryWriter(log_dir=logdir)
    assert w.file_writer is not None  # the constructor opens it
    w.file_writer.add_summary(exp)
    w.close()
    for name, hp, ms in sessions:
        _, ssi, sei = hparams_summary(hp, {})
        w = SummaryWriter(log_dir=os.path.join(logdir, name))
        assert w.file_writer is not None
        w.file_writer.add_summary(ssi)
        w.file_writer.add_summary(sei)
        for m, v in ms.items():
            if v is not None and not (isinstance(v, float) and math.isnan(v)):
                w.add_scalar(m, v, 0)
        w.close()


def mark_differing(exp, names: set[str]) -> None:
    """Mark the hparams whose values differ between jobs: the HParams table shows five columns at
    first, those that differ before the others."""
    from tensorboard.plugins.hparams import plugin_data_pb2

    meta = exp.value[0].metadata.plugin_data
    data = plugin_data_pb2.HParamsPluginData.FromString(meta.content)
    for info in data.experiment.hparam_infos:
        info.differs = info.name in names
    meta.content = data.SerializeToString()


def flag_value(flags: Iterable[str], flag: str, default: str) -> str:
    """The value after the last ``flag`` in a trainer argument list (the one the trainer's parser keeps), else
    ``default``."""
    flags = list(flags)
    at = [i for i, f in enumerate(flags[:-1]) if f == flag]
    return flags[at[-1] + 1] if at else default
