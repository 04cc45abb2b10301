"""tb-check's cut-line detection (a point drawn outside its chart's domain), the assets that make
``make tensorboard`` open every dashboard unsmoothed and with "Ignore outliers in chart scaling"
unticked, and, in headless Chromium, a plain TensorBoard that smooths and cuts a two-point comparison
(at the plain address too) against the lab's server that does not."""

import io
import zipfile
from typing import Any

import pytest

from lab.common import tblog
from lab.tbcheck import main as tbcheck
from lab.tbcheck import tbview
from lab.tbcheck.browser import find_chromium


def card(y, series, x=(1.0, 2.0), title="lenet5: of the bound"):
    """A chart as the page state reports it: its axes' domains and each line's points (step, value)."""
    return {
        "title": title,
        "y": list(y) if y else None,
        "x": list(x) if x else None,
        "lines": [name for name, _ in series],
        "series": [{"name": name, "points": [list(p) for p in pts]} for name, pts in series],
    }


def test_a_point_below_or_above_the_drawn_y_domain_is_a_cut_line_and_one_inside_is_not():
    lines = [("of_bound (ddp)", [(1, 0.98), (2, 0.70)]), ("of_bound (trainer)", [(1, 1.0), (2, 0.94)])]
    assert tbcheck.cut_points(card((0.65, 1.05), lines)) == []
    # what TensorBoard's outlier scaling did to bench's chart: the lowest point under the axis
    cut = card((0.78, 1.02), lines)
    assert tbcheck.cut_points(cut) == ["of_bound (ddp): step 2 value 0.7 outside y [0.78, 1.02]"]
    top = card((1.045, 1.105), [("over (ddp)", [(1, 1.10), (2, 1.31)])])
    assert tbcheck.cut_points(top) == ["over (ddp): step 2 value 1.31 outside y [1.045, 1.105]"]
    # a point on the edge is drawn (within rounding); NaN is TensorBoard's own marker, not a line point
    edge = card((0.7, 1.0), [("a (x)", [(1, 1.0 + 1e-9), (2, 0.7), (3, float("nan"))])], x=(1.0, 3.0))
    assert tbcheck.cut_points(edge) == []
    assert tbcheck.cut_points(card((0, 1), [("a (x)", [(1, 0.5), (4, 0.5)])])) == [
        "a (x): step 4 value 0.5 outside x [1, 2]"
    ]
    assert tbcheck.cut_points(card(None, [("a (x)", [(1, 0.5)])])) == [
        "no axes found for its lines (the page did not draw the chart)"
    ]
    assert tbcheck.cut_points(card(None, [])) == []


def test_the_check_fails_on_a_cut_chart_and_names_the_line():
    chart = {
        "category": "lenet5",
        "title": "lenet5: of the bound",
        "figure": "scaling/of_bound",
        "regexes": [tblog.tag_pattern("scaling/of_bound/lenet5")],
        "runs": ["ddp", "trainer"],
    }
    exp = {"runs": ["ddp", "trainer"], "charts": [chart]}
    page: dict[str, Any] = {
        "selected": ["ddp", "trainer"],
        "smoothing": 0,
        "colors": {"ddp": "#f00", "trainer": "#00f"},
        "charts": [
            card(
                (0.78, 1.02),
                [
                    ("scaling/of_bound/lenet5 (ddp)", [(1, 0.98), (2, 0.70)]),
                    ("scaling/of_bound/lenet5 (trainer)", [(1, 1.0), (2, 0.94)]),
                ],
            )
        ],
    }
    assert tbcheck.verify(exp, page) == [
        "chart lenet5 / lenet5: of the bound: 1 point(s) cut off (drawn outside the plot): "
        "scaling/of_bound/lenet5 (ddp): step 2 value 0.7 outside y [0.78, 1.02]"
    ]
    page["charts"][0]["y"] = [0.65, 1.05]
    assert tbcheck.verify(exp, page) == []


def test_the_served_page_loads_the_defaults_script_before_anything_else():
    src = io.BytesIO()
    with zipfile.ZipFile(src, "w") as z:
        z.writestr("index.html", "<!doctype html><html><head><meta charset=utf-8><script src=index.js></script>")
        # the Polymer dashboards' smoothing initializer and its hash observer, as TensorBoard 2.21 minifies them
        z.writestr(
            "index.js",
            'a=UE("_smoothingWeight",{defaultValue:.6}).call(this),'
            'b=qE("_smoothingWeight",{defaultValue:.6}),c=UE("_smoothingWeights",{defaultValue:.65})',
        )
    with zipfile.ZipFile(io.BytesIO(tbview.patched_assets(src.getvalue()))) as z:
        html = z.read("index.html").decode()
        assert html.index(f'<script src="{tbview.DEFAULTS_JS}">') < html.index("index.js")
        assert z.read("index.js").decode() == (
            'a=UE("_smoothingWeight",{defaultValue:0}).call(this),'
            'b=qE("_smoothingWeight",{defaultValue:0}),c=UE("_smoothingWeights",{defaultValue:.65})'
        )
        script = z.read(tbview.DEFAULTS_JS).decode()
    # it fills in the settings only where the user never made one: the Polymer tabs' outlier box and
    # Time Series' smoothing and outlier box inside its JSON object of settings
    assert 'getItem("_ignoreYOutliers") === null' in script and 'setItem("_ignoreYOutliers", "false")' in script
    assert 'if (!("scalarSmoothing" in settings)) settings.scalarSmoothing = 0;' in script
    assert 'if (!("ignoreOutliers" in settings)) settings.ignoreOutliers = false;' in script
    bad = io.BytesIO()
    with zipfile.ZipFile(bad, "w") as z:
        z.writestr("index.html", "<html><body></body></html>")
    with pytest.raises(RuntimeError, match="no <head>"):
        tbview.patched_assets(bad.getvalue())
    other = io.BytesIO()  # another TensorBoard's code: no server rather than a smoothed one
    with zipfile.ZipFile(other, "w") as z:
        z.writestr("index.html", "<html><head></head></html>")
        z.writestr("index.js", 'smoothing("_smoothingWeight", 0.6)')
    with pytest.raises(RuntimeError, match="_smoothingWeight"):
        tbview.patched_assets(other.getvalue())
    assert tbview.command("x", 6007)[-4:] == ["--serve", "x", "--port", "6007"]
    assert tbview.command("x", 6007, stock=True)[-4:] == ["--host", "127.0.0.1", "--port", "6007"]


def test_a_dashboard_opened_without_settings_must_start_unsmoothed_and_uncut():
    def view(address, dashboard, smoothing, ignore):
        return {"address": address, "dashboard": dashboard, "smoothing": smoothing, "ignoreOutliers": ignore}

    views = [
        view("http://127.0.0.1:6007/", "timeseries", 0.6, True),
        view("http://127.0.0.1:6007/#scalars", "scalars", 0, False),
        view("http://127.0.0.1:6007/#custom_scalars", None, None, None),
    ]
    assert tbcheck.verify_defaults(views) == [
        "http://127.0.0.1:6007/ (timeseries): smoothing is 0.6, not 0",
        'http://127.0.0.1:6007/ (timeseries): "Ignore outliers in chart scaling" is ticked: few-point lines are cut',
        "http://127.0.0.1:6007/#custom_scalars (no dashboard drawn): the page drew no dashboard",
    ]
    assert tbcheck.verify_defaults(views[1:2]) == []
    # verify() reports them beside the charts' own problems
    page = {"selected": [], "smoothing": 0, "colors": {}, "charts": [], "defaults": views[:1]}
    problems = tbcheck.verify({"runs": [], "charts": []}, page)
    assert [p for p in problems if p.startswith("http://")] == tbcheck.verify_defaults(views[:1])


@pytest.mark.long  # two TensorBoards in headless Chromium end to end (~18 s): make test-long, .ci/run
@pytest.mark.skipif(find_chromium() is None, reason="no Chromium (tools/install.sh installs Debian's chromium)")
def test_a_plain_tensorboard_cuts_a_two_point_comparison_and_the_lab_server_shows_it_whole(tmp_path):
    # bench's two comparison charts with figures of docs/performance.md's order: the lowest and the
    # highest point of each lie outside the 5th-95th percentile range TensorBoard scales to by default
    series: tblog.Series = {}
    for run, (one, two) in {"trainer": (1.0, 0.94), "horovod": (0.99, 0.79), "ddp": (0.98, 0.70)}.items():
        tblog.add_point(series, run, "scaling/of_bound/lenet5", 1, one)
        tblog.add_point(series, run, "scaling/of_bound/lenet5", 2, two)
    for run, (one, two) in {"horovod": (1.02, 1.05), "ddp": (1.10, 1.31)}.items():
        tblog.add_point(series, run, "perf/trainer_over/lenet5", 1, one)
        tblog.add_point(series, run, "perf/trainer_over/lenet5", 2, two)
    logdir = str(tmp_path / "tensorboard")
    layout = tblog.model_categories(["lenet5"], ["scaling/of_bound", "perf/trainer_over"])
    tblog.write_comparison(logdir, series, layout)

    problems, _, page = tbcheck.check(logdir, stock=True)
    assert page["ignoreOutliers"] is True
    # the address a user types opens Time Series smoothed and cut, and so do the tabs a click opens
    assert [(v["dashboard"], v["smoothing"], v["ignoreOutliers"]) for v in page["defaults"]] == [
        ("timeseries", 0.6, True),
        ("scalars", 0.6, True),
        ("custom_scalars", 0.6, True),
    ]
    cut = [p for p in problems if "cut off" in p]
    assert len(cut) == 2 and "(ddp): step 2 value 0.7 outside y" in cut[0], problems

    problems, _, page = tbcheck.check(logdir)
    assert page["ignoreOutliers"] is False and problems == [], problems
    assert [(v["dashboard"], v["smoothing"], v["ignoreOutliers"]) for v in page["defaults"]] == [
        ("timeseries", 0, False),
        ("scalars", 0, False),
        ("custom_scalars", 0, False),
    ]
    for chart in page["charts"]:
        lo, hi = chart["y"]
        values = [p[1] for s in chart["series"] for p in s["points"]]
        assert len(values) in (4, 6) and lo <= min(values) and max(values) <= hi
