"""The comparison logdir (one TensorBoard run per concept, one Custom Scalars chart per tag), the
HParams sessions, plots that say when their data is missing, `make tensorboard`'s refusals, and
the browser check in headless Chromium."""

import json
import math
import os
import subprocess
import sys

import pytest

from lab.common import plots, tblog
from lab.scaling import report
from lab.scaling.netns import add_arguments as netns_arguments
from lab.scaling.netns import grid_config
from lab.tbcheck import main as tbcheck
from lab.tbcheck import tbview
from lab.tbcheck.browser import find_chromium

from helpers import ROOT

STRATEGIES = ("ring-horovod", "ps-sync-colocated", "ps-sync-dedicated")
THROUGHPUT = {"ring-horovod": 100.0, "ps-sync-colocated": 90.0, "ps-sync-dedicated": 80.0}
GAIN = {"ring-horovod": 1.8, "ps-sync-colocated": 1.6, "ps-sync-dedicated": 1.3}  # speedup at N=2


def results(workers=(1, 2), models=("lenet5",), curves=True):
    """A grid's results.json as the grid writes it, from throughputs chosen by hand."""
    jobs = []
    for m in models:
        for s in STRATEGIES:
            for n in workers:
                thr = THROUGHPUT[s] * (GAIN[s] if n == 2 else n / 2 * GAIN[s] if n > 2 else 1.0)
                jobs.append(
                    {
                        "model": m,
                        "strategy": s,
                        "workers": n,
                        "servers": int(s == "ps-sync-dedicated"),
                        "world_size": n,
                        "repeat": 1,
                        "ok": True,
                        "samples_per_sec": thr,
                        "step_ms": 10.0,
                        "comm_wait_ms": 1.0,
                        "loadavg_before": 1.0,
                        "hparams": {
                            "model": m,
                            "variant": s,
                            "strategy": s.split("-")[0],
                            "workers": n,
                            "engine": "horovod" if s == "ring-horovod" else "mpi4py",
                            "link_rate": "this host",
                        },
                    }
                )
    jobs[0]["time_to_target_s"] = 12.5
    rows = report.aggregate(jobs)
    for r in rows:
        r.update(predicted_samples_per_sec=math.nan, predicted_efficiency=math.nan, prediction_error_pct=math.nan)
    pts = [
        {"workers": n, "efficiency": 1 / (1 + 0.1 * math.log2(n)), "speedup": n / (1 + 0.1 * math.log2(n))}
        for n in (1, 2, 4, 8, 64, 256, 1024)
    ]
    return {
        "started": "now",
        "seconds": 60.0,
        "command": ["python", "-m", "lab", "scaling"],
        "out_dir": "",
        "code": "test",
        "machine": {"cores": 2, "platform": "test"},
        "config": {"data": "synthetic", "repeats": 1, "workers": list(workers), "horovod_cycle_ms": "auto"},
        "models": list(models),
        "strategies": list(STRATEGIES),
        "plans": {m: {"batch_size": 64, "warmup": 1, "steps": 4, "samples": 640} for m in models},
        "gradient_bytes": dict.fromkeys(models, 246824),
        "horovod_cycle": {"knob": "Horovod's default"},
        "loadavg": "1.0",
        "rows": rows,
        "jobs": jobs,
        "notes": [],
        "compute_s": dict.fromkeys(models, 0.01),
        "calibration": {},
        "calibration_source": "",
        "given_network": {"gbps": 10, "latency_us": 50, "label": "10 Gbit/s, 50 us"},
        "curves": {m: dict.fromkeys(("ring-horovod", "ps-sync-dedicated"), pts) for m in models} if curves else {},
    }


def scalars(path, tag):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    ea = EventAccumulator(str(path)).Reload()
    return [(e.step, e.value) for e in ea.Scalars(tag)] if tag in ea.Tags()["scalars"] else []


def session_hparams(path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.hparams import metadata

    ea = EventAccumulator(str(path)).Reload()
    ssi = metadata.parse_session_start_info_plugin_data(
        ea.SummaryMetadata(metadata.SESSION_START_INFO_TAG).plugin_data.content
    )
    return {k: v.string_value or v.number_value for k, v in ssi.hparams.items()}


def test_comparison_has_one_run_per_concept_with_the_same_tags_and_one_chart_per_tag(tmp_path):
    res = results()
    layout = report.write_tensorboard(str(tmp_path), res)
    runs = sorted(p.name for p in (tmp_path / "tensorboard").iterdir())
    assert runs == sorted(STRATEGIES)  # the cost model's curves in the same runs: one colour per concept
    for s in STRATEGIES:  # the same tags in every concept's run, step = N, the measured values
        run = tmp_path / "tensorboard" / s
        assert scalars(run, "perf/samples_per_sec/lenet5") == [
            (1, pytest.approx(THROUGHPUT[s])),
            (2, pytest.approx(THROUGHPUT[s] * GAIN[s])),
        ]
        assert scalars(run, "scaling/speedup/lenet5") == [(1, pytest.approx(1.0)), (2, pytest.approx(GAIN[s]))]
        assert scalars(run, "scaling/efficiency/lenet5") == [(1, pytest.approx(1.0)), (2, pytest.approx(GAIN[s] / 2))]
    assert [
        st for st, _ in scalars(tmp_path / "tensorboard" / "ring-horovod", "scaling/predicted_efficiency/lenet5")
    ] == [
        1,
        2,
        4,
        8,
        64,
        256,
        1024,
    ]
    # one chart per tag, each matching exactly that tag (so it holds one line per run)
    charts = layout["lenet5"]
    assert [c[1] for c in charts.values()] == [
        ["^scaling/speedup/lenet5$"],
        ["^scaling/efficiency/lenet5$"],
        ["^perf/samples_per_sec/lenet5$"],
        ["^scaling/predicted_efficiency/lenet5$"],
    ]
    assert all(kind == "Multiline" for kind, _ in charts.values())


def test_a_chart_without_data_is_left_out_and_the_plot_says_why(tmp_path):
    res = results(workers=(4,), curves=False)  # no one-worker baseline: speedup undefined
    layout = report.write_tensorboard(str(tmp_path), res)
    assert [c[1] for c in layout["lenet5"].values()] == [["^perf/samples_per_sec/lenet5$"]]
    titles = plots.plot_measured(str(tmp_path / "scaling.png"), res["rows"], ["lenet5", "resnet18"])
    assert "no 1-worker baseline" in titles[0] and "N = 4" in titles[0]
    assert "every job failed" in titles[1]
    assert (tmp_path / "scaling.png").read_bytes()[:4] == b"\x89PNG"


def test_hparams_has_one_session_per_job_with_its_settings_and_metrics(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.hparams import metadata

    res = results()
    report.write_tensorboard(str(tmp_path), res)
    root = EventAccumulator(str(tmp_path / "hparams")).Reload()
    exp = metadata.parse_experiment_plugin_data(root.SummaryMetadata(metadata.EXPERIMENT_TAG).plugin_data.content)
    assert {h.name for h in exp.hparam_infos} == {"model", "variant", "strategy", "workers", "engine", "link_rate"}
    # what differs between jobs comes first in the table (TensorBoard shows five columns at first)
    assert {h.name for h in exp.hparam_infos if h.differs} == {"variant", "strategy", "workers", "engine"}
    assert {m.name.tag for m in exp.metric_infos} == {
        "samples_per_sec",
        "step_ms",
        "comm_wait_ms",
        "efficiency",
        "time_to_target_s",
    }
    sessions = sorted(p.relative_to(tmp_path / "hparams").as_posix() for p in (tmp_path / "hparams").glob("*/*"))
    assert sessions == sorted(f"lenet5/{s}-n{n}-r1" for s in STRATEGIES for n in (1, 2))
    ea = EventAccumulator(str(tmp_path / "hparams" / "lenet5" / "ps-sync-dedicated-n2-r1")).Reload()
    ssi = metadata.parse_session_start_info_plugin_data(
        ea.SummaryMetadata(metadata.SESSION_START_INFO_TAG).plugin_data.content
    )
    assert ssi.hparams["variant"].string_value == "ps-sync-dedicated" and ssi.hparams["workers"].number_value == 2
    assert scalars(ea.path, "efficiency") == [(0, pytest.approx(GAIN["ps-sync-dedicated"] / 2))]
    assert scalars(tmp_path / "hparams" / "lenet5" / "ring-horovod-n1-r1", "time_to_target_s") == [(0, 12.5)]


@pytest.mark.heavy
def test_report_redraws_everything_from_results_json_without_doubling_points(tmp_path, capsys):
    res = results()
    (tmp_path / "results.json").write_text(json.dumps(res))
    cmd = [sys.executable, "-m", "lab.scaling.report", str(tmp_path)]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert report.main([str(tmp_path)]) == 0  # a second redraw replaces, not appends
    assert len(scalars(tmp_path / "tensorboard" / "ring-horovod", "scaling/speedup/lenet5")) == 2
    for f in ("report.md", "scaling.png", "predicted.png", "results.csv"):
        assert (tmp_path / f).exists(), f
    assert f"make tensorboard RUN={tmp_path}/tensorboard" in (tmp_path / "report.md").read_text()
    capsys.readouterr()
    assert report.main([str(tmp_path / "nowhere")]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "results.json" in err


def test_tensorboard_refuses_port_6006_in_one_line_and_serves_the_latest_comparison(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "lab.tbcheck.tbview", "--port", "6006"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1
    assert "6006" in proc.stderr and "hwloc" in proc.stderr and "6007" in proc.stderr
    assert tbview.latest_comparison(str(tmp_path)) is None
    for i, name in enumerate(("scaling/old", "bench-x", "scaling/new")):
        run = tmp_path / name / "tensorboard" / "ring-horovod"
        run.mkdir(parents=True)
        (run / "events.out.tfevents.1.x").write_bytes(b"")
        os.utime(run / "events.out.tfevents.1.x", (1000 + i, 1000 + i))
    assert tbview.latest_comparison(str(tmp_path)) == str(tmp_path / "scaling" / "new" / "tensorboard")
    assert tbview.url(6007) == "http://127.0.0.1:6007/#custom_scalars&_smoothingWeight=0"
    assert tbview.command("x", 6007, stock=True)[-4:] == ["--host", "127.0.0.1", "--port", "6007"]


def test_netns_grid_runs_one_two_and_four_hosts_by_default():
    import argparse

    p = argparse.ArgumentParser()
    netns_arguments(p)
    assert grid_config(p.parse_args([])).workers == [1, 2, 4]
    cfg = grid_config(p.parse_args(["--hosts", "4,2"]))
    assert cfg.workers == [2, 4] and not cfg.commbench


@pytest.mark.long  # TensorBoard in headless Chromium end to end (~20 s): make test-long, .ci/run
@pytest.mark.skipif(find_chromium() is None, reason="no Chromium (tools/install.sh installs Debian's chromium)")
def test_browser_sees_every_concept_in_every_chart_and_catches_a_logdir_over_40_runs(tmp_path):
    res = results(models=("lenet5", "ptb-lstm-small"))
    report.write_tensorboard(str(tmp_path / "good"), res)
    shot = tmp_path / "shot.png"
    problems, exp, page = tbcheck.check(str(tmp_path / "good" / "tensorboard"), str(shot))
    assert problems == [], problems
    assert len(exp["charts"]) == 8 and page["smoothing"] == 0
    assert sorted(page["selected"]) == sorted(exp["runs"]) == sorted(STRATEGIES)
    for chart in page["charts"]:  # each concept a line of its own, in its own colour
        drawn = sorted(tbcheck.run_of_line(line) for line in chart["lines"])
        assert drawn == (
            sorted(["ring-horovod", "ps-sync-dedicated"]) if "predicted" in chart["title"] else sorted(STRATEGIES)
        ), chart
    assert len(set(page["colors"].values())) == len(exp["runs"])
    assert shot.read_bytes()[:4] == b"\x89PNG"

    # what the old layout did: every job a run of the same logdir -> nothing ticked, empty charts
    series = {f"job{i:02d}": {"perf/samples_per_sec/lenet5": [(1, 1.0 + i)]} for i in range(41)}
    tblog.write_comparison(str(tmp_path / "many"), series, tblog.model_categories(["lenet5"], ["perf/samples_per_sec"]))
    problems, _, _ = tbcheck.check(str(tmp_path / "many"))
    assert any("41 runs" in p for p in problems) and any("not ticked" in p for p in problems)
    assert any("draws nothing" in p for p in problems), problems


def test_bench_comparison_has_one_run_per_implementation_and_one_session_per_job(tmp_path):
    from lab.bench.main import BenchSpec, Override, summarise, write_tensorboard

    impls = ["trainer", "ddp", "fp16"]
    spec = BenchSpec(
        models=["lenet5"],
        nps=[1, 2],
        impls=impls,
        repeats=1,
        variants=[Override("fp16", "trainer", args=["--compression", "fp16"])],
    )
    rate = {"trainer": 100.0, "ddp": 90.0, "fp16": 95.0}
    jobs = [
        {
            "impl": i,
            "model": "lenet5",
            "np": n,
            "tag": "r0",
            "loadavg_before": [1.0, 1.0, 1.0],
            "samples_per_sec": rate[i] * (1.5 if n == 2 else 1.0),
            "cpu_ms_per_step": 5.0,
        }
        for n in (1, 2)
        for i in impls
    ]
    rows = summarise(jobs, spec, impls)
    write_tensorboard(str(tmp_path), rows, jobs, spec, "table")
    assert sorted(p.name for p in (tmp_path / "tensorboard").iterdir()) == sorted(impls)
    for i in impls:
        run = tmp_path / "tensorboard" / i
        assert scalars(run, "perf/samples_per_sec/lenet5") == [(1, rate[i]), (2, rate[i] * 1.5)]
        assert scalars(run, "scaling/efficiency/lenet5") == [(1, 1.0), (2, 0.75)]
    assert scalars(tmp_path / "tensorboard" / "ddp", "perf/trainer_over/lenet5") == [
        (1, pytest.approx(100 / 90)),
        (2, pytest.approx(100 / 90)),
    ]
    assert len(list((tmp_path / "hparams").iterdir())) == 1 + len(jobs)
    assert scalars(tmp_path / "hparams" / "lenet5-fp16-np2-r0", "efficiency") == [(0, 0.75)]
    for job, concept, engine in (
        ("lenet5-fp16-np2-r0", "ring allreduce", "Horovod"),
        ("lenet5-ddp-np1-r0", "ring allreduce", "torch DDP"),
    ):
        hp = session_hparams(tmp_path / "hparams" / job)
        assert (hp["concept"], hp["engine"]) == (concept, engine), job
    assert session_hparams(tmp_path / "hparams" / "lenet5-fp16-np2-r0")["settings"] == "--compression fp16"


def test_the_check_names_a_concept_missing_from_one_model_a_chart_that_draws_less_and_shared_colours():
    def chart(model, runs, figure="scaling/speedup"):
        return {
            "category": model,
            "title": f"{model}: {figure}",
            "regexes": [tblog.tag_pattern(f"{figure}/{model}")],
            "figure": figure,
            "runs": runs,
        }

    def card(model, runs, figure="scaling/speedup"):
        return {"title": f"{model}: {figure}", "lines": [f"{figure}/{model} ({r})" for r in runs]}

    exp = {
        "runs": ["allreduce", "ps", "ring8"],
        "charts": [
            chart("lenet5", ["allreduce", "ps"]),
            chart("resnet18", ["allreduce"]),
            chart("vgg", ["allreduce", "ring8"], "scaling/efficiency"),
        ],
    }
    page = {
        "selected": ["allreduce", "ps", "ring8"],
        "smoothing": 0,
        "colors": {"allreduce": "#f00", "ps": "#00f", "ring8": "#f00"},  # an 8th run gets the 1st's colour
        "charts": [
            card("lenet5", ["allreduce"]),
            card("resnet18", ["allreduce"]),
            card("vgg", ["allreduce", "ring8"], "scaling/efficiency"),
        ],
    }
    assert tbcheck.verify(exp, page) == [
        "chart lenet5 / lenet5: scaling/speedup: draws ['allreduce'], the data is in ['allreduce', 'ps']",
        "chart resnet18 / resnet18: scaling/speedup: no data for ps (their jobs failed or did not run?)",
        "chart vgg / vgg: scaling/efficiency: runs share a colour: allreduce, ring8",
    ]


def test_a_run_that_did_not_reach_the_target_at_one_rate_is_no_missing_job():
    """make paper's time-to-target charts: an asynchronous PS that reached the target at one link rate and
    not at the other has a point in one chart only; that is its result. The same gap in a throughput
    figure still means a failed job."""

    def chart(title, figure, runs):
        return {"category": "lenet5", "title": title, "regexes": [f"^{figure}/x$"], "figure": figure, "runs": runs}

    def card(title, figure, runs):
        return {"title": title, "lines": [f"{figure}/x ({r})" for r in runs]}

    tta, sps = "paper/time_to_target_s/lenet5", "paper/samples_per_sec/lenet5"
    exp = {
        "runs": ["ps-async", "ring"],
        "charts": [
            chart("tta 1gbit", tta, ["ps-async", "ring"]),
            chart("tta 100mbit", tta, ["ring"]),
            chart("sps 1gbit", sps, ["ps-async", "ring"]),
            chart("sps 100mbit", sps, ["ring"]),
        ],
    }
    page = {
        "selected": ["ps-async", "ring"],
        "smoothing": 0,
        "colors": {"ring": "#f00", "ps-async": "#00f"},
        "charts": [
            card("tta 1gbit", tta, ["ps-async", "ring"]),
            card("tta 100mbit", tta, ["ring"]),
            card("sps 1gbit", sps, ["ps-async", "ring"]),
            card("sps 100mbit", sps, ["ring"]),
        ],
    }
    assert tbcheck.verify(exp, page) == [
        "chart lenet5 / sps 100mbit: no data for ps-async (their jobs failed or did not run?)"
    ]


def test_a_grid_job_names_its_concept_engine_placement_mode_and_link_rate():
    from lab.scaling.grid import Job, job_hparams
    from lab.scaling.spec import GridConfig, variants

    vs = variants()
    hp = job_hparams(GridConfig(link_rate="100mbit"), Job("lenet5", vs["ps-sync-dedicated"], 2, 1))
    assert hp == {
        "model": "lenet5",
        "variant": "ps-sync-dedicated",
        "strategy": "ps",
        "placement": "dedicated",
        "mode": "sync",
        "engine": "mpi4py",
        "workers": 2,
        "servers": 1,
        "link_rate": "100mbit",
    }
    hp = job_hparams(GridConfig(extra=["--ps-mode", "async"]), Job("lenet5", vs["ps-sync-colocated"], 4, 1))
    assert (hp["placement"], hp["mode"], hp["link_rate"]) == ("colocated", "async", "this host")
    assert job_hparams(GridConfig(), Job("lenet5", vs["ring-horovod"], 2, 1))["engine"] == "Horovod"
    assert job_hparams(GridConfig(), Job("lenet5", vs["ring-mpi"], 2, 1))["engine"] == "mpi4py"
