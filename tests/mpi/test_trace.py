"""``--trace-steps`` under mpirun: every rank writes its own Chrome trace of the steps asked for, with each
phase once per step and each bucket's exchange once per step, inside its step, for every engine and concept."""

import json
from pathlib import Path

import pytest

from helpers import ENGINE_RUN, check, launch, run_args

pytestmark = pytest.mark.mpi

STEPS = range(3, 6)  # --trace-steps 3:6 of ENGINE_RUN's 12: its checkpoint after 5 steps falls in step 4
PHASES = ("data", "forward", "backward", "wait", "update")


def check_trace(run: Path, np: int, buckets: int | dict[int, int]) -> None:
    """Each rank's trace: its own pid, the traced steps only, every phase of each (data twice: the step's batch
    to the device, the next one gathered), the checkpoint in step 4 only, ``buckets`` bucket events per step
    (each bucket once; or by step, where steps differ) inside their step."""
    for rank in range(np):
        doc = json.loads((run / "trace" / f"rank{rank}.json").read_text())
        events = [e for e in doc["traceEvents"] if e["ph"] == "X"]
        assert {e["pid"] for e in events} == {rank}
        assert {e["args"]["step"] for e in events} == set(STEPS)
        for n in STEPS:
            mine = [e for e in events if e["args"]["step"] == n]
            names = [e["name"] for e in mine if e["cat"] == "phase"]
            assert [names.count(p) for p in PHASES] == [2, 1, 1, 1, 1], (rank, n, names)
            assert names.count("checkpoint") == (n == 4), (rank, n, names)
            (step,) = [e for e in mine if e["cat"] == "step"]
            sent = [e for e in mine if e["cat"] == "bucket"]
            expected = buckets[n] if isinstance(buckets, dict) else buckets
            assert sorted(e["args"]["bucket"] for e in sent) == list(range(expected)), (rank, n)
            for e in sent:
                assert step["ts"] <= e["ts"] and e["ts"] + e["dur"] <= step["ts"] + step["dur"] + 1e-3


def test_the_mpi_engines_job_traces_every_rank_s_phases_and_buckets(mpi_engine_run):
    """The mpi engine's shared job (tests/mpi/conftest.py) runs with --trace-steps 3:6: the trace costs this
    test no job of its own, and test_ring_engine's checks of that job show that tracing changes no result."""
    d = mpi_engine_run(2)
    metrics = json.loads((d / "mpi" / "metrics.json").read_text())
    check_trace(d / "mpi", 2, metrics["mpi_buckets"])
    assert metrics["mpi_buckets"] == 9


MPI_SMALL = ["--mpi-bucket-bytes", "3000"]  # LeNet-5 in several buckets
LENET5_TENSORS = 10  # Horovod's buckets in the trace: one allreduce_async_ per tensor


@pytest.mark.long
@pytest.mark.parametrize(
    ("name", "flags", "buckets"),
    [
        ("horovod", [], LENET5_TENSORS),
        ("torch", ["--allreduce-engine", "torch", "--torch-bucket-bytes", "3000"], "torch_buckets"),
        ("ps", ["--strategy", "ps", "--ps-placement", "colocated", "--ps-bucket-bytes", "3000"], "ps_buckets"),
        (
            "sharded",
            ["--strategy", "sharded", "--allreduce-engine", "mpi", "--mpi-bucket-bytes", "3000"],
            "shard_buckets",
        ),
        # every 2nd step (the 4th and 6th) synchronous: Horovod's one grouped allreduce of the gradients
        ("localsgd", ["--average-every", "2"], {3: 1, 4: 0, 5: 1}),
        ("diloco", ["--diloco-every", "2"], 0),  # no gradient leaves: the outer step sums the parameters' change
    ],
)
def test_every_engine_and_concept_traces_its_steps(tmp_path, name, flags, buckets):
    check(launch(2, ENGINE_RUN + flags + run_args(tmp_path, name, "--trace-steps", "3:6"), oversubscribe=True))
    if isinstance(buckets, str):  # the engine's own count, from metrics.json
        buckets = json.loads((tmp_path / name / "metrics.json").read_text())[buckets]
        assert buckets > 1
    check_trace(tmp_path / name, 2, buckets)
