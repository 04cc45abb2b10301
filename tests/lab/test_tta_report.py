"""The time-to-accuracy grid's methods, report and figure from a grid's results (no jobs run here)."""

import json
import struct

import pytest

from allreduce_train.config import parse_target
from lab.tta.report import add_model_ratios, markdown, metric_key, plot_style, plot_time_to_accuracy
from lab.tta.spec import EXCHANGES, TtaConfig, TtaError, method_groups, methods


def job(model, method, n, evals, target, ok=True, reached=None):
    key = metric_key(target)
    rec = {
        "model": model,
        "method": method,
        "workers": n,
        "repeat": 1,
        "ok": ok,
        "hosts": "this machine",
        "target": target,
        "evals": [{"step": 10 * (i + 1), "seconds": 2.0 * (i + 1), key: v} for i, v in enumerate(evals)] if ok else [],
        "error": None if ok else "exit 1",
        "log": "logs/x.log",
        "steps": 10 * len(evals),
        "samples_per_sec": 100.0,
        "loadavg_before": 0.5,
        "final": {key: evals[-1]} if evals else {},
        "reached": bool(reached),
    }
    if reached:
        rec.update(steps_to_target=10 * reached, seconds_to_target=2.0 * reached, epochs_to_target=0.5 * reached)
    return rec


def png_size(path):
    with open(path, "rb") as fh:
        head = fh.read(24)
    assert head[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", head[16:24])


@pytest.mark.heavy
def test_one_panel_per_model_and_worker_count_with_every_job_that_evaluated(tmp_path):
    acc, ppl = "eval/accuracy>=0.8", "eval/perplexity<=300"
    jobs = [
        job("lenet5", "ring-horovod", 1, [0.5, 0.7, 0.85], acc, reached=3),
        job("lenet5", "ps-sync-colocated", 1, [0.5, 0.6, 0.7], acc),  # not reached: a line, no star
        job("lenet5", "ring-mpi", 2, [0.6, 0.82], acc, reached=2),
        job("lenet5", "ps-async-colocated", 2, [], acc, ok=False),  # failed: no line
        job("ptb-lstm-small", "ring-horovod", 1, [900.0, 400.0, 280.0], ppl, reached=3),
    ]
    res = {"targets": {"lenet5": acc, "ptb-lstm-small": ppl}, "jobs": jobs}
    path = tmp_path / "tta.png"
    drawn = plot_time_to_accuracy(str(path), res)
    # rows: models; columns: N = 1, 2; the LSTM has no job at N = 2, so that panel says "no data"
    assert drawn == [[("ring-horovod", 1), ("ps-sync-colocated", 1)], [("ring-mpi", 2)], [("ring-horovod", 1)], []]
    assert png_size(path) == (840, 680)  # 4.2 x 3.4 inches per panel at 100 dpi


def test_the_report_shows_the_figure():
    acc = "eval/accuracy>=0.8"
    res = {
        "started": "t",
        "minutes": 1.0,
        "command": ["python"],
        "out_dir": "out",
        "notes": [],
        "machine": {"cores": 2, "platform": "linux"},
        "targets": {"lenet5": acc},
        "what": {"lenet5": "test"},
        "config": {"seed": 1, "evals_per_epoch": 4, "emulate_from": 0, "link_rate": "1gbit"},
        "jobs": [job("lenet5", "ring-horovod", 1, [0.5, 0.85], acc, reached=2)],
    }
    assert "](time_to_accuracy.png)" in markdown(res)


def test_the_plot_reads_targets_as_the_trainer_does():
    assert (metric_key("eval/accuracy>=0.89"), parse_target("eval/accuracy>=0.89")[1:]) == (
        "eval_accuracy",
        (">=", 0.89),
    )
    assert (metric_key("eval/perplexity<=300"), parse_target("eval/perplexity<=300")[1:]) == (
        "eval_perplexity",
        ("<=", 300.0),
    )


# ------------------------------------------------------------------ the communication-reduction concepts


def concept_job(method, seconds=None, rate="10mbit", n=2, ok=True):
    """A finished emulated job: reached after ``seconds`` (None: not reached)."""
    acc = "eval/accuracy>=0.89"
    rec = job("lenet5", method, n, [0.8, 0.9 if seconds else 0.85], acc, ok=ok, reached=2 if seconds else None)
    rec.update(link_rate=rate, hosts=f"{n} emulated, {rate}", global_batch=128, step_ms=20.0, comm_wait_ms=5.0)
    if seconds:
        rec["seconds_to_target"] = seconds
    return rec


def report_of(jobs):
    acc = "eval/accuracy>=0.89"
    return markdown(
        {
            "started": "t",
            "minutes": 1.0,
            "command": ["python"],
            "out_dir": "out",
            "notes": [],
            "machine": {"cores": 2, "platform": "linux"},
            "targets": {"lenet5": acc},
            "what": {"lenet5": "x"},
            "config": {"seed": 1, "evals_per_epoch": 4, "emulate_from": 2, "rates": ["100mbit", "10mbit"]},
            "jobs": jobs,
        }
    )


def row(report, method, rate):
    (line,) = [ln for ln in report.splitlines() if ln.startswith(f"| {method} |") and f"emulated, {rate} |" in ln]
    return [c.strip() for c in line.strip("|").split("|")]


def test_every_concept_is_a_method_whose_flags_the_trainer_accepts():
    from allreduce_train.cli import make_parser
    from allreduce_train.config import build_config

    table = methods()
    for name in (
        "ring-horovod-fp16",
        "ring-mpi-fp16",
        "ring-mpi-bf16",
        "ring-horovod-powersgd-r4",
        "ring-mpi-powersgd-r4",
        "ring-horovod-localsgd-h4",
        "ring-mpi-localsgd-h16",
        "ps-sync-colocated-fp16",
        "ps-sync-colocated-bf16",
        "ps-async-dedicated-fp16",
    ):
        m = table[name]
        cfg = build_config(make_parser().parse_args(["train", "--model", "lenet5", *m.flags]))
        text = repr(cfg)
        if m.concept in ("fp16", "bf16", "powersgd"):
            assert f"compression='{m.concept}'" in text, name
        if m.concept == "powersgd":
            assert "powersgd_rank=4" in text, name
        if m.concept == "localsgd":
            assert f"average_every={m.param}" in text, name
    # Horovod has no bfloat16 allreduce and the PS no PowerSGD or local SGD: the grid does not offer them
    assert "ring-horovod-bf16" not in table and not any(
        n.startswith("ps-") and m.concept in ("powersgd", "localsgd") for n, m in table.items()
    )
    # the 16-bit allreduce is the baseline; the PS's 16 bits are not an allreduce
    assert {n for n, m in table.items() if m.sixteen_bit_allreduce} == {
        "ring-horovod-fp16",
        "ring-mpi-fp16",
        "ring-mpi-bf16",
    }
    groups = method_groups()
    assert groups["exchanges"] == list(TtaConfig().methods) and set(groups["all"]) == set(table)
    assert "ring-mpi-powersgd-r4" in groups["concepts"] and "ps-sync-dedicated" not in groups["concepts"]


def test_the_report_marks_the_fastest_16_bit_allreduce_per_link_and_times_every_method_against_it():
    jobs = [
        concept_job("ring-mpi-fp16", 100.0),
        concept_job("ring-horovod-fp16", 150.0),
        concept_job("ring-mpi", 200.0),
        concept_job("ring-mpi-powersgd-r4", 50.0),
        concept_job("ring-mpi-localsgd-h16", None),
        # another link: its own baseline (Horovod's this time), and a failed job
        concept_job("ring-horovod-fp16", 40.0, rate="100mbit"),
        concept_job("ring-mpi-fp16", 44.0, rate="100mbit"),
        concept_job("ring-mpi-powersgd-r4", 60.0, rate="100mbit"),
        concept_job("ring-mpi-localsgd-h4", rate="100mbit", ok=False),
    ]
    report = report_of(jobs)
    assert row(report, "**ring-mpi-fp16** (baseline)", "10mbit")[3:5] == ["yes", "100.0"]
    assert row(report, "**ring-mpi-fp16** (baseline)", "10mbit")[5] == "1.00"
    assert row(report, "ring-horovod-fp16", "10mbit")[5] == "1.50"
    assert row(report, "ring-mpi", "10mbit")[5] == "2.00"
    assert row(report, "ring-mpi-powersgd-r4", "10mbit")[5] == "0.50"
    assert row(report, "ring-mpi-localsgd-h16", "10mbit")[3:6] == ["no", "–", "–"]
    assert row(report, "**ring-horovod-fp16** (baseline)", "100mbit")[5] == "1.00"
    assert row(report, "ring-mpi-fp16", "100mbit")[5] == "1.10"
    assert row(report, "ring-mpi-powersgd-r4", "100mbit")[5] == "1.50"
    assert row(report, "ring-mpi-localsgd-h4", "100mbit")[3].startswith("failed")
    assert (
        "- N = 2, 10mbit: baseline ring-mpi-fp16 100.0 s; fastest other: ring-mpi-powersgd-r4 50.0 s (0.50x, "
        "beats the baseline); did not reach the target: ring-mpi-localsgd-h16."
    ) in report
    assert (
        "- N = 2, 100mbit: baseline ring-horovod-fp16 40.0 s; fastest other: ring-mpi-fp16 44.0 s (1.10x, does "
        "not beat the baseline); failed: ring-mpi-localsgd-h4."
    ) in report
    # no cost-model figures in the jobs: no model ratio column
    assert "model ratio" not in report


def test_the_model_ratio_is_the_measured_mean_step_over_the_cost_models_step_on_the_emulated_link():
    from lab.common import costmodel, gradients
    from lab.common.links import link_network

    jobs = [
        concept_job("ring-mpi-powersgd-r4", 50.0),
        concept_job("ring-mpi-localsgd-h16", None),
        concept_job("ps-sync-dedicated-fp16", 70.0),
        job("lenet5", "ring-mpi-fp16", 2, [0.9], "eval/accuracy>=0.89", reached=1),
    ]
    add_model_ratios(jobs)
    expect = {
        "ring-mpi-powersgd-r4": (costmodel.Method(costmodel.POWERSGD, rank=4), costmodel.ALLREDUCE),
        "ring-mpi-localsgd-h16": (costmodel.Method(every=16), costmodel.ALLREDUCE),
        "ps-sync-dedicated-fp16": (costmodel.Method(costmodel.FP16), costmodel.PS_DEDICATED),
    }
    for j in jobs[:3]:
        method, kind = expect[j["method"]]
        # the job's own compute: its median step (20 ms) less its median wait (5 ms); 64 samples per worker
        p = costmodel.predict_method(method, kind, 2, gradients.shapes("lenet5"), 0.015, 64, link_network("10mbit"), 1)
        mean_ms = 1e3 * 128 / j["samples_per_sec"]  # global batch / samples per second
        assert j["pred_step_ms"] == pytest.approx(1e3 * p.step_s) and j["compute_ms"] == pytest.approx(15.0)
        assert j["model_ratio"] == pytest.approx(mean_ms / (1e3 * p.step_s))
    assert jobs[0]["model_bytes_per_step"] < jobs[1]["model_bytes_per_step"] < jobs[2]["model_bytes_per_step"]
    assert "model_ratio" not in jobs[3]  # this machine: no link to model
    report = report_of(jobs)
    assert row(report, "ring-mpi-powersgd-r4", "10mbit")[-1] == f"{jobs[0]['model_ratio']:.2f}"
    (local,) = [ln for ln in report.splitlines() if "ring-mpi-fp16** (baseline) | 2 | this machine |" in ln]
    assert local.endswith("| – |") and "| model ratio |" in report


@pytest.mark.heavy
def test_the_figure_has_a_panel_per_worker_count_and_link_rate(tmp_path):
    jobs = [
        concept_job("ring-mpi-fp16", 100.0, rate="10mbit"),
        concept_job("ring-mpi-fp16", 40.0, rate="100mbit"),
        concept_job("ring-mpi-powersgd-r4", 30.0, rate="100mbit"),
        concept_job("ring-mpi-fp16", 20.0, rate="1gbit"),
        job("lenet5", "ring-mpi", 1, [0.8, 0.9], "eval/accuracy>=0.89", reached=2),
    ]
    drawn = plot_time_to_accuracy(
        str(tmp_path / "tta.png"), {"targets": {"lenet5": "eval/accuracy>=0.89"}, "jobs": jobs}
    )
    # columns: (1, this machine), then N = 2 from the fastest link to the slowest
    assert drawn == [
        [("ring-mpi", 1)],
        [("ring-mpi-fp16", 2)],
        [("ring-mpi-fp16", 2), ("ring-mpi-powersgd-r4", 2)],
        [("ring-mpi-fp16", 2)],
    ]
    assert png_size(tmp_path / "tta.png") == (1680, 340)
    # a concept keeps one colour on every engine, the engine sets the line style; no two methods look alike
    assert plot_style("ring-mpi-powersgd-r4")[0] == plot_style("ring-horovod-powersgd-r4")[0]
    assert plot_style("ring-mpi-powersgd-r4")[1] != plot_style("ring-horovod-powersgd-r4")[1]
    assert len({plot_style(n) for n in methods()}) == len(methods())


def test_methods_and_rates_from_the_command_line():
    import argparse

    from lab.tta.main import add_arguments, config_from_args

    p = argparse.ArgumentParser()
    add_arguments(p)
    cfg = config_from_args(p.parse_args(["--methods", "ring-mpi-fp16,concepts", "--rates", "100mbit,10mbit"]))
    assert cfg.methods[0] == "ring-mpi-fp16" and cfg.methods[1:] == [
        n for n in method_groups()["concepts"] if n != "ring-mpi-fp16"
    ]
    assert cfg.rates == ["100mbit", "10mbit"]
    assert config_from_args(p.parse_args(["--link-rate", "100mbit"])).rates == ["100mbit"]
    assert config_from_args(p.parse_args([])).rates == ["1gbit"] and config_from_args(p.parse_args([])).methods == list(
        EXCHANGES
    )
    with pytest.raises(TtaError, match="--rates"):
        config_from_args(p.parse_args(["--rates", "10mbit,10mbit"]))


def test_emulated_worker_counts_run_once_per_link_rate_and_the_others_once():
    from lab.tta.main import grid_points

    cfg = TtaConfig(
        models=["lenet5"],
        methods=["ring-mpi-fp16", "ps-async-colocated-fp16"],
        workers=[1, 2, 4],
        emulate_from=2,
        rates=["100mbit", "10mbit"],
    )
    got = [(m.name, n, rate) for _, _, m, n, rate in grid_points(cfg, cfg.workers)]
    assert got == [
        ("ring-mpi-fp16", 1, None),  # one asynchronous worker is the synchronous run: not run
        *[
            (name, n, rate)
            for rate in ("100mbit", "10mbit")
            for n in (2, 4)
            for name in ("ring-mpi-fp16", "ps-async-colocated-fp16")
        ],
    ]


def grid_dir(path, jobs, rates):
    """A finished grid on disk: its results.json and each job's run directory with a metrics.json."""
    acc = "eval/accuracy>=0.89"
    for j in jobs:
        j.update(run=f"runs/lenet5/{j['method']}-{j['link_rate']}", log=f"logs/{j['method']}.log", ok=True)
        (path / j["run"]).mkdir(parents=True)
        (path / j["run"] / "metrics.json").write_text(json.dumps({"comm_wait_ms": 5.0}))
    res = {
        "started": "t",
        "minutes": 1.5,
        "command": ["python", "-m", "lab", "time-to-accuracy", "--rates", ",".join(rates)],
        "out_dir": str(path),
        "notes": [],
        "machine": {"cores": 2, "platform": "linux"},
        "targets": {"lenet5": acc},
        "what": {"lenet5": "x"},
        "loadavg_end": 1.0,
        "config": {"seed": 1, "evals_per_epoch": 4, "emulate_from": 2, "rates": rates},
        "jobs": jobs,
    }
    path.mkdir(parents=True, exist_ok=True)
    (path / "results.json").write_text(json.dumps(res))
    return str(path)


def test_several_grids_merge_into_one_report_with_every_job_and_rate(tmp_path):
    from lab.tta.main import merge_grids

    a = grid_dir(
        tmp_path / "a", [concept_job("ring-mpi-fp16", 200.0), concept_job("ring-mpi-powersgd-r4", 50.0)], ["10mbit"]
    )
    b = grid_dir(tmp_path / "b", [concept_job("ring-mpi-fp16", 30.0, rate="1gbit")], ["1gbit"])
    out = tmp_path / "merged"
    res = merge_grids([a, b], str(out))
    assert len(res["jobs"]) == 3 and res["config"]["rates"] == ["10mbit", "1gbit"] and res["minutes"] == 3.0
    # every job's run is found from the merged directory
    assert all((out / j["run"] / "metrics.json").exists() for j in res["jobs"])
    report = (out / "report.md").read_text()
    assert report.count("Grid: `python -m lab time-to-accuracy --rates") == 2
    assert row(report, "ring-mpi-powersgd-r4", "10mbit")[5] == "0.25"  # vs 16-bit: against its own grid's fp16
    assert row(report, "**ring-mpi-fp16** (baseline)", "1gbit")[5] == "1.00"
    assert (out / "time_to_accuracy.png").stat().st_size > 0
    with pytest.raises(TtaError, match="--out-dir"):
        merge_grids([a, b], "")
