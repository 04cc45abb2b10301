"""make scaling-netns: the scaling grid through the emulated cluster, beside the cost model."""

import json
import subprocess
import sys

import pytest

from lab.emulation import netns

from helpers import ROOT, check, lab_in_process


def run_grid(*args, timeout=600):
    return subprocess.run(
        [sys.executable, "-m", "lab", "scaling-netns", *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout
    )


@pytest.mark.heavy
@pytest.mark.parametrize(
    "args, needle",
    [
        (["--rates", "fast"], "--rates"),
        (["--strategies", "gossip"], "--strategies"),
        (["--hosts", "0"], "--hosts"),
    ],
)
def test_bad_input_is_one_line(capsys, args, needle):
    if args == ["--rates", "fast"]:  # the command as users run it
        proc = run_grid(*args, timeout=60)
        code, err = proc.returncode, proc.stderr
    else:
        code, err = lab_in_process(capsys, "scaling-netns", *args)
    assert code == 2 and len(err.strip().splitlines()) == 1 and needle in err, err


@pytest.mark.mpi
def test_grid_measures_over_the_links_and_predicts_the_configured_bandwidth(tmp_path, namespaces_permitted):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    check(
        run_grid(
            "--hosts",
            "2",
            "--rates",
            "100mbit",
            "--models",
            "lenet5",
            "--strategies",
            "ring-horovod",
            "--steps",
            "5",
            "--out-dir",
            str(tmp_path),
        )
    )
    (row,) = json.loads((tmp_path / "results.json").read_text())["rows"]
    assert row["ok"] and row["workers"] == 2 and row["strategy"] == "ring-horovod"
    # 2 workers: the ring moves 2(N-1)/N x S = S through each link; at 100 Mbit/s that takes S / 12.5 MB/s
    nbytes = 4 * 61_706
    assert row["model_bytes_per_step"] == nbytes
    assert row["pred_exchange_ms"] == pytest.approx(1e3 * nbytes / 12.5e6)
    assert row["pred_step_ms"] == pytest.approx(row["compute_ms"] + row["pred_exchange_ms"])
    # the bytes really went over the emulated links: at least the model's share in every step
    assert set(row["traffic"]) == {"h1", "h2"} and row["link_bytes_per_step"] >= nbytes
    report = (tmp_path / "report.md").read_text()
    assert "### 100mbit per link" in report and "| lenet5 | ring-horovod | 2 |" in report
    assert "MPI_Allreduce (Horovod's on CPU): ring from 4 MiB on 3+ ranks" in report  # the launcher's default
    grid_report = (tmp_path / "100mbit" / "report.md").read_text()  # the grid's own report for the rate
    # no empty compute sentence and no "No calibration": the network is the configured rate
    assert "Compute per step = the grid has no one-worker run" in grid_report and ": ." not in grid_report
    assert "No calibration" not in grid_report and "Network: the emulated links, 100mbit" in grid_report
    # every rate's comparison in one logdir, a run per strategy with the rate in the tag, and the
    # job in the HParams logdir
    runs = {p.name: p for p in (tmp_path / "tensorboard").iterdir()}
    assert set(runs) == {"ring-horovod", "bound"}  # the no-exchange bound beside the strategy
    run = runs["ring-horovod"]
    assert "perf/step_ms/lenet5/100mbit" in EventAccumulator(str(run)).Reload().Tags()["scalars"]
    assert (tmp_path / "hparams" / "100mbit" / "lenet5" / "ring-horovod-n2-r1").is_dir()
    assert netns.leftovers() == []
