"""Elastic shrink on the emulated cluster: a host whose namespace disappears ends the job, and with
``--min-np`` the launcher restarts it on the hosts that remain, from the checkpoint."""

import json
import os
import time

import pytest

from lab.emulation import netns

from helpers import Job

pytestmark = pytest.mark.mpi

QUICK = ["--dataset", "synthetic", "--synthetic-samples", "2048", "--no-progress", "--log-every", "5",
         "--warmup-steps", "0", "--lr", "0.05", "--batch-size", "16"]


@pytest.fixture(scope="module")
def namespaces_permitted():
    reason = netns.unavailable_reason()
    if reason:
        pytest.skip(reason)


@pytest.mark.timeout(900)  # two jobs on emulated hosts: slow on a loaded machine
def test_a_lost_host_shrinks_the_job_onto_the_remaining_ones(tmp_path, namespaces_permitted):
    args = QUICK + ["--run-dir", str(tmp_path), "--name", "el", "--steps", "300", "--checkpoint-every", "10"]
    job = Job(2, args, f"{os.getpid()}-elastic", launcher=["--emulate-hosts", "2", "--link-rate", "1gbit",
                                                            "--max-restarts", "1", "--min-np", "1"])
    prefix = f"art-{job.proc.pid}-0"
    try:
        deadline = time.monotonic() + 240
        while not (tmp_path / "el" / "checkpoint.pt").exists():
            assert job.proc.poll() is None and time.monotonic() < deadline, job.text()
            time.sleep(0.1)
        netns.remove([f"{prefix}-h2"], grace=1.0)  # host h2 is gone: its processes, its link, its namespace
        rc = job.finish(timeout=600)
    finally:
        job.kill_leftovers()
    err, out = "".join(job.err), "".join(job.out)
    assert rc == 0, job.text()
    assert "elastic: host(s) h2 lost; continuing on 1 host(s): world size 2 -> 1" in err, job.text()
    # the trainer says what the smaller world changes (LR scaled by the workers: --scale-lr is on)
    assert "elastic: resumed with 1 workers from a checkpoint of 2: global batch 32 -> 16, LR 0.1 -> 0.05" in out, job.text()
    metrics = json.loads((tmp_path / "el" / "metrics.json").read_text())
    assert (metrics["world_size"], metrics["steps"]) == (1, 300)
    assert not any(n.startswith(prefix + "-") for n in netns.list_namespaces())
