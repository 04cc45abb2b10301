"""Stragglers on the emulated cluster (lab/emulation/netns.py): a rank slowed in its computation is named with
its host; a rank slowed by its host's link is not -- that shows as every rank's wait, not as compute.

Each test skips, with the reason, where namespaces cannot be built, and checks that nothing it
created is left behind.
"""

import json
import re
import subprocess

import pytest

from lab.emulation import netns
from models import MODELS

from helpers import Job

pytestmark = pytest.mark.mpi

STRAGGLER_RUN = [
    "--dataset",
    "synthetic",
    "--synthetic-samples",
    "2048",
    "--no-progress",
    "--batch-size",
    "32",
    "--eval-every",
    "1000",
    "--threads",
    "1",
]
SLOW_LINK = "1mbit"  # LeNet-5's gradients take ~2 s each way: longer than a step's computation, even on a busy host


def run(tmp_path, name, args, on_start=None):
    """Train on 2 emulated hosts at 1 Gbit/s; ``on_start(prefix)`` runs as soon as the hosts exist,
    before the ranks start. Returns (stdout, metrics.json)."""
    job = Job(
        2,
        STRAGGLER_RUN + args + ["--run-dir", str(tmp_path), "--name", name],
        f"straggler-{name}",
        launcher=["--emulate-hosts", "2", "--link-rate", "1gbit"],
    )
    try:
        job.wait_for("emulated cluster art-", timeout=60)
        found = re.search(r"emulated cluster (art-\d+-\d+):", "".join(job.out))
        assert found is not None  # wait_for saw the line
        prefix = found.group(1)
        if on_start:
            on_start(prefix)
        assert job.finish(timeout=240) == 0, job.text()
    finally:
        job.kill_leftovers()
    assert not any(n.startswith(prefix + "-") for n in netns.list_namespaces()), "emulated hosts left behind"
    return "".join(job.out), json.loads((tmp_path / name / "metrics.json").read_text())


def test_a_rank_slowed_in_its_computation_is_named_with_its_emulated_host(tmp_path, namespaces_permitted):
    # the rule checks every 10 steps over the last 20, once the 10 warm-up steps are past
    out, m = run(
        tmp_path,
        "slow-rank",
        ["--steps", "80", "--log-every", "10", "--straggler-window", "20", "--debug-slow-rank", "1:6"],
    )
    lines = [ln for ln in out.splitlines() if ln.startswith("straggler:")]
    assert len(lines) == 1 and lines[0].startswith("straggler: rank 1 on host h2 computes "), out
    assert [(s["rank"], s["host"]) for s in m["stragglers"]] == [(1, "h2")]
    assert [(r["rank"], r["host"]) for r in m["ranks"]] == [(0, "h1"), (1, "h2")]


def test_a_rank_slowed_by_its_link_shows_as_every_ranks_wait_and_is_not_named(tmp_path, namespaces_permitted):
    def slow_link(prefix):
        # h2's upload (its end of the veth) and download (the switch's port): SLOW_LINK instead of 1 Gbit/s
        tbf = netns.tbf(netns.parse_rate(SLOW_LINK))
        for ns, dev in ((f"{prefix}-h2", netns.HOST_IFACE), (f"{prefix}-head", "h2")):
            subprocess.run(["tc", "-n", ns, "qdisc", "replace", "dev", dev, "root", *tbf], check=True, timeout=30)

    # the rule checks every 2 steps from step 8 over the last 6, and could name a rank from step 14
    out, m = run(
        tmp_path,
        "slow-link",
        ["--steps", "16", "--log-every", "2", "--straggler-window", "6", "--perf-warmup-steps", "2"],
        on_start=slow_link,
    )
    assert not any(ln.startswith("straggler:") for ln in out.splitlines()), out
    assert m["stragglers"] == []
    # Every step moves the gradients across h2's link once each way, which at SLOW_LINK takes link_ms:
    # that time is in both ranks' wait, h1's as much as h2's, and in neither rank's compute.
    grad_bytes = 4 * sum(p.numel() for p in MODELS["lenet5"].build().parameters())
    link_ms = 1e3 * 8 * grad_bytes / netns.parse_rate(SLOW_LINK)
    assert [r["host"] for r in m["ranks"]] == ["h1", "h2"]
    for r in m["ranks"]:
        assert r["wait_ms"] > 0.5 * link_ms > r["compute_ms"], (link_ms, m["ranks"])
