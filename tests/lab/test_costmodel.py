"""The alpha-beta cost model: formulas against hand-computed values, edge cases, monotonicity, fit."""

import math

import pytest

from lab.common.costmodel import (
    ALLREDUCE,
    PS_COLOCATED,
    PS_DEDICATED,
    Network,
    bus_factor,
    exchange_time,
    fit_alpha_beta,
    predict,
)

NET = Network(alpha=10e-6, bandwidth=1e9)  # 10 us, 1 GB/s
MB = 1e6


def test_ring_allreduce_by_hand():
    # N=4, S=8 MB: 2*3*10us + 2*3/4 * 8e6/1e9 = 60us + 12 ms
    assert exchange_time(ALLREDUCE, 4, 8 * MB, NET) == pytest.approx(60e-6 + 12e-3)


def test_dedicated_ps_by_hand():
    # K=1, N=4: each of push and pull is bounded by the server link carrying 4 x 8 MB
    assert exchange_time(PS_DEDICATED, 4, 8 * MB, NET, servers=1) == pytest.approx(2 * 4 * 10e-6 + 2 * 32e-3)
    # K=8 servers for N=4 workers: the workers' links (S each way) are the bottleneck now
    assert exchange_time(PS_DEDICATED, 4, 8 * MB, NET, servers=8) == pytest.approx(2 * 8 * 10e-6 + 2 * 8e-3)


def test_colocated_ps_by_hand_matches_ring():
    # N=8, S=1 MB: 2*7*10us + 2*7/8 * 1 ms
    expected = 140e-6 + 1.75e-3
    assert exchange_time(PS_COLOCATED, 8, 1 * MB, NET) == pytest.approx(expected)
    assert exchange_time(ALLREDUCE, 8, 1 * MB, NET) == pytest.approx(expected)


def test_one_worker_exchanges_nothing_except_with_a_dedicated_server():
    assert exchange_time(ALLREDUCE, 1, 8 * MB, NET) == 0
    assert exchange_time(PS_COLOCATED, 1, 8 * MB, NET) == 0
    # a dedicated server is another process: push and pull still cross a link
    assert exchange_time(PS_DEDICATED, 1, 8 * MB, NET, servers=1) == pytest.approx(2 * 10e-6 + 2 * 8e-3)
    p = predict(ALLREDUCE, 1, 8 * MB, compute_s=0.05, batch=64, net=NET)
    assert p.step_s == pytest.approx(0.05)
    assert p.samples_per_sec == pytest.approx(64 / 0.05)
    assert p.speedup == pytest.approx(1.0) and p.efficiency == pytest.approx(1.0)


def test_bus_factor_is_nccl_tests_for_allreduce():
    assert bus_factor(ALLREDUCE, 2) == pytest.approx(1.0)
    assert bus_factor(ALLREDUCE, 8) == pytest.approx(2 * 7 / 8)
    assert bus_factor(PS_DEDICATED, 4, servers=1) == pytest.approx(8.0)


def test_monotone_in_workers_and_bytes():
    for kind in (ALLREDUCE, PS_DEDICATED, PS_COLOCATED):
        times = [exchange_time(kind, n, 4 * MB, NET) for n in (1, 2, 4, 8, 64, 1024)]
        assert times == sorted(times) and times[0] < times[-1], kind
        sizes = [exchange_time(kind, 8, s, NET) for s in (4e3, 4e4, 4e5, 4e6, 4e8)]
        assert sizes == sorted(sizes) and sizes[0] < sizes[-1], kind
        # throughput still grows with workers, efficiency falls
        preds = [predict(kind, n, 4 * MB, 0.02, 64, NET) for n in (1, 2, 4, 8, 64, 1024)]
        effs = [p.efficiency for p in preds]
        assert effs == sorted(effs, reverse=True), kind


def test_dedicated_ps_is_worse_than_ring_at_scale_and_more_servers_help():
    n, s = 64, 100 * MB
    ring = exchange_time(ALLREDUCE, n, s, NET)
    assert exchange_time(PS_DEDICATED, n, s, NET, servers=1) > 10 * ring
    assert exchange_time(PS_DEDICATED, n, s, NET, servers=8) < exchange_time(PS_DEDICATED, n, s, NET, servers=1)


def test_fit_recovers_alpha_and_bandwidth():
    true = Network(alpha=25e-6, bandwidth=3e9)
    for kind, n, k in ((ALLREDUCE, 2, 1), (ALLREDUCE, 4, 1), (PS_DEDICATED, 2, 1), (PS_COLOCATED, 3, 1)):
        points = [(s, exchange_time(kind, n, s, true, servers=k)) for s in (4e3, 64e3, 1e6, 16e6, 256e6)]
        fit = fit_alpha_beta(kind, n, points, servers=k)
        assert fit.alpha == pytest.approx(true.alpha, rel=1e-6), kind
        assert fit.bandwidth == pytest.approx(true.bandwidth, rel=1e-6), kind


def test_fit_clamps_negative_latency_and_rejects_one_worker():
    # times exactly proportional to size, minus a little: the unconstrained alpha is negative
    points = [(s, s / 1e9 - 1e-6) for s in (1e5, 1e6, 1e7)]  # N=2: time = S/B
    fit = fit_alpha_beta(ALLREDUCE, 2, points)
    assert fit.alpha == 0 and 0.9e9 < fit.bandwidth < 1.1e9
    with pytest.raises(ValueError, match="at least 2 workers"):
        fit_alpha_beta(ALLREDUCE, 1, [(1e6, 1e-3)])


def test_bad_arguments():
    with pytest.raises(ValueError, match="workers"):
        exchange_time(ALLREDUCE, 0, MB, NET)
    with pytest.raises(ValueError, match="servers"):
        exchange_time(PS_DEDICATED, 2, MB, NET, servers=0)
    with pytest.raises(ValueError, match="unknown exchange"):
        exchange_time("gossip", 2, MB, NET)
    with pytest.raises(ValueError, match="bandwidth"):
        Network(alpha=0, bandwidth=0)
    net = Network.from_gbit_us(10, 50)
    assert net.bandwidth == pytest.approx(1.25e9) and net.alpha == pytest.approx(50e-6)
    assert math.isfinite(predict(PS_DEDICATED, 1024, MB, 0.01, 32, net, servers=4).samples_per_sec)
