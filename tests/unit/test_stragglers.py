"""The straggler rule over per-worker series of compute times, and its figures in one process."""

import json
import random
import socket
import statistics

import pytest

from allreduce_train.distributed.local import LocalExchange
from allreduce_train.errors import ConfigError
from allreduce_train.run_logger import RunLogger
from allreduce_train.stragglers import Straggler, StragglerRule, scan, slow_workers, window_median_ms
from allreduce_train.trainer import Trainer

from helpers import parse


def noisy(n_steps, ms=10.0, seed=0, spikes=0.05):
    """Compute seconds per step around ``ms``: +-20 % jitter and, on ``spikes`` of the steps, one step
    3-8x as long (a page fault, a garbage collection, another process on the core)."""
    rng = random.Random(seed)
    return [
        ms / 1e3 * rng.uniform(0.8, 1.2) * (rng.uniform(3, 8) if rng.random() < spikes else 1.0) for _ in range(n_steps)
    ]


def test_a_persistently_slow_worker_is_named_once_and_no_fast_one():
    series = [noisy(400, seed=w) for w in range(4)]
    series[2] = series[2][:150] + [2 * t for t in series[2][150:]]  # worker 2 twice as slow from step 150
    found = scan(series, factor=1.5, window=50, every=20)
    assert [s.rank for s in found] == [2]  # once, although every later check sees it again
    first = found[0]
    # slow for two windows, give or take a log interval each
    assert first.host == "host2" and 150 + 2 * 50 - 20 <= first.step <= 150 + 2 * (50 + 20)
    assert 150 - 20 <= first.since <= 150 + 20
    assert 1.5 <= first.ratio < 2.6 and first.others_ms == pytest.approx(10.0, rel=0.2)


def test_noise_and_bursts_shorter_than_the_window_name_nobody():
    series = [noisy(1000, seed=10 + w, spikes=0.1) for w in range(8)]
    # worker 5 is 4x as slow for 45 consecutive steps: most of some windows, but not for a window more
    burst = series[5][:500] + [4 * t for t in series[5][500:545]] + series[5][545:]
    assert scan(series[:5] + [burst] + series[6:], factor=1.5, window=50, every=10) == []
    # the same slowdown for 80 steps has lasted
    lasting = series[5][:500] + [4 * t for t in series[5][500:580]] + series[5][580:]
    assert [s.rank for s in scan(series[:5] + [lasting] + series[6:], factor=1.5, window=50, every=10)] == [5]


def test_two_workers_the_slow_one_is_named_and_the_fast_one_never():
    fast, slow = noisy(300, seed=1), [3 * t for t in noisy(300, seed=2)]
    for series, who in (([fast, slow], 1), ([slow, fast], 0)):
        assert [s.rank for s in scan(series, factor=1.5, window=30, every=10)] == [who]


def test_two_stragglers_among_many_are_each_named():
    series = [noisy(200, seed=w) for w in range(6)]
    series[1] = [2.5 * t for t in series[1]]
    series[4] = [3 * t for t in series[4]]
    assert sorted(s.rank for s in scan(series, factor=1.5, window=50, every=25)) == [1, 4]


def test_a_factor_of_zero_or_one_worker_names_nobody():
    series = [noisy(200, seed=w) for w in range(3)]
    series[0] = [5 * t for t in series[0]]
    assert scan(series, factor=0, window=50, every=10) == []
    assert slow_workers([100.0], 1.5) == []


def test_the_window_must_be_full_after_warm_up():
    assert window_median_ms([0.01] * 59, window=50, warmup=10) is None
    assert window_median_ms([1.0] * 10 + [0.01] * 50, window=50, warmup=10) == pytest.approx(10.0)
    # warm-up steps never reach the rule: here worker 1's first 40 steps are slow, as long as the
    # window and its persistence, which would name it if they counted
    series = [[0.01] * 40 + noisy(100, seed=w) for w in range(3)]
    series[1][:40] = [0.05] * 40
    assert [s.rank for s in scan(series, factor=1.5, window=20, every=10)] == [1]
    assert scan(series, factor=1.5, window=20, every=10, warmup=40) == []


def test_the_line_names_rank_host_and_figures():
    rule = StragglerRule(1.5, 50, ranks=[3, 4, 5], hosts=["a", "b", "c"])
    assert rule.check(100, [10.0, 30.0, 11.0]) == []  # slow in the window of steps 51-100 ...
    assert rule.check(130, [10.0, 29.0, 11.0]) == []
    assert rule.check(150, [10.0, 30.0, 11.0]) == [Straggler(4, "b", 51, 150, 30.0, 10.5)]  # ... and still
    assert rule.check(200, [10.0, 30.0, 11.0]) == []  # named once
    line = rule.found[0].line()
    assert line.startswith(
        "straggler: rank 4 on host b computes 30.0 ms per step, 2.86x the other ranks' median 10.5 ms"
    )
    assert "(slow since step 51, checked at step 150)" in line
    assert json.loads(json.dumps(rule.found[0].record()))["ratio"] == pytest.approx(30 / 10.5)


def test_a_check_that_is_not_slow_starts_the_count_again():
    rule = StragglerRule(1.5, 50, ranks=[0, 1], hosts=["a", "b"])
    for step, slow in ((100, 30.0), (140, 30.0), (160, 12.0), (200, 30.0), (240, 30.0)):
        assert rule.check(step, [10.0, slow]) == []
    assert [s.since for s in rule.check(250, [10.0, 30.0])] == [151]


@pytest.mark.parametrize(
    "args, needle",
    [
        (["--straggler-factor", "1"], "--straggler-factor must be > 1 (or 0 = off)"),
        (["--straggler-window", "0"], "--straggler-window must be >= 1"),
        (["--debug-slow-rank", "1"], "--debug-slow-rank '1': write RANK:FACTOR"),
        (["--debug-slow-rank", "x:2"], "--debug-slow-rank 'x:2': write RANK:FACTOR"),
        (["--debug-slow-rank", "1:0.5"], "--debug-slow-rank '1:0.5': write RANK:FACTOR"),
    ],
)
def test_bad_straggler_flags_are_named(args, needle):
    with pytest.raises(ConfigError, match=needle.replace("(", r"\(").replace(")", r"\)")):
        parse(args)


def test_debug_slow_rank_is_parsed():
    assert parse(["--debug-slow-rank", "2:3.5"]).train.debug_slow_rank == "2:3.5"


def test_the_others_median_from_one_sort_is_the_definitions():
    rng = random.Random(1)
    for _ in range(2000):
        figures = [rng.choice([1.0, 2.0, 3.0, rng.uniform(0, 5)]) for _ in range(rng.randint(2, 9))]
        by_definition = []
        for i, mine in enumerate(figures):
            others = statistics.median(figures[:i] + figures[i + 1 :])
            if others > 0 and mine >= 1.5 * others:
                by_definition.append((i, others))
        assert slow_workers(figures, 1.5) == by_definition, figures


@pytest.mark.heavy
def test_one_process_reports_its_rank_host_and_figures(tmp_path):
    cfg = parse(
        [
            "--model",
            "lenet5",
            "--dataset",
            "synthetic",
            "--synthetic-samples",
            "640",
            "--batch-size",
            "32",
            "--steps",
            "30",
            "--log-every",
            "5",
            "--straggler-window",
            "10",
            "--no-progress",
            "--threads",
            "1",
            "--debug-slow-rank",
            "0:2",
            "--run-dir",
            str(tmp_path),
        ]
    )
    trainer = Trainer(cfg, LocalExchange(), str(tmp_path / "run"))
    (tmp_path / "run").mkdir()
    setup = trainer.build()
    log = RunLogger(str(tmp_path / "run"), setup.total_steps, 0, tensorboard=False, progress=False)
    result = trainer.run(setup, log)
    log.close()
    [me] = result["ranks"]
    assert (me["rank"], me["host"]) == (0, socket.gethostname())
    assert me["wait_ms"] == result["comm_wait_ms"]  # the same steps' median, gathered through the exchange
    assert 0 < me["compute_ms"] <= result["step_ms"] * 1.01
    # one worker has no others to be compared with, however slow it is
    assert result["stragglers"] == [] and result["straggler_rule"] == {"factor": 1.5, "window": 10}
