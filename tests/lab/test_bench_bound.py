"""`bench`'s no-exchange bound: each implementation as a fraction of it, paired within a round."""

import argparse

import pytest

from lab.bench.loops import add_arguments
from lab.bench.main import BOUND, BenchSpec, default_impls, job_args, long_table, summarise, table


def job(impl, np, tag, sps):
    return {
        "impl": impl,
        "model": "lenet5",
        "np": np,
        "tag": tag,
        "samples_per_sec": sps,
        "loadavg_before": [1.0, 1.0, 1.0],
    }


JOBS = [
    job("trainer", 1, "r0", 100),
    job("ddp", 1, "r0", 100),
    job(BOUND, 1, "r0", 100),
    job("trainer", 2, "r0", 180),
    job("ddp", 2, "r0", 150),
    job(BOUND, 2, "r0", 200),
    job("trainer", 2, "r1", 90),
    job("ddp", 2, "r1", 100),
    job(BOUND, 2, "r1", 100),
]  # a loaded round


def test_the_bound_is_a_default_job_the_trainer_without_any_exchange():
    assert BOUND in default_impls()
    module, args = job_args(BOUND, "lenet5", BenchSpec(), "", "/tmp/r", "x")
    assert module == "allreduce_train" and args[args.index("--strategy") + 1] == "none"


def test_every_implementation_runs_with_denormals_flushed():
    # the bound's LSTM ranks, each on its own gradient, reach denormal floats and ran 6x slower per step
    for impl in default_impls():
        _, args = job_args(impl, "ptb-lstm-small", BenchSpec(), "/tmp/r.json", "/tmp/r", "x")
        assert "--flush-denormal" in args, impl
    p = argparse.ArgumentParser()
    add_arguments(p)  # the bare loops' ranks take the flag the trainer takes
    assert p.parse_args(["--impl", "ddp", "--flush-denormal"]).flush_denormal


def test_fractions_of_the_bound_pair_jobs_of_the_same_round_beside_efficiency():
    impls = ["trainer", "ddp", BOUND]
    two = summarise(JOBS, BenchSpec(nps=[1, 2]), impls)[1]
    # trainer: 180/200 and 90/100 -> 0.9 both rounds; ddp: 0.75 and 1.0
    assert two["of_bound"]["trainer"]["median"] == pytest.approx(0.9)
    assert two["of_bound"]["ddp"] == pytest.approx({"median": 0.875, "min": 0.75, "max": 1.0})
    assert BOUND not in two["of_bound"] and f"trainer/{BOUND}" not in two["ratios"]
    # the classic efficiency stays: median throughput / (N x one rank's)
    assert two["efficiency"]["trainer"] == pytest.approx(135 / 200)
    assert two["efficiency"][BOUND] == pytest.approx(150 / 200)  # what sharing the machine alone costs


def test_tables_show_the_bound_and_each_fraction():
    impls = ["trainer", "ddp", BOUND]
    rows = summarise(JOBS, BenchSpec(nps=[1, 2]), impls)
    wide = table(rows, impls)
    assert "| trainer/ddp | trainer/bound | ddp/bound |" in wide.splitlines()[0]
    assert "| 0.90 (0.90-0.90) | 0.88 (0.75-1.00) |" in wide
    long = long_table(rows, impls)
    assert "| lenet5 | 2 | ddp | 125 (100-150) | 1.05 (0.90-1.20) | 0.88 (0.75-1.00) | 0.62 | - |" in long
    assert "| lenet5 | 2 | bound | 150 (100-200) | - | 1 | 0.75 | - |" in long
