"""--expect-hosts: rank 0 names every rank's host, and a job whose ranks landed on fewer hosts than
the launcher asked for stops at start with one line (the Open MPI 5 trap under Kubeflow: every rank
on the launcher pod, job Complete). Checked on emulated hosts (lab/emulation/netns.py): each namespace has
its own hostname, as a pod does.
"""

import os
import subprocess
import sys

import pytest

from allreduce_train.placement import by_host, check, describe

from helpers import ROOT

PLACEMENT_RUN = [
    "--dataset",
    "synthetic",
    "--synthetic-samples",
    "256",
    "--no-progress",
    "--batch-size",
    "16",
    "--no-tensorboard",
    "--stall-timeout",
    "60",
    "--allreduce-engine",
    "mpi",
]  # mpi4py: the placement check does not depend on the engine


def test_hosts_are_listed_with_their_ranks_in_rank_order():
    hosts = ["node-1", "node-1", "launcher", "node-1", "node-2"]
    assert by_host(hosts) == {"node-1": [0, 1, 3], "launcher": [2], "node-2": [4]}
    assert describe(hosts) == "3 hosts: node-1 (ranks 0-1,3), launcher (rank 2), node-2 (rank 4)"


def test_fewer_hosts_than_expected_is_an_error_naming_the_flag_and_the_hosts():
    assert check(["a", "b"], 2) is None and check(["a", "b", "c"], 2) is None and check(["a", "a"], 0) is None
    msg = check(["launcher", "launcher", "launcher", "launcher"], 2)
    assert msg is not None and msg.startswith("--expect-hosts 2: the 4 ranks run on 1 host: launcher (ranks 0-3)")
    assert "\n" not in msg


def launch_emulated(tmp_path, expect: int) -> subprocess.CompletedProcess:
    cmd = [
        sys.executable,
        "-m",
        "lab.emulation",
        "-np",
        "2",
        "--emulate-hosts",
        "2",
        "--",
        *PLACEMENT_RUN,
        "--steps",
        "2",
        "--run-dir",
        str(tmp_path),
        "--name",
        f"expect{expect}",
        "--expect-hosts",
        str(expect),
    ]
    return subprocess.run(
        cmd, cwd=ROOT, capture_output=True, text=True, timeout=240, env={**os.environ, "OMP_NUM_THREADS": "1"}
    )


@pytest.mark.mpi
def test_on_two_emulated_hosts_expecting_three_stops_with_one_line_and_expecting_two_trains(
    tmp_path, namespaces_permitted
):
    short = launch_emulated(tmp_path, 3)
    assert short.returncode != 0, short.stdout + short.stderr
    errors = [ln for ln in short.stderr.splitlines() if "error" in ln.lower()]
    assert errors == [
        "allreduce_train: error: --expect-hosts 3: the 2 ranks run on 2 hosts: h1 (rank 0), h2 (rank 1), "
        "not spread as the launcher asked; check the hostfile mpirun read (docs/kubernetes.md), "
        "or lower --expect-hosts"
    ], short.stderr
    assert "allreduce_train: ranks on 2 hosts: h1 (rank 0), h2 (rank 1)" in short.stderr
    assert not (tmp_path / "expect3" / "metrics.json").exists()  # it did not train
    enough = launch_emulated(tmp_path, 2)
    assert enough.returncode == 0, enough.stdout + enough.stderr
    assert "allreduce_train: ranks on 2 hosts: h1 (rank 0), h2 (rank 1)" in enough.stderr
    assert (tmp_path / "expect2" / "metrics.json").exists()
