"""``python -m lab paper``: the grids it plans (the existing scaling-netns and time-to-accuracy commands in
the paper's design), its refusals, and the report, figure and TensorBoard comparison it writes from
the grids' results.json (a tiny grid's, written here in the grids' format)."""

import argparse
import json
import os
import shlex
import subprocess
import sys
from typing import Any

import pytest

from lab.paper import main as paper

from helpers import ROOT

# samples/s by (model, rate, strategy, N): LeNet-5's dedicated server saturates, the LSTM's placements tie
THROUGHPUT = {
    ("lenet5", "1gbit"): {
        "ps-sync-dedicated": (1000, 1500),
        "ps-sync-colocated": (1200, 2200),
        "ring-horovod": (1200, 2000),
        "ring-mpi": (1200, 2100),
    },
    ("ptb-lstm-small", "1gbit"): {
        "ps-sync-dedicated": (100, 150),
        "ps-sync-colocated": (110, 168),
        "ring-horovod": (110, 160),
        "ring-mpi": (110, 165),
    },
}


def args(*argv):
    p = argparse.ArgumentParser()
    paper.add_arguments(p)
    return p.parse_args(list(argv))


def write_grids(out):
    """What scaling-netns writes (results.json with the cost model per job, <rate>/results.json with the
    grid's rows) and what time-to-accuracy writes (results.json with its jobs), for 1 and 2 workers."""
    netns_rows: list[dict[str, Any]] = []
    grids: dict[str, list[dict[str, Any]]] = {}
    for (model, rate), per in THROUGHPUT.items():
        for s, (one, two) in per.items():
            for n, thr in ((1, one), (2, two)):
                step = 1e3 * n * 64 / thr
                grids.setdefault(rate, []).append(
                    {
                        "model": model,
                        "strategy": s,
                        "workers": n,
                        "repeats": 1,
                        "samples_per_sec_mean": thr,
                        "samples_per_sec_std": 0.0,
                        "speedup": thr / one,
                    }
                )
                netns_rows.append(
                    {
                        "rate": rate,
                        "model": model,
                        "strategy": s,
                        "workers": n,
                        "ok": True,
                        "step_ms": step,
                        "wait_ms": step / 3,
                        "pred_step_ms": step * 0.9,
                        "model_bytes_per_step": 2.5e5,
                    }
                )
        grids[rate].append(
            {
                "model": model,
                "strategy": "bound",
                "workers": 1,
                "repeats": 1,
                "samples_per_sec_mean": 5000.0,
                "samples_per_sec_std": 0.0,
                "speedup": 1.0,
            }
        )
    os.makedirs(out / "throughput" / "1gbit")
    (out / "throughput" / "results.json").write_text(
        json.dumps({"command": "python -m lab scaling-netns", "rates": ["1gbit"], "minutes": 1.0, "rows": netns_rows})
    )
    (out / "throughput" / "1gbit" / "results.json").write_text(json.dumps({"rows": grids["1gbit"]}))
    jobs = [
        {
            "model": "lenet5",
            "method": m,
            "workers": 2,
            "link_rate": "1gbit",
            "ok": True,
            "reached": m != "ps-async-colocated",
            "synchronous": "async" not in m,
            "samples_per_sec": 2000.0,
            "seconds_to_target": secs,
            "steps_to_target": 900,
            "steps": 2000,
        }
        for m, secs in (
            ("ring-mpi", 20.0),
            ("ps-sync-dedicated", 30.0),
            ("ps-async-dedicated", 45.0),
            ("ps-sync-colocated", 21.0),
            ("ps-async-colocated", None),
        )
    ]
    os.makedirs(out / "tta")
    (out / "tta" / "results.json").write_text(
        json.dumps({"jobs": jobs, "targets": {"lenet5": "eval/accuracy>=0.89"}, "minutes": 2.0})
    )


def test_the_plan_is_the_papers_design_on_the_existing_grids(capsys):
    assert paper.main(args("--dry-run", "--out-dir", "runs/paper/x")) == 0
    lines = capsys.readouterr().out.splitlines()
    throughput, tta = shlex.split(lines[1]), shlex.split(lines[3])
    assert throughput[1:4] == ["-m", "lab", "scaling-netns"] and tta[1:4] == ["-m", "lab", "time-to-accuracy"]
    opt = lambda cmd, flag: cmd[cmd.index(flag) + 1]  # noqa: E731
    assert opt(throughput, "--hosts") == "1,2,4" and opt(throughput, "--rates") == "1gbit,100mbit"
    assert opt(throughput, "--models") == "lenet5,ptb-lstm-small"
    assert set(opt(throughput, "--strategies").split(",")) == {
        "ps-sync-dedicated",
        "ps-sync-colocated",
        "ring-horovod",
        "ring-mpi",
    }
    assert opt(throughput, "--out-dir") == "runs/paper/x/throughput"
    methods = opt(tta, "--methods").split(",")
    assert {"ps-sync-dedicated", "ps-async-dedicated", "ps-sync-colocated", "ps-async-colocated"} <= set(methods)
    assert opt(tta, "--workers") == "4" and opt(tta, "--emulate-from") == "4" and opt(tta, "--rates") == "1gbit,100mbit"
    assert paper.main(args("--dry-run", "--tta-models", "none", "--ps-servers", "2")) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2 and "--ps-servers 2" in lines[1]
    assert paper.main(args("--dry-run", "--tta-target", "lenet5=eval/accuracy>=0.85", "--tta-rates", "100mbit")) == 0
    tta = shlex.split(capsys.readouterr().out.splitlines()[3])
    assert opt(tta, "--target") == "lenet5=eval/accuracy>=0.85" and opt(tta, "--rates") == "100mbit"


@pytest.mark.heavy
def test_bad_input_is_one_line_naming_the_flag_and_exit_2(capsys):
    for argv, flag in (
        (["--hosts", "2,4"], "--hosts"),
        (["--rates", "1gbit,fast"], "--rates"),
        (["--tta-rates", "x"], "--tta-rates"),
        (["--models", "resnet18"], "--models"),
        (["--ps-servers", "0"], "--ps-servers"),
        (["--report", "/nonexistent"], "--report"),
        (["--tta-target", "lenet5=accuracy"], "--tta-target"),
        (["--tta-target", "resnet18=eval/accuracy>=0.5"], "--tta-target"),
    ):
        assert paper.main(args(*argv)) == 2, argv
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1 and err.startswith(f"paper: error: {flag}"), (argv, err)
    # through the lab's entry point too: no traceback
    proc = subprocess.run(
        [sys.executable, "-m", "lab", "paper", "--hosts", "x"], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 2 and proc.stderr.strip() == (
        "paper: error: --hosts: expected comma-separated integers (got 'x')"
    )


@pytest.mark.heavy
def test_the_report_gives_a_verdict_per_finding_with_the_model_beside_and_draws_the_figure(tmp_path):
    write_grids(tmp_path)
    res = paper.report(
        str(tmp_path), {"command": "python -m lab paper", "started": "now", "minutes": 3.0, "cpus": 2, "load": "1.0"}
    )
    by = {f["model"]: f for f in res["findings"]}
    # LeNet-5: colocated 2200 vs dedicated 1500 samples/s at N = 2 -> 1.47: decentralized faster (holds);
    # in the paper's measure, speedup 1.83 vs 1.5 -> 1.22: scales better (holds too)
    assert by["lenet5"]["holds"] and by["lenet5"]["throughput_says"] == "decentralized faster"
    assert by["lenet5"]["holds_by_speedup"] and by["lenet5"]["speedup_says"] == "decentralized scales better"
    assert abs(by["lenet5"]["speedup_ratio"] - (2200 / 1200) / 1.5) < 1e-9
    # LSTM: 168 vs 150 samples/s -> 1.12, beyond 10 %: does not hold; its speedups 1.527 vs 1.5 are within 10 %,
    # so by the paper's measure it would
    assert not by["ptb-lstm-small"]["holds"] and by["ptb-lstm-small"]["holds_by_speedup"]
    assert by["ptb-lstm-small"]["speedup_says"].startswith("no significant")
    # the model's step is 0.9x every measured one, so its ratios equal the measured ones
    assert abs(by["lenet5"]["pred_throughput_ratio"] - 2200 / 1500) < 1e-9
    text = (tmp_path / "report.md").read_text()
    assert (
        "| lenet5 | 1gbit | 2 | decentralized PS scales better | 1.47 (1.47) | decentralized faster | yes | "
        "1.50 | 1.83 | 1.22 (1.22) | yes |"
    ) in text
    assert "Same engine (mpi4py), ring / colocated PS" in text  # concept and implementation apart
    # the cost model's K: more dedicated servers shorten the dedicated step toward the colocated one
    k = {r["model"]: r["ratio"] for r in res["k_model"]}
    assert set(k["lenet5"]) == {1, 2} and k["ptb-lstm-small"][1] > k["ptb-lstm-small"][2] >= 1.0
    assert "## The cost model: which K makes the placements equal" in text
    assert "| lenet5 | 1gbit | 2 | ps-async-dedicated | 2000 | yes | 45.0 | 900 | 1.50x |" in text
    assert "| lenet5 | 1gbit | 2 | ps-async-colocated | 2000 | no |" in text
    assert (tmp_path / "paper.png").read_bytes()[:4] == b"\x89PNG"
    runs = sorted(p.name for p in (tmp_path / "tensorboard").iterdir())
    assert runs == ["ps-async-dedicated", "ps-sync-colocated", "ps-sync-dedicated", "ring-horovod", "ring-mpi"]
    # the same report again from the files, as --report does
    assert paper.main(args("--report", str(tmp_path))) == 0
    assert (tmp_path / "report.md").read_text().split("\n", 3)[3] == text.split("\n", 3)[3]
