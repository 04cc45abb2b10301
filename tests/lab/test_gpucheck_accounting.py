"""The GPU check's accounting (issue 28): the trainer's per-step cost against DDP, and with --parts
where its step goes. By hand, and in a CPU run of the same code (this machine has no GPU)."""

import json
import subprocess
import sys

import pytest

from lab.gpucheck.report import accounting, parts_table

from helpers import ROOT


def row(way, step_ms, batch=256):
    return {"model": "resnet18", "way": way, "batch": batch, "ranks": 1, "step_ms": step_ms, "samples_per_sec": 1.0}


def test_accounting_gives_the_microseconds_the_trainer_adds_over_ddp_per_model_and_batch():
    rows = [
        row("trainer", 100.0),
        row("trainer-exchange", 101.5),
        row("horovod", 100.2),
        row("ddp", 101.0),
        row("ddp", 10.0, batch=64),  # no trainer at this batch: no line
        {"model": "resnet18", "way": "ring-gloo", "batch": 256, "ranks": 2, "step_ms": 5.0},
    ]
    lines = accounting(rows)
    assert "trainer - DDP µs/step" in lines[2]
    body = [ln for ln in lines if ln.startswith("| resnet18")]
    assert body == [
        "| resnet18 | 256 | trainer, Horovod allreduce | 101.500 | 101.000 | 100.200 | +500 | 0.995 |",
        "| resnet18 | 256 | trainer, no exchange | 100.000 | 101.000 | 100.200 | -1000 | 1.010 |",
    ]
    assert accounting([row("ddp", 1.0)]) == []  # nothing to compare: no section


def test_parts_table_names_each_part_of_the_step_and_skips_rows_without_parts():
    parts = {
        "impl": "trainer-exchange",
        "model": "lenet5",
        "rank": 0,
        "size": 1,
        "steps": 10,
        "step_us": 900.0,
        "step_cpu_us": 850.0,
        "mark_us": 0.8,
        "mark_cpu_us": 0.7,
        "marks_us_per_step": 7.2,
        "parts": {
            "forward": {"us_per_step": 400.0, "cpu_us_per_step": 390.0, "calls_per_step": 1},
            "wait": {"us_per_step": 3.0, "cpu_us_per_step": 2.0, "calls_per_step": 1},
        },
    }
    lines = parts_table(
        [{**row("trainer-exchange", 0.9, batch=1024), "model": "lenet5", "parts": parts}, row("ddp", 1.0)]
    )
    text = "\n".join(lines)
    assert "lenet5 batch 1024 trainer, Horovod allreduce" in text
    assert "| forward+loss (and the vote's start) | 400 / 390 |" in text and "**900 / 850**" in text
    assert "| exchange wait (synchronize, the vote's end) | 3 / 2 |" in text and "| 0.80 / 0.70 |" in text
    assert parts_table([row("ddp", 1.0)]) == []


@pytest.mark.long  # gpu-check's accounting run end to end (~15 s): make test-long, .ci/run
@pytest.mark.mpi
@pytest.mark.timeout(900)
def test_a_cpu_run_prints_the_accounting_and_times_the_trainers_parts(tmp_path):
    out = tmp_path / "gpucheck.json"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "lab",
            "gpucheck",
            "--device",
            "cpu",
            "--models",
            "lenet5",
            "--ways",
            "trainer-exchange,ddp",
            "--busy",
            "",
            "--two-ranks",
            "",
            "--steps",
            "4",
            "--warmup-steps",
            "2",
            "--batch-size",
            "8",
            "--parts",
            "--out",
            str(out),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=880,
    )
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    assert "The trainer's per-step cost against DDP" in proc.stdout and "| lenet5 | 8 | trainer, Horovod" in proc.stdout
    (trainer,) = [r for r in json.loads(out.read_text())["rows"] if r["way"] == "trainer-exchange"]
    parts = trainer["parts"]
    assert parts["steps"] == 4 and parts["step_us"] > 0
    # every phase of the trainer's trace once per step (data twice: the batch to the device, the next gathered);
    # the run's evaluation at the end lies after the timed steps
    calls = {name: part["calls_per_step"] for name, part in parts["parts"].items()}
    assert calls == {"data": 2, "forward": 1, "backward": 1, "wait": 1, "update": 1, "step residue": 1}
    assert "Where the trainer's step goes" in proc.stdout
