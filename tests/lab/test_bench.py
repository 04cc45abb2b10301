"""`bench`: its table and JSON, equal work across the implementations it times, its variants and its
bad input. The Horovod exchange's own tests are in tests/mpi/test_horovod_exchange.py."""

import json
import os
import subprocess
import sys

import pytest
import torch

from lab.bench.main import BenchSpec, parse_variant, summarise, table
from lab.common.jobs import free_port
from lab.common.workloads import first_batch, loss_of
from models import MODELS

from helpers import ROOT, check, launch, rel_diff


def bench(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "lab", "bench", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )


@pytest.mark.long  # every implementation through the whole bench (~70 s): make test-long, .ci/run
@pytest.mark.mpi
def test_bench_tiny_setting_prints_table_and_writes_json_for_every_implementation(tmp_path):
    out = tmp_path / "bench"
    proc = check(bench("--np", "1,2", "--repeats", "1", "--steps", "5", "--warmup", "2", "--out", str(out)))
    report = json.loads((out / "bench.json").read_text())
    impls = report["impls"]
    assert {"trainer", "horovod", "ddp"} <= set(impls)
    from lab.bench.main import WIDE_MAX

    if len(impls) > WIDE_MAX:  # the default set is wide: one line per (model, ranks, implementation)
        assert "| implementation | samples/s | trainer/it |" in proc.stdout
        for np in (1, 2):
            for impl in impls:
                assert f"| lenet5 | {np} | {impl} |" in proc.stdout, impl
    else:
        for impl in impls:
            assert f"{impl} samples/s" in proc.stdout
        assert "trainer/horovod" in proc.stdout and "trainer/ddp" in proc.stdout
    assert [(r["model"], r["np"]) for r in report["rows"]] == [("lenet5", 1), ("lenet5", 2)]
    from lab.bench.main import runs_at

    for row in report["rows"]:  # every implementation, the sharded stages at 2 ranks only
        assert set(row["impls"]) == {i for i in impls if runs_at(i, row["np"])}, row
        assert all(s["median"] > 0 for s in row["impls"].values())
        assert row["ratios"]["trainer/ddp"]["median"] > 0 and row["ratios"]["trainer/horovod"]["median"] > 0
    assert report["rows"][1]["efficiency"]["trainer"] > 0
    assert len(report["jobs"]) == sum(runs_at(i, np) for np in (1, 2) for i in impls)
    assert all(len(j["loadavg_before"]) == 3 and "error" not in j for j in report["jobs"])
    # TensorBoard: the comparison, one run per implementation, and one HParams session per job
    assert {p.name for p in (out / "tensorboard").iterdir()} == set(impls)
    assert len(list((out / "hparams").iterdir())) == 1 + len(report["jobs"])  # + the experiment's events


@pytest.mark.long  # every implementation of the bench, run (~28 s per model): make test-long, .ci/run
@pytest.mark.mpi
@pytest.mark.parametrize("model_name", ["lenet5", "ptb-lstm-small"])
def test_every_implementation_computes_the_same_averaged_gradient(tmp_path, model_name):
    """Equal work: for the same inputs each implementation's averaged gradient is the gradient of
    the union batch in one process; without the exchange a rank's own gradient is far from it."""
    grads = {}
    impls: tuple[tuple[str, list[str]], ...] = (
        ("horovod", []),
        ("ddp", []),
        ("trainer", []),
        ("trainer-mpi", ["--allreduce-engine", "mpi"]),
        ("trainer-torch", ["--allreduce-engine", "torch"]),
        ("trainer-gloo", ["--horovod-backend", "gloo"]),
    )
    for impl, extra in impls if model_name == "lenet5" else impls[:5]:
        check(
            launch(
                2,
                [
                    "--impl",
                    impl.split("-")[0],
                    "--model",
                    model_name,
                    *extra,
                    "--port",
                    str(free_port()),
                    "--dump-grads",
                    str(tmp_path / f"{impl}-{{rank}}.pt"),
                ],
                module="lab.bench.rank",
            )
        )
        r0 = torch.load(tmp_path / f"{impl}-0.pt", weights_only=True)
        r1 = torch.load(tmp_path / f"{impl}-1.pt", weights_only=True)
        assert all(torch.equal(r0[k], r1[k]) for k in r0), f"{impl}: ranks hold different gradients"
        grads[impl] = r0

    torch.manual_seed(42)
    model = MODELS[model_name].build()
    x, y = first_batch(model_name, 128, 6400, 42, rank=0, size=1)  # both ranks' batches of 64 together
    loss_of(model, x, y).backward()
    union = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    for impl, g in grads.items():
        assert rel_diff(g, union) <= 1e-5, impl
    model.zero_grad()
    x0, y0 = first_batch(model_name, 64, 6400, 42, rank=0, size=2)
    loss_of(model, x0, y0).backward()
    assert rel_diff({n: p.grad for n, p in model.named_parameters() if p.grad is not None}, union) > 1e-2


@pytest.mark.long  # the bench end to end (~15 s): make test-long, .ci/run
@pytest.mark.mpi
def test_bench_times_a_language_model_and_variants(tmp_path):
    """The trainer and a variant of it on the LSTM (the bare Horovod and DDP loops: their timing in the tiny
    setting above, their LSTM steps in the equal-work test)."""
    out = tmp_path / "bench"
    proc = check(
        bench(
            "--models",
            "ptb-lstm-small",
            "--np",
            "2",
            "--impls",
            "trainer,cycle1",
            "--variant",
            "cycle1=trainer HOROVOD_CYCLE_TIME=1",
            "--repeats",
            "1",
            "--steps",
            "2",
            "--warmup",
            "1",
            "--out",
            str(out),
        )
    )
    report = json.loads((out / "bench.json").read_text())
    assert report["impls"] == ["trainer", "cycle1"]
    (row,) = report["rows"]
    assert row["model"] == "ptb-lstm-small" and set(row["impls"]) == set(report["impls"])
    assert "trainer/cycle1" in proc.stdout
    # the variant ran the trainer with its own setting, the plain trainer with the default
    runs = out / "jobs"
    variant = json.loads((runs / "ptb-lstm-small-cycle1-np2-r0" / "metrics.json").read_text())
    plain = json.loads((runs / "ptb-lstm-small-trainer-np2-r0" / "metrics.json").read_text())
    assert variant["horovod_cycle_time_ms"] == 1.0 and plain["horovod_cycle_time_ms"] == 0.25
    assert variant["model"] == "ptb-lstm-small" and variant["batch_size"] == 20 and variant["workers"] == 2


def test_variant_parsing():
    known = ["trainer", "horovod", "ddp", "trainer-mpi", "trainer-ps"]
    v = parse_variant("fp16=trainer HOROVOD_CYCLE_TIME=1 OMPI_MCA_mpi_yield_when_idle=0 --compression fp16", known)
    assert (v.name, v.base) == ("fp16", "trainer")
    assert v.env == {"HOROVOD_CYCLE_TIME": "1", "OMPI_MCA_mpi_yield_when_idle": "0"}
    assert v.args == ["--compression", "fp16"]
    assert parse_variant("h1=horovod HOROVOD_CYCLE_TIME=1", known).env == {"HOROVOD_CYCLE_TIME": "1"}
    # after the first flag everything is a flag argument
    assert parse_variant("x=trainer --compression fp16 K=V", known).args == ["--compression", "fp16", "K=V"]
    for bad, says in (
        ("noequals", "NAME=BASE"),
        ("x=nosuch", "first word"),
        ("trainer=trainer", "taken"),
        ("x=ddp --threads 2", "only apply to the trainer"),
        ("x=trainer lower", "KEY=VALUE"),
    ):
        with pytest.raises(ValueError, match=says):
            parse_variant(bad, known)


def test_ratios_pair_jobs_of_the_same_round_and_efficiency_uses_one_rank():
    def job(impl, np, tag, sps):
        return {
            "impl": impl,
            "model": "lenet5",
            "np": np,
            "tag": tag,
            "samples_per_sec": sps,
            "loadavg_before": [1.0, 1.0, 1.0],
        }

    jobs = [
        job("trainer", 1, "r0", 100),
        job("ddp", 1, "r0", 100),
        job("trainer", 2, "r0", 180),
        job("ddp", 2, "r0", 150),
        job("trainer", 2, "r1", 90),
        job("ddp", 2, "r1", 100),
    ]  # a loaded round: both slow
    rows = summarise(jobs, BenchSpec(nps=[1, 2]), ["trainer", "ddp"])
    two = rows[1]
    assert two["ratios"]["trainer/ddp"]["median"] == pytest.approx((1.2 + 0.9) / 2)
    assert two["impls"]["trainer"]["median"] == 135 and two["efficiency"]["trainer"] == pytest.approx(135 / 200)
    assert "| lenet5 | 2 | 135 (90-180) | 125 (100-150) | 1.05 (0.90-1.20) |" in table(rows, ["trainer", "ddp"])


@pytest.mark.heavy
def test_bench_bad_input_is_one_line():
    proc = bench("--models", "nope")
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "--models: unknown model 'nope'" in lines[0], proc.stderr
