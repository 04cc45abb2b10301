"""time-to-accuracy: real jobs train to a target, stop there, and the report says when."""

import csv
import json
import os
import subprocess
import sys

import pytest
import torch

from helpers import ROOT, check, lab_in_process, load_params, needs_fashion_mnist


def tta(*args, timeout=600):
    return subprocess.run(
        [sys.executable, "-m", "lab", "time-to-accuracy", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )


@pytest.mark.heavy
@pytest.mark.parametrize(
    "args, needle",
    [
        (["--methods", "gossip"], "--methods"),
        (["--models", "resnet18"], "--models"),
        (["--target", "lenet5=accuracy>0.5"], "--target"),
        (["--workers", "0"], "--workers"),
        (["--link-rate", "fast"], "--link-rate"),
        (["--rates", "1gbit,fast"], "--rates"),
        (["--rates", "1gbit", "--link-rate", "1gbit"], "--link-rate"),
        (["--report", "/nonexistent"], "--report"),
    ],
)
def test_bad_input_is_one_line(capsys, args, needle):
    if args == ["--methods", "gossip"]:  # the command as users run it
        proc = tta(*args, timeout=60)
        code, err = proc.returncode, proc.stderr
    else:
        code, err = lab_in_process(capsys, "time-to-accuracy", *args)
    assert code == 2 and len(err.strip().splitlines()) == 1 and needle in err, err


@pytest.mark.mpi
@needs_fashion_mnist
def test_two_workers_reach_a_low_target_stop_there_and_report_it(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out = tmp_path / "tta"
    # one job (each costs a launch and a Fashion-MNIST load): the asynchronous PS, whose staleness the grid reports
    proc = check(
        tta(
            "--models",
            "lenet5",
            "--methods",
            "ps-async-colocated",
            "--workers",
            "2",
            "--target",
            "lenet5=eval/accuracy>=0.6",
            "--max-epochs",
            "1",
            "--evals-per-epoch",
            "8",
            "--out-dir",
            str(out),
        )
    )
    res = json.loads((out / "results.json").read_text())
    (j,) = res["jobs"]
    assert (j["method"], j["workers"], j["ok"], j["reached"]) == ("ps-async-colocated", 2, True, True), proc.stdout
    spe = 60_000 // (2 * 64)  # Fashion-MNIST's training set, 2 workers x batch 64
    assert j["steps_per_epoch"] == spe and j["eval_every"] == spe // 8
    # the run stopped at the first evaluation over the target: every earlier one was below it
    evals = j["evals"]
    assert evals[-1]["step"] == j["steps_to_target"] == j["steps"] and evals[-1]["eval_accuracy"] >= 0.6
    assert all(e["eval_accuracy"] < 0.6 for e in evals[:-1])
    assert [e["step"] for e in evals] == [j["eval_every"] * (i + 1) for i in range(len(evals))]
    assert j["epochs_to_target"] == pytest.approx(j["steps_to_target"] / spe)
    assert j["seconds_to_target"] > 0 and j["samples_to_target"] == j["steps_to_target"] * 128
    # the servers counted the updates each gradient missed, and the other worker's updates landed between a
    # worker's pull and push: not lock-step sync (tests/mpi/test_ps.py checks the dedicated servers' figures)
    assert j["staleness_mean"] > 0 and j["staleness_max"] >= 1
    # the TensorBoard summary: the figure against the step and against wall-clock milliseconds
    ea = EventAccumulator(str(out / "summary" / "lenet5" / "ps-async-colocated-n2-r1")).Reload()
    by_step = ea.Scalars("tta/eval_accuracy")
    assert [e.step for e in by_step] == [e["step"] for e in evals]
    assert [e.wall_time - by_step[0].wall_time for e in by_step] == pytest.approx(
        [e["seconds"] - evals[0]["seconds"] for e in evals], abs=1e-3
    )
    assert [e.step for e in ea.Scalars("tta/eval_accuracy_vs_ms")] == [round(1e3 * e["seconds"]) for e in evals]
    report = (out / "report.md").read_text()
    assert "## lenet5: eval/accuracy>=0.6" in report
    assert "](time_to_accuracy.png)" in report and (out / "time_to_accuracy.png").stat().st_size > 10_000
    expect = (
        f"| ps-async-colocated | 2 | this machine | yes | {j['seconds_to_target']:.1f} | – | {j['steps_to_target']} |"
    )
    assert expect in report  # no 16-bit allreduce ran: "–" against it
    with open(out / "results.csv") as fh:
        (row,) = list(csv.DictReader(fh))
    assert int(row["steps_to_target"]) == j["steps_to_target"]


@pytest.mark.mpi
@needs_fashion_mnist
def test_a_concept_method_trains_two_ranks_to_a_low_target_with_its_flags(tmp_path):
    # one short job (a low target, evaluations every 1/16 epoch): PowerSGD rank 4 on the mpi engine
    out = tmp_path / "tta"
    check(
        tta(
            "--models",
            "lenet5",
            "--methods",
            "ring-mpi-powersgd-r4",
            "--workers",
            "2",
            "--target",
            "lenet5=eval/accuracy>=0.5",
            "--max-epochs",
            "1",
            "--evals-per-epoch",
            "16",
            "--out-dir",
            str(out),
            "--extra=--dump-params",
            f"--extra={tmp_path}/params-{{rank}}.pt",
        )
    )
    res = json.loads((out / "results.json").read_text())
    (j,) = res["jobs"]
    assert (j["method"], j["concept"], j["ok"], j["reached"]) == ("ring-mpi-powersgd-r4", "powersgd", True, True)
    i = j["argv"].index("--compression")
    assert j["argv"][i : i + 4] == ["--compression", "powersgd", "--powersgd-rank", "4"]
    m = json.loads((out / j["run"] / "metrics.json").read_text())
    assert (m["compression"], m["allreduce_engine"], m["workers"]) == ("powersgd", "mpi", 2)
    assert j["evals"][-1]["eval_accuracy"] >= 0.5 and j["steps_to_target"] == j["steps"]
    # the two workers trained on different halves of the data and end on the same parameters: the
    # decompressed low-rank average reached both
    p0, p1 = load_params(tmp_path / "params-0.pt"), load_params(tmp_path / "params-1.pt")
    assert p0.keys() == p1.keys() and all(torch.equal(p0[k], p1[k]) for k in p0)
    # no 16-bit allreduce ran: the report has no baseline to set the concept against, and says so
    report = (out / "report.md").read_text()
    assert "| ring-mpi-powersgd-r4 | 2 | this machine | yes |" in report and "** (baseline) |" not in report
    assert "N = 2, this machine: no 16-bit allreduce reached the target" in report
