"""The scaling runner: aggregation by hand, and a tiny real grid end to end."""

import csv
import json
import math
import os
import subprocess
import sys

import pytest

from lab.common import costmodel
from lab.scaling.calibrate import choose_cycle
from lab.scaling.grid import available
from lab.scaling.report import aggregate
from lab.scaling.spec import GridConfig, variants

from helpers import ROOT, check


def rec(strategy, n, thr, ok=True):
    return {
        "model": "m",
        "strategy": strategy,
        "workers": n,
        "servers": 0,
        "world_size": n,
        "repeat": 1,
        "ok": ok,
        "samples_per_sec": thr,
        "step_ms": 10.0,
        "comm_wait_ms": 1.0,
    }


def test_aggregate_speedup_efficiency_and_spread_by_hand():
    rows = aggregate(
        [
            rec("ring-horovod", 1, 100.0),
            rec("ring-horovod", 1, 110.0),
            rec("ring-horovod", 2, 150.0),
            rec("ring-horovod", 2, 170.0),
            rec("ring-horovod", 2, 0.0, ok=False),
        ]
    )
    one, two = rows
    assert one["samples_per_sec_mean"] == pytest.approx(105.0)
    assert one["samples_per_sec_std"] == pytest.approx(math.sqrt(50.0))  # sample std of 100, 110
    assert one["speedup"] == pytest.approx(1.0) and one["efficiency"] == pytest.approx(1.0)
    assert one["speedup_std"] == 0  # the baseline against itself
    assert two["repeats"] == 2 and two["failed"] == 1
    assert two["speedup"] == pytest.approx(160.0 / 105.0)
    assert two["efficiency"] == pytest.approx(160.0 / 105.0 / 2)
    rel = math.hypot(math.sqrt(200.0) / 160.0, math.sqrt(50.0) / 105.0)
    assert two["speedup_std"] == pytest.approx(160.0 / 105.0 * rel)


def test_missing_models_are_skipped_with_a_note():
    vs, models, notes = available(GridConfig(models=["lenet5", "no-such-model"]))
    assert models == ["lenet5"]
    assert any("no-such-model" in n for n in notes)
    assert "ring-horovod" in [v.name for v in vs]


def test_choose_cycle_picks_the_fastest_over_the_sizes_all_configurations_measured():
    def row(job, size, t):
        return {"impl": "ring-horovod", "workload_kind": "size", "bytes": size, "time_s": t, "job": job}

    report = {
        "results": [
            row("default", 1, 1.0),
            row("default", 2, 1.0),
            row("cycle=0.2ms", 1, 0.5),
            row("cycle=0.2ms", 2, 1.5),
            row("cycle=5ms", 1, 2.0),
            row("cycle=5ms", 2, 2.0),
            row("cycle=5ms", 3, 1e-9),
        ]
    }
    assert choose_cycle(report) == (0.2, "cycle=0.2ms")  # geometric mean 0.87 < 1 < 2; size 3 not shared
    report["results"][2]["time_s"] = 0.8
    report["results"][3]["time_s"] = 1.3
    assert choose_cycle(report) == (None, "default")  # 1.04 > 1: Horovod's default stays


OLD_COMMBENCH = {"ring-horovod": "horovod", "ring-mpi": "mpi-ring"}
OLD_COMMBENCH.update({"ps-sync-colocated": "ps-colocated", "ps-sync-dedicated": "ps-dedicated"})


def fake_commbench(path, nets):
    """A commbench.json whose size sweep follows the cost model exactly for the given networks, written under
    commbench's older row names (horovod, mpi-ring, ps-colocated): the grid reads them as the new."""
    results = []
    for impl, kind, servers, job in (
        ("horovod", costmodel.ALLREDUCE, 0, "default"),
        ("mpi-ring", costmodel.ALLREDUCE, 0, "default"),
        ("ps-colocated", costmodel.PS_COLOCATED, 0, "default"),
        ("ps-dedicated", costmodel.PS_DEDICATED, 1, "K=1"),
    ):
        for size in (4096, 65536, 1 << 20, 16 << 20):
            t = costmodel.exchange_time(kind, 2, size, nets[impl], servers=max(1, servers))
            results.append(
                {
                    "impl": impl,
                    "workload": str(size),
                    "workload_kind": "size",
                    "bytes": size,
                    "workers": 2,
                    "servers": servers,
                    "time_s": t,
                    "job": job,
                }
            )
    path.write_text(json.dumps({"np": 2, "results": results, "failures": []}))


@pytest.mark.long  # the whole grid and its outputs (~55 s): make test-long, .ci/run
@pytest.mark.mpi
@pytest.mark.timeout(
    660
)  # 8 jobs (4 strategies x 2) take over 300 s at a load average of 15+; the grid's own limit is 600 s
def test_tiny_grid_writes_report_plot_csv_and_tensorboard(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    nets = {
        "horovod": costmodel.Network(200e-6, 2e9),
        "mpi-ring": costmodel.Network(100e-6, 3e9),
        "ps-colocated": costmodel.Network(20e-6, 4e9),
        "ps-dedicated": costmodel.Network(30e-6, 3e9),
    }
    fake_commbench(tmp_path / "cb.json", nets)
    out = tmp_path / "grid"
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
        "4",
        "--warmup-steps",
        "1",
        "--calibration",
        str(tmp_path / "cb.json"),
        "--out-dir",
        str(out),
    ]
    proc = check(
        subprocess.run(
            cmd, cwd=ROOT, capture_output=True, text=True, timeout=600, env={**os.environ, "OMP_NUM_THREADS": "1"}
        )
    )
    strategies = [v.name for v in available(GridConfig())[0]]
    assert "ring-horovod" in strategies

    with open(out / "results.csv") as fh:
        rows = list(csv.DictReader(fh))
    # every strategy, and the no-exchange bound beside them at every N
    assert {(r["strategy"], int(r["workers"])) for r in rows} == {
        (s, n) for s in [*strategies, "bound"] for n in (1, 2)
    }
    for r in rows:
        assert int(r["repeats"]) == 1 and float(r["samples_per_sec_mean"]) > 0, proc.stdout
        assert float(r["of_bound"]) > 0 and float(r["bound_samples_per_sec"]) > 0
        assert r["strategy"] == "bound" or float(r["predicted_samples_per_sec"]) > 0
    res = json.loads((out / "results.json").read_text())
    for s in strategies:  # the calibration read the sweep back
        impl = OLD_COMMBENCH[variants()[s].commbench_impl]
        assert res["calibration"][s]["alpha_s"] == pytest.approx(nets[impl].alpha, rel=1e-6)
        assert res["calibration"][s]["bandwidth_Bps"] == pytest.approx(nets[impl].bandwidth, rel=1e-6)
        assert [p["workers"] for p in res["curves"]["lenet5"][s]][-1] == 1024
    report = (out / "report.md").read_text()
    assert "speedup(N) = throughput(N) / throughput(1)" in report and "| ring-horovod | 2 |" in report
    assert "| ring-mpi | 2 |" in report and "concept x engine" in report  # the second engine, split out
    assert "Same engine (mpi4py), ring / colocated PS" in report and "Same concept (ring), Horovod / mpi4py" in report
    for png in ("scaling.png", "predicted.png"):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    # one TensorBoard run per job, with the trainer's own figures, outside the comparison
    for s in strategies:
        for n in (1, 2):
            ea = EventAccumulator(str(out / "jobs" / "lenet5" / f"{s}-n{n}-r1")).Reload()
            assert "perf/samples_per_sec" in ea.Tags()["scalars"], (s, n)
    # the comparison: one run per strategy, step = workers, the same tags in every run, plus the layout
    assert sorted(p.name for p in (out / "tensorboard").iterdir()) == sorted([*strategies, "bound"])
    by_key = {(r["strategy"], int(r["workers"])): r for r in rows}
    for s in strategies:
        ea = EventAccumulator(str(out / "tensorboard" / s), size_guidance={"tensors": 0}).Reload()
        for figure, column in (
            ("scaling/speedup", "speedup"),
            ("scaling/efficiency", "efficiency"),
            ("scaling/of_bound", "of_bound"),
            ("perf/samples_per_sec", "samples_per_sec_mean"),
        ):
            events = ea.Scalars(f"{figure}/lenet5")
            assert [e.step for e in events] == [1, 2]
            for e in events:
                assert e.value == pytest.approx(float(by_key[(s, e.step)][column]), rel=1e-4)
        assert ea.Scalars("scaling/speedup/lenet5")[0].value == pytest.approx(1.0)
        assert [e.step for e in ea.Scalars("scaling/predicted_efficiency/lenet5")][-1] == 1024
    # the layout is in the first run written (rows in name order: the bound's); TensorBoard merges every run's
    first = EventAccumulator(
        str(out / "tensorboard" / sorted([*strategies, "bound"])[0]), size_guidance={"tensors": 0}
    ).Reload()
    assert "custom_scalars__config__" in first.Tags()["tensors"]
    # one HParams session per job
    assert len(list((out / "hparams" / "lenet5").iterdir())) == 2 * (len(strategies) + 1)  # + the bound


def _row(strategy, n, step_ms, wait_ms, sps=100.0):
    return {
        "model": "lenet5",
        "strategy": strategy,
        "workers": n,
        "servers": 0,
        "repeats": 1,
        "samples_per_sec_mean": sps,
        "step_ms_mean": step_ms,
        "comm_wait_ms_mean": wait_ms,
    }


def test_without_a_one_worker_run_compute_comes_from_the_fewest_workers_and_the_report_says_so():
    from lab.scaling.calibrate import compute_times, known_network
    from lab.scaling.report import report_markdown
    from lab.scaling.spec import PLANS

    rows = [
        _row("ps-sync-colocated", 4, 30.0, 10.0),
        _row("ring-horovod", 4, 50.0, 20.0),
    ]  # the emulated grid: N=4 only
    compute, source = compute_times(rows, {"lenet5": PLANS["lenet5"]})
    assert compute == {"lenet5": pytest.approx(0.030)} and source == {
        "lenet5": "fewest-workers"
    }  # the ring-horovod row
    with_one = rows + [_row("ring-horovod", 1, 0.0, 2.0, sps=6400.0)]  # 64 samples per step -> 10 ms, minus 2 ms
    assert compute_times(with_one, {"lenet5": PLANS["lenet5"]}) == (
        {"lenet5": pytest.approx(0.008)},
        {"lenet5": "one-worker"},
    )

    net = costmodel.Network(0.0, 12.5e6)
    res = {
        "started": "now",
        "command": ["x"],
        "machine": {"cores": 2, "platform": "p"},
        "seconds": 60.0,
        "code": "abc",
        "config": {"data": "synthetic", "repeats": 1, "workers": [4], "horovod_cycle_ms": "auto"},
        "horovod_cycle": {"knob": "1 ms"},
        "loadavg": "1",
        "models": [],
        "plans": {},
        "gradient_bytes": {},
        "notes": [],
        "compute_s": compute,
        "compute_source": source,
        "calibration_source": "",
        "calibration": known_network(list(variants().values()), net, "the emulated links, 100mbit"),
        "curves": {},
        "out_dir": "o",
        "rows": [],
    }
    text = report_markdown(res)
    assert "Compute per step = the grid has no one-worker run" in text and "lenet5 30.0 ms." in text
    assert "Network: the emulated links, 100mbit (alpha 0.0 us, B 12.50 MB/s" in text
    assert "No calibration" not in text and ": ." not in text
    res.update(compute_s={}, compute_source={}, calibration={})
    text = report_markdown(res)
    assert "Compute per step: not known" in text and "No calibration" in text and ": ." not in text


def test_the_local_grid_prices_a_variant_with_its_method():
    from lab.common import costmodel, gradients
    from lab.scaling import calibrate, spec

    vs = spec.variants()
    net = costmodel.Network(alpha=50e-6, bandwidth=12.5e6)  # 100 Mbit/s
    size = sum(4 * _numel(s) for s in gradients.shapes("lenet5"))
    fp32 = calibrate._predict(vs["ring-mpi"], "lenet5", 4, size, 0.01, 64, net)
    fp16 = calibrate._predict(vs["ring-mpi-fp16"], "lenet5", 4, size, 0.01, 64, net)
    assert fp32 == costmodel.predict(costmodel.ALLREDUCE, 4, size, 0.01, 64, net)
    # half the bytes on the wire: the bandwidth term halves (the latency term and the casts come on top)
    assert fp16.exchange_s < 0.6 * fp32.exchange_s and fp16.step_s < fp32.step_s


def _numel(shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n
