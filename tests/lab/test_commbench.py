"""commbench: every implementation it times really sums the workers' inputs, identically."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from lab.commbench.exchanges import expected_sum, parse_size, rank_input, shard_bounds
from lab.commbench.main import timeline_phases

from helpers import ROOT, check

IMPLS = ("mpi", "ring-mpi", "ps-sync-colocated", "ring-horovod", "ring-horovod-fp16", "ps-sync-dedicated")


def test_parse_size_and_shards():
    assert parse_size("4K") == 4096 and parse_size("256M") == 256 << 20 and parse_size("10") == 8
    with pytest.raises(Exception, match="--sizes"):
        parse_size("four")
    assert shard_bounds(10, 3) == [0, 4, 7, 10]
    assert shard_bounds(2, 3) == [0, 1, 2, 2]


def test_inputs_differ_per_rank_and_are_exact_in_fp16():
    a, b = rank_input(0, 1000), rank_input(1, 1000)
    assert not np.array_equal(a, b)
    s = expected_sum(2, 1000)
    assert np.array_equal(s.astype(np.float16).astype(np.float32), s)


def test_timeline_phases_pairs_nested_begin_end_per_tensor(tmp_path):
    # Horovod writes the trace until shutdown: an unterminated array with a trailing comma is normal
    events = [
        {"name": "process_name", "ph": "M", "pid": 1, "args": {"name": "allreduce.t"}},
        {"ph": "B", "name": "NEGOTIATE_ALLREDUCE", "ts": 0, "pid": 1},
        {"ph": "E", "ts": 300, "pid": 1},
        {"ph": "B", "name": "ALLREDUCE", "ts": 400, "pid": 1},
        {"ph": "B", "name": "MPI_ALLREDUCE", "ts": 450, "pid": 1},
        {"ph": "B", "name": "NEGOTIATE_ALLREDUCE", "ts": 460, "pid": 2},  # another tensor, interleaved
        {"ph": "E", "ts": 1450, "pid": 1},
        {"ph": "E", "ts": 1500, "pid": 1},
        {"ph": "E", "ts": 560, "pid": 2},
    ]
    path = tmp_path / "timeline.json"
    path.write_text("[\n" + ",\n".join(json.dumps(e) for e in events) + ",\n")
    phases = timeline_phases(str(path))
    assert phases["MPI_ALLREDUCE"] == {"count": 1, "median_ms": 1.0}
    assert phases["ALLREDUCE"] == {"count": 1, "median_ms": 1.1}
    assert phases["NEGOTIATE_ALLREDUCE"] == {"count": 2, "median_ms": pytest.approx(0.2)}


@pytest.mark.long  # commbench end to end, every implementation (~14 s): make test-long, .ci/run
@pytest.mark.mpi
def test_two_workers_every_implementation_returns_the_same_sum(tmp_path):
    dump = tmp_path / "dump"
    cmd = [
        sys.executable,
        "-m",
        "lab",
        "commbench",
        "--np",
        "2",
        "--sizes",
        "4K,300K",
        "--models",
        "lenet5",
        "--iters",
        "3",
        "--horovod-cycle-ms",
        "",
        "--out-dir",
        str(tmp_path / "out"),
        "--dump-dir",
        str(dump),
    ]
    proc = check(
        subprocess.run(
            cmd, cwd=ROOT, capture_output=True, text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"}
        )
    )
    report = json.loads((tmp_path / "out" / "commbench.json").read_text())
    assert not report["failures"], proc.stdout
    assert report["memcpy_bandwidth_gbs"] > 0
    seen = {(r["impl"], r["workload"]) for r in report["results"]}
    for impl in IMPLS:
        for workload in ("4KB", "300KB", "lenet5"):
            assert (impl, workload) in seen, (impl, workload)
    for workload, n_elems in (("4KB", 1024), ("300KB", 76800)):
        want = expected_sum(2, n_elems)
        assert not np.array_equal(want, rank_input(0, n_elems))  # the peer's share is in it
        for impl in IMPLS:
            for w in (0, 1):
                got = np.load(dump / f"{impl}-{workload}-worker{w}.npy")
                assert np.array_equal(got, want), (impl, workload, w)
    # the model's tensor list: all implementations and both workers agree element for element
    ref = np.load(dump / "mpi-lenet5-worker0.npy")
    assert ref.size == 61706
    for impl in IMPLS:
        for w in (0, 1):
            assert np.array_equal(np.load(dump / f"{impl}-lenet5-worker{w}.npy"), ref), (impl, w)
    for r in report["results"]:
        assert r["max_abs_err"] == 0, r
        assert r["time_s"] > 0 and r["algbw_gbs"] > 0
        if r["impl"] in ("mpi", "ring-horovod"):  # nccl-tests: busbw = algbw * 2(N-1)/N = algbw at N=2
            assert r["busbw_gbs"] == pytest.approx(r["algbw_gbs"])
    assert "| lenet5 |" in (tmp_path / "out" / "commbench.md").read_text()


@pytest.mark.heavy
def test_bad_input_one_error_line(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "lab", "commbench", "--np", "2", "--impls", "nccl"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "commbench: error: --impls: unknown implementation 'nccl'; choose from: "
        "mpi, ring-mpi, ps-sync-colocated, ring-horovod, ring-horovod-fp16, ps-sync-dedicated"
    ]
