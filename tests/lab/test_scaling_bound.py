"""The scaling grid's no-exchange bound: a bound job beside every strategy at every N, and each row
as a fraction of it (paired by repeat) in the rows, results.csv, TensorBoard and the HParams sessions."""

import math

import pytest

from lab.scaling.grid import BOUND, GridConfig, Job, trainer_args
from lab.scaling.report import CSV_FIELDS, aggregate, comparison_series, hparams_sessions
from lab.scaling.spec import variants


def rec(strategy, n, repeat, thr, ok=True):
    return {
        "model": "m",
        "strategy": strategy,
        "workers": n,
        "servers": 0,
        "world_size": n,
        "repeat": repeat,
        "ok": ok,
        "samples_per_sec": thr,
        "step_ms": 10.0,
        "comm_wait_ms": 1.0,
    }


RECORDS = [
    rec("allreduce", 2, 1, 150.0),
    rec("bound", 2, 1, 200.0),
    rec("allreduce", 2, 2, 60.0),
    rec("bound", 2, 2, 100.0),  # a loaded repeat: both slow
    rec("allreduce", 2, 3, 90.0),
    rec("bound", 2, 3, 0.0, ok=False),
]  # no bound to pair with


def test_each_row_is_a_fraction_of_the_bound_of_the_same_repeat():
    rows = {r["strategy"]: r for r in aggregate(RECORDS)}
    ring, bound = rows["allreduce"], rows["bound"]
    assert bound["samples_per_sec_mean"] == pytest.approx(150.0)
    assert ring["bound_samples_per_sec"] == pytest.approx(150.0)
    assert ring["of_bound"] == pytest.approx((0.75 + 0.6) / 2)  # repeat 3 has no bound job: left out
    assert bound["of_bound"] == pytest.approx(1.0)
    assert {"bound_samples_per_sec", "of_bound"} <= set(CSV_FIELDS)


def test_without_bound_jobs_the_fraction_is_unknown_not_zero():
    (row,) = aggregate([rec("allreduce", 2, 1, 150.0)])
    assert math.isnan(row["of_bound"]) and math.isnan(row["bound_samples_per_sec"])
    assert "scaling/of_bound/m" not in comparison_series([row], {}).get("allreduce", {})


def test_tensorboard_and_hparams_carry_the_fraction():
    rows = aggregate(RECORDS)
    assert comparison_series(rows, {})["allreduce"]["scaling/of_bound/m"] == [(2, pytest.approx(0.675))]
    sessions = {name: ms for name, _, ms in hparams_sessions({"rows": rows, "jobs": RECORDS})}
    assert sessions["m/allreduce-n2-r1"]["of_bound"] == pytest.approx(0.75)
    assert "of_bound" not in sessions["m/allreduce-n2-r3"]


def test_the_bound_job_is_the_trainer_with_nothing_exchanged():
    args = trainer_args(GridConfig(), Job("lenet5", BOUND, 2, 1), "/tmp/runs")
    assert args[args.index("--strategy") + 1] == "none" and BOUND.servers == 0


def test_every_grid_job_flushes_denormals_the_bound_as_the_exchanges():
    for variant in (BOUND, *variants().values()):
        assert "--flush-denormal" in trainer_args(GridConfig(), Job("ptb-lstm-small", variant, 2, 1), "/tmp/r")
