"""``make tb-check``: open a comparison in TensorBoard in headless Chromium and check what a user sees.

    python -m lab.tbcheck                          # runs a small grid first
    python -m lab.tbcheck runs/scaling/<time>      # a grid's comparison
    python -m lab.tbcheck runs/scaling/<time> --images docs/img

TensorBoard is started on the comparison logdir (127.0.0.1, a free port), the Custom Scalars tab
is loaded as ``make tensorboard`` prints it (smoothing 0 in the URL), and the check passes when:

- the logdir holds at most 40 runs and the page ticks every one of them by default (above 40,
  TensorBoard ticks none and every chart is empty);
- every chart of the layout draws a line for each run that TensorBoard's HTTP API has data for
  under the chart's tag, and for at least one run (no empty chart), and a run that has a figure
  for one model has it for every model (a concept missing from a chart means failed jobs; not for a
  time-to-target figure, where a run that did not reach the target has no point);
- the lines of a chart have distinct colours (TensorBoard has 7 and repeats them from the 8th
  run on), and the smoothing is 0;
- no line is cut: every point a chart draws lies inside the chart's y (and x) domain as the page
  scaled it. (TensorBoard's "Ignore outliers in chart scaling", ticked by default, leaves the
  lowest and highest value of a few-point chart outside it; ``make tensorboard``'s server starts
  with it unticked, lab/tbcheck/tbview.py. ``--stock`` checks a plain ``tensorboard`` instead,
  which shows the cut lines: the check fails there.)
- the address a user types, ``http://127.0.0.1:PORT/`` (TensorBoard opens Time Series), and the
  Scalars and Custom Scalars tabs as a click opens them (no settings in the URL) start with
  smoothing 0 and outliers not ignored (a plain ``tensorboard``: 0.6 and ignored).

A screenshot of the tab is saved (``--screenshot``); ``--images DIR`` also redraws the grid's
``scaling.png`` there (the two figures of docs/scaling.md).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from typing import Any

from ..common import jobs, tblog
from . import tbview
from .browser import Browser, BrowserError

MAX_DEFAULT_RUNS = 40  # TensorBoard ticks no run by default when a logdir holds more
DASHBOARD = "custom_scalars"

# Every element of the page, through the shadow roots of TensorBoard's Polymer components.
_DEEP = (
    "(() => { const out = []; const walk = (root) => { for (const el of root.querySelectorAll('*')) "
    "{ out.push(el); if (el.shadowRoot) walk(el.shadowRoot); } }; walk(document); return out; })()"
)
# What the Custom Scalars tab shows: ticked runs, their colours, smoothing, and per chart its
# title, the runs it was given and the lines it drew ("tag (run)") with its "Matches (n)".
PAGE_STATE = f"""(() => {{
  const els = {_DEEP}, named = (n) => els.filter(e => e.tagName.toLowerCase() === n);
  const dash = named('tf-custom-scalar-dashboard')[0];
  if (!dash) return null;
  const box = named('tf-multi-checkbox')[0];
  const colors = {{}};
  for (const r of dash._selectedRuns || []) colors[r] = box && box.coloring ? box.coloring.getColor(r) : '';
  // the chart a card drew: its axes' domains and every point of every line it plotted
  const drawn = (card) => {{
    const out = [], walk = (root) => {{ for (const el of root.querySelectorAll('*')) {{
      out.push(el); if (el.shadowRoot) walk(el.shadowRoot); }} }};
    walk(card.shadowRoot || card);
    const v = out.find(e => e.tagName.toLowerCase() === 'vz-line-chart2' && e._chart);
    if (!v) return {{ y: null, x: null, series: [] }};
    const ch = v._chart;
    return {{ y: ch.yScale.domain(), x: ch.xScale.domain(),
             series: (ch.datasets || []).map(d => ({{ name: (d.metadata() || {{}}).name || '',
               points: d.data().map(p => [p.step, p.scalar]) }})) }};
  }};
  return {{
    selected: dash._selectedRuns || [], smoothing: dash._smoothingWeight, colors: colors,
    ignoreOutliers: dash._ignoreYOutliers,
    loading: named('tf-line-chart-data-loader').some(l => l.dataLoading),
    charts: named('tf-custom-scalar-multi-line-chart-card').map(c => ({{
      title: c.title, runs: c.runs || [], regexes: c.tagRegexes || [], lines: c._seriesNames || [],
      matches: ((c.shadowRoot ? c.shadowRoot.textContent : '').match(/Matches \\((\\d+)\\)/) || [])[1],
      ...drawn(c) }})),
  }};
}})()"""


# What a dashboard opened without settings in its URL starts with: Time Series' smoothing and outlier
# box (its settings pane, open by default) and the Polymer dashboards' properties; null until drawn.
DEFAULTS_STATE = f"""(() => {{
  const els = {_DEEP}, named = (n) => els.filter(e => e.tagName.toLowerCase() === n);
  const dashboard = location.hash.slice(1).split('&')[0];  // '' until TensorBoard picked its default
  if (!dashboard) return null;
  if (dashboard === 'timeseries') {{
    const pane = named('metrics-dashboard-settings-component')[0];
    if (!pane) return null;
    const label = [...pane.querySelectorAll('div')].find(d => d.textContent.trim() === 'Smoothing');
    const input = label && label.parentElement.querySelector('input[type=number]');
    const box = [...pane.querySelectorAll('mat-checkbox')]
      .find(b => b.textContent.trim() === 'Ignore outliers in chart scaling');
    if (!input || !box) return null;
    return {{ dashboard, smoothing: Number(input.value), ignoreOutliers: box.querySelector('input').checked }};
  }}
  const tag = {{ scalars: 'tf-scalar-dashboard', custom_scalars: 'tf-custom-scalar-dashboard' }}[dashboard];
  const dash = tag && named(tag)[0];
  if (!dash) return null;
  return {{ dashboard, smoothing: dash._smoothingWeight, ignoreOutliers: dash._ignoreYOutliers }};
}})()"""
# The addresses a user reaches without typing settings: the plain one (TensorBoard opens Time
# Series) and the two Polymer scalar tabs as a click on them opens them.
DEFAULT_VIEWS = ("", "#scalars", "#custom_scalars")


class CheckError(Exception):
    """The check could not run (no browser, TensorBoard did not start, ...)."""


def free_port() -> int:
    """A free TCP port on 127.0.0.1 that is not one tbview refuses."""
    while True:
        port = jobs.free_port()
        if not tbview.check_port(port):
            return port


def run_dirs(logdir: str) -> set[str]:
    """The run names TensorBoard will list: every folder (relative, '.' for the root) with event files."""
    out = set()
    for root, _, files in os.walk(logdir):
        if any(f.startswith("events.out.tfevents.") for f in files):
            out.add(os.path.relpath(root, logdir).replace(os.sep, "/"))
    return out


class TensorBoard:
    """TensorBoard serving ``logdir`` on 127.0.0.1:``port`` until :meth:`close`."""

    def __init__(self, logdir: str, port: int, timeout: float = 180.0, stock: bool = False) -> None:
        self.port, self.logdir = port, logdir
        self.log = tempfile.TemporaryFile()  # noqa: SIM115 (the server's output, kept until close)
        self.proc = subprocess.Popen(
            tbview.command(logdir, port, stock), stdout=self.log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
        )
        want = run_dirs(logdir)
        deadline = time.monotonic() + timeout
        while True:  # TensorBoard answers before it has read the logdir: wait until it lists every run
            if self.proc.poll() is not None:
                raise CheckError(f"TensorBoard exited with code {self.proc.returncode}: {self.output()[-500:]}")
            try:
                if want <= set(self.get("/data/runs")):
                    return
            except OSError:
                pass
            if time.monotonic() > deadline:
                self.close()
                raise CheckError(f"TensorBoard did not list the runs of {logdir} within {timeout:.0f} s")
            time.sleep(1.0)

    def get(self, path: str, **params: str) -> Any:
        query = ("?" + urllib.parse.urlencode(params)) if params else ""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}{query}", timeout=30) as r:
            return json.load(r)

    def output(self) -> str:
        self.log.seek(0)
        return self.log.read().decode(errors="replace")

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()

    def __enter__(self) -> TensorBoard:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def expected(tb: TensorBoard) -> dict[str, Any]:
    """From TensorBoard's HTTP API: the runs, and per chart of the layout the runs with data."""
    runs = tb.get("/data/runs")
    layout = tb.get(f"/data/plugin/{DASHBOARD}/layout")
    charts = []
    for cat in layout.get("category", []):
        for chart in cat.get("chart", []):
            regexes = (chart.get("multiline") or {}).get("tag", [])
            have = [
                run
                for run in runs
                for rx in regexes
                if tb.get(f"/data/plugin/{DASHBOARD}/scalars", run=run, tag=rx).get("tag_to_events")
            ]
            # the figure a chart shows, without its model: "^scaling/speedup/lenet5$" -> scaling/speedup
            figure = re.sub(r"\\(.)", r"\1", regexes[0].strip("^$")).rpartition("/")[0] if regexes else ""
            charts.append(
                {
                    "category": cat["title"],
                    "title": chart["title"],
                    "regexes": regexes,
                    "figure": figure,
                    "runs": sorted(set(have)),
                }
            )
    return {"runs": runs, "charts": charts}


def page_state(browser: Browser, port: int, n_charts: int, timeout: float = 120.0, settle: int = 4) -> dict[str, Any]:
    """Load the tab as ``make tensorboard`` prints it and wait until every chart has drawn: no
    chart loading and the same state ``settle`` polls (a second apart) in a row -- a chart shows
    "Matches (0)" for a moment before its data arrives. The last state when the time runs out."""
    browser.open(tbview.url(port, DASHBOARD))
    deadline, last, same = time.monotonic() + timeout, None, 0
    while time.monotonic() < deadline:
        state = browser.evaluate(PAGE_STATE)
        ready = bool(state) and len(state["charts"]) >= n_charts and not state["loading"]
        same = same + 1 if ready and state == last else 0
        if same >= settle:
            return state
        last = state
        time.sleep(1.0)
    return last or {"selected": [], "smoothing": None, "colors": {}, "charts": [], "loading": True}


def default_views(browser: Browser, port: int, timeout: float = 60.0) -> list[dict[str, Any]]:
    """Each of :data:`DEFAULT_VIEWS` loaded afresh: the dashboard it opened, its smoothing and whether it
    ignores outliers in chart scaling ({"address", "dashboard": None, ...} where nothing was drawn)."""
    out = []
    for view in DEFAULT_VIEWS:
        address = f"http://127.0.0.1:{port}/{view}"
        browser.open("about:blank")  # a new document: no dashboard of the previous address lingers
        browser.wait_for("location.href === 'about:blank'", timeout=10.0)
        browser.open(address)
        state = browser.wait_for(DEFAULTS_STATE, timeout=timeout) or {"dashboard": None}
        time.sleep(1.0)  # the page reads its stored settings right after it draws: the state they give
        state = browser.evaluate(DEFAULTS_STATE) or state
        out.append({"address": address, "smoothing": None, "ignoreOutliers": None, **state})
    return out


def verify_defaults(views: list[dict[str, Any]]) -> list[str]:
    """How the dashboards opened without settings in the URL fall short of unsmoothed and uncut."""
    problems = []
    for v in views:
        where = f"{v['address']} ({v['dashboard'] or 'no dashboard drawn'})"
        if v["dashboard"] is None:
            problems.append(f"{where}: the page drew no dashboard")
            continue
        if v["smoothing"] != 0:
            problems.append(f"{where}: smoothing is {v['smoothing']}, not 0")
        if v["ignoreOutliers"] is not False:
            problems.append(f'{where}: "Ignore outliers in chart scaling" is ticked: few-point lines are cut')
    return problems


def run_of_line(line: str) -> str:
    """The run of a Custom Scalars line name, "<tag> (<run>)"."""
    m = re.search(r"\((.*)\)$", line)
    return m.group(1) if m else line


def cut_points(card: dict[str, Any], rel: float = 1e-6) -> list[str]:
    """The points of a drawn chart that lie outside its axes' domains (drawn off the plot), one line each:
    "<line>: step <x> value <y> outside y [lo, hi]". A chart with lines but no domain is reported too."""
    series = [s for s in card.get("series") or [] if s.get("points")]
    if not series:
        return []
    y, x = card.get("y"), card.get("x")
    if not y or not x:
        return ["no axes found for its lines (the page did not draw the chart)"]
    out = []
    for axis, (lo, hi), idx in (("y", y, 1), ("x", x, 0)):
        tol = rel * max(abs(lo), abs(hi), 1e-12)
        for s in series:
            for p in s["points"]:
                v = p[idx]
                if v is None or (isinstance(v, float) and v != v):
                    continue  # TensorBoard draws NaN as a marker of its own, not on the line
                if not lo - tol <= v <= hi + tol:
                    out.append(
                        f"{s['name'] or '?'}: step {p[0]:g} value {p[1]:.4g} outside {axis} [{lo:.4g}, {hi:.4g}]"
                    )
    return out


def verify(exp: dict[str, Any], page: dict[str, Any]) -> list[str]:
    """Every way the page differs from what it should show, one line each (empty: it passed)."""
    problems = []
    runs = exp["runs"]
    if len(runs) > MAX_DEFAULT_RUNS:
        problems.append(f"{len(runs)} runs: above {MAX_DEFAULT_RUNS} TensorBoard ticks none by default")
    unticked = sorted(set(runs) - set(page["selected"]))
    if unticked:
        problems.append(f"runs not ticked by default: {', '.join(unticked)}")
    if page["smoothing"] != 0:
        problems.append(f"smoothing is {page['smoothing']}, not 0")
    problems += verify_defaults(page.get("defaults", []))
    # a run that has a figure for one model should have it for every model: else a job failed
    by_figure: dict[str, set[str]] = {}
    for chart in exp["charts"]:
        by_figure.setdefault(chart["figure"], set()).update(chart["runs"])
    cards = {c["title"]: c for c in page["charts"]}
    if not exp["charts"]:
        problems.append("the logdir has no Custom Scalars layout")
    for chart in exp["charts"]:
        name = f"{chart['category']} / {chart['title']}"
        card = cards.get(chart["title"])
        if card is None:
            problems.append(f"chart {name}: not on the page")
            continue
        drawn = sorted({run_of_line(line) for line in card["lines"]})
        if not chart["runs"]:
            problems.append(f"chart {name}: empty, no run has data for {chart['regexes']}")
        elif drawn != chart["runs"]:
            problems.append(f"chart {name}: draws {drawn or 'nothing'}, the data is in {chart['runs']}")
        colors: dict[str, list[str]] = {}
        for run in drawn:  # TensorBoard has 7 run colours and repeats them from the 8th run on
            colors.setdefault(page["colors"].get(run, ""), []).append(run)
        shared = [runs for c, runs in colors.items() if c and len(runs) > 1]
        if shared:
            problems.append(f"chart {name}: runs share a colour: {'; '.join(', '.join(r) for r in shared)}")
        cut = cut_points(card)
        if cut:
            problems.append(
                f"chart {name}: {len(cut)} point(s) cut off (drawn outside the plot): "
                + "; ".join(cut[:4])
                + (" ..." if len(cut) > 4 else "")
            )
        missing = sorted(by_figure.get(chart["figure"], set()) - set(chart["runs"]))
        # a time-to-target chart has no point for a run that did not reach the target (make paper's
        # asynchronous PS at one rate): there the absence is a result, not a failed job
        if missing and "to_target" not in chart["figure"]:
            problems.append(f"chart {name}: no data for {', '.join(missing)} (their jobs failed or did not run?)")
    return problems


def summary(exp: dict[str, Any], page: dict[str, Any]) -> str:
    lines = [
        f"{len(exp['runs'])} runs, ticked by default: {len(page['selected'])}; smoothing {page['smoothing']}; "
        f"ignore outliers in chart scaling: {page.get('ignoreOutliers')}"
    ]
    for v in page.get("defaults", []):
        lines.append(
            f"  {v['address']} opens {v['dashboard']}: smoothing {v['smoothing']}, "
            f"ignore outliers in chart scaling: {v['ignoreOutliers']}"
        )
    cards = {c["title"]: c for c in page["charts"]}
    for chart in exp["charts"]:
        card = cards.get(chart["title"], {"lines": []})
        drawn = sorted({run_of_line(line) for line in card["lines"]})
        y = card.get("y")
        span = f"; y [{y[0]:.4g}, {y[1]:.4g}]" if y else ""
        lines.append(f"  {chart['category']} / {chart['title']}: {len(drawn)} line(s): {', '.join(drawn) or '-'}{span}")
    return "\n".join(lines)


def check(
    logdir: str, screenshot: str = "", port: int = 0, stock: bool = False
) -> tuple[list[str], dict[str, Any], dict[str, Any]]:
    """Serve ``logdir`` (``stock``: with a plain ``tensorboard``), load it in Chromium, compare page and
    API: (problems, expected, page)."""
    port = port or free_port()
    with TensorBoard(logdir, port, stock=stock) as tb:
        exp = expected(tb)
        with Browser() as browser:
            defaults = default_views(browser, port)  # first, as a user who types the address meets it
            page = page_state(browser, port, len(exp["charts"]))
            page["defaults"] = defaults
            if screenshot:  # what a user sees at first open, every category in view
                # TensorBoard scrolls inside its page: a viewport tall enough for every category
                categories = len({c["category"] for c in exp["charts"]})
                browser.resize(1500, min(6000, 160 + 680 * max(1, categories)))
                time.sleep(3.0)
                browser.screenshot(screenshot)
    return verify(exp, page), exp, page


def tiny_grid(out: str) -> str:
    """A small real grid (lenet5, 1 and 2 workers, every strategy, a short calibration) for the check."""
    cmd = [
        sys.executable,
        "-m",
        "lab",
        "scaling",
        "--models",
        "lenet5",
        "--workers",
        "1,2",
        "--repeats",
        "1",
        "--steps",
        "6",
        "--warmup-steps",
        "2",
        "--commbench-sizes",
        "64K,1M",
        "--out-dir",
        out,
    ]
    print("+ " + " ".join(cmd), flush=True)
    subprocess.run(cmd, check=False)
    return out


def comparison_of(path: str) -> str:
    """A grid's output directory or a comparison logdir -> the comparison logdir."""
    inner = os.path.join(path, tblog.COMPARISON_DIR)
    return inner if os.path.isdir(inner) else path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m lab.tbcheck",
        description="Load a comparison in TensorBoard in headless Chromium and check that "
        "every chart shows every run by default.",
    )
    p.add_argument(
        "path",
        nargs="?",
        default="",
        help="a grid's output directory or its tensorboard/ logdir (default: run a small grid first)",
    )
    p.add_argument("--out", default="", help="where the small grid goes (default: runs/tb-check/<time>)")
    p.add_argument(
        "--screenshot",
        default="",
        help="save the Custom Scalars tab here (default: <logdir>/../tensorboard_custom_scalars.png)",
    )
    p.add_argument(
        "--images",
        default="",
        help="write tensorboard_custom_scalars.png and scaling.png (redrawn from "
        "the grid's results.json) to this directory, e.g. docs/img",
    )
    p.add_argument(
        "--stock",
        action="store_true",
        help="serve with a plain `tensorboard` (its own defaults: outliers ignored in chart scaling) "
        "instead of make tensorboard's server",
    )
    args = p.parse_args(argv)
    path = args.path or tiny_grid(args.out or os.path.join("runs", "tb-check", time.strftime("%Y%m%d-%H%M%S")))
    logdir = comparison_of(path)
    if not run_dirs(logdir):
        print(
            f"tb-check: error: {logdir} holds no TensorBoard runs; give a grid's output directory "
            "(runs/scaling/<time>) or its tensorboard/",
            file=sys.stderr,
        )
        return 2
    grid = os.path.dirname(os.path.normpath(logdir))
    shot = (
        os.path.join(args.images, "tensorboard_custom_scalars.png")
        if args.images
        else (args.screenshot or os.path.join(grid, "tensorboard_custom_scalars.png"))
    )
    try:
        problems, exp, page = check(logdir, shot, stock=args.stock)
    except (CheckError, BrowserError, OSError) as e:
        print(f"tb-check: error: {e}", file=sys.stderr)
        return 2
    print(summary(exp, page))
    print(f"screenshot: {shot}")
    if args.images:
        results = os.path.join(grid, "results.json")
        if os.path.exists(results):
            from ..common.plots import plot_measured

            with open(results) as fh:
                res = json.load(fh)
            plot_measured(os.path.join(args.images, "scaling.png"), res["rows"], res["models"])
            print(f"plot: {os.path.join(args.images, 'scaling.png')} (from {results})")
        elif os.path.exists(os.path.join(grid, "scaling.png")):
            shutil.copy(os.path.join(grid, "scaling.png"), os.path.join(args.images, "scaling.png"))
    for line in problems:
        print(f"tb-check: FAIL: {line}", file=sys.stderr)
    print(
        "tb-check: "
        + (
            "FAILED"
            if problems
            else "ok: every chart shows every run with data, all ticked by default, no line cut; "
            "every dashboard starts unsmoothed and uncut"
        )
    )
    return 1 if problems else 0
