"""commbench-netns: the exchange alone over emulated links, beside the alpha-beta model."""

import json
import re
import subprocess
import sys

import pytest

from lab.commbench.netns import predicted_s
from lab.common import costmodel
from lab.emulation import netns

from helpers import ROOT, check, lab_in_process

TRAFFIC_RE = re.compile(r"(h\d+) (\d+)/(\d+)")


def run(*args, timeout=600):
    return subprocess.run(
        [sys.executable, "-m", "lab", "commbench-netns", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_the_model_is_the_bandwidth_term_of_each_pattern():
    net = costmodel.Network(0.0, 12.5e6)  # 100 Mbit/s
    mb = 1 << 20
    row = {"workers": 4, "bytes": 4 * mb, "servers": 0}
    assert predicted_s({**row, "impl": "mpi"}, net) == pytest.approx(2 * 3 / 4 * 4 * mb / 12.5e6)
    assert predicted_s({**row, "impl": "ps-sync-colocated"}, net) == predicted_s({**row, "impl": "ring-horovod"}, net)
    # one server's link carries N shards of S each way; two servers halve that
    assert predicted_s({**row, "impl": "ps-sync-dedicated", "servers": 1}, net) == pytest.approx(
        2 * 4 * 4 * mb / 12.5e6
    )
    assert predicted_s({**row, "impl": "ps-sync-dedicated", "servers": 2}, net) == pytest.approx(
        2 * 2 * 4 * mb / 12.5e6
    )


@pytest.mark.heavy
@pytest.mark.parametrize("args, needle", [(["--rates", "fast"], "--rates"), (["--hosts", "1"], "--hosts")])
def test_bad_input_is_one_line(capsys, args, needle):
    if args == ["--rates", "fast"]:  # the command as users run it
        proc = run(*args, timeout=60)
        code, err = proc.returncode, proc.stderr
    else:
        code, err = lab_in_process(capsys, "commbench-netns", *args)
    assert code == 2 and len(err.strip().splitlines()) == 1 and needle in err, err


@pytest.mark.mpi
def test_two_emulated_hosts_exchange_over_the_links_and_are_set_beside_the_model(tmp_path, namespaces_permitted):
    iters, warmup, size = 3, 1, 1 << 20
    proc = check(
        run(
            "--rates",
            "100mbit",
            "--hosts",
            "2",
            "--impls",
            "mpi,ps-colocated",
            "--sizes",
            "1M",
            "--iters",
            str(iters),
            "--warmup",
            str(warmup),
            "--out-dir",
            str(tmp_path),
        )
    )
    res = json.loads((tmp_path / "results.json").read_text())
    assert {r["impl"] for r in res["rows"]} == {"mpi", "ps-sync-colocated"} and not res["failures"]
    for r in res["rows"]:
        assert r["max_abs_err"] == 0 and r["workers"] == 2 and r["bytes"] == size  # the exact sum arrived
        assert r["predicted_s"] == pytest.approx(size / 12.5e6)  # 2(N-1)/N S/B with N = 2
        assert r["ratio"] == pytest.approx(r["measured_s"] / r["predicted_s"])
    # every exchange crossed the emulated links: each host sent and received at least half the
    # buffer per exchange (N = 2: half in the reduce, half in the gather), for both implementations
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("link traffic")]
    assert len(lines) == 1  # one job ran both implementations
    traffic = {h: (int(tx), int(rx)) for h, tx, rx in TRAFFIC_RE.findall(lines[0])}
    assert set(traffic) == {"h1", "h2"}
    least = 2 * (1 + warmup + iters) * size  # two implementations, a correctness exchange + warm-up + timed
    assert all(tx >= least and rx >= least for tx, rx in traffic.values()), (traffic, least)
    report = (tmp_path / "report.md").read_text()
    assert "## 100mbit per link" in report and "| 1 MB | mpi | 2 |" in report and "exact expected sum" in report
    assert netns.leftovers() == []
