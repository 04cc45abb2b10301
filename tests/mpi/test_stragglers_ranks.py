"""A rank slowed on purpose (``--debug-slow-rank``) is named, with its host, by every engine: in one
log line, in metrics.json and in TensorBoard; its peers' wait grows by what it computes more, which
holds only if the ranks really exchanged every step."""

import json
import socket

import pytest

from helpers import check, launch

pytestmark = pytest.mark.mpi

# 120 steps of LeNet-5 on small batches; the rule checks every 10 steps over the last 30 once the
# 10 warm-up steps are past, so from step 40 on.
STRAGGLER_RUN = [
    "--dataset",
    "synthetic",
    "--synthetic-samples",
    "2048",
    "--no-progress",
    "--batch-size",
    "32",
    "--steps",
    "120",
    "--log-every",
    "10",
    "--straggler-window",
    "30",
    "--eval-every",
    "120",
]


def tb_texts(run_dir, tag):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir)).Reload()
    return [t.decode() for e in acc.Tensors(f"{tag}/text_summary") for t in e.tensor_proto.string_val]


@pytest.mark.parametrize(
    "np, slow, engine",
    [
        (3, 2, []),  # Horovod, the last rank
        (2, 0, ["--allreduce-engine", "mpi"]),  # the mpi4py ring, rank 0 itself (the one that logs)
        # rank 0 serves: worker 0 is rank 1 (the long tier: make test under 20 min; CI runs it)
        pytest.param(3, 1, ["--strategy", "ps", "--ps-placement", "dedicated"], marks=pytest.mark.long),
    ],
    ids=["horovod", "mpi-ring", "ps-dedicated"],
)
def test_a_slowed_rank_is_named_once_with_its_host(tmp_path, np, slow, engine):
    proc = check(
        launch(
            np,
            STRAGGLER_RUN + engine + ["--debug-slow-rank", f"{slow}:6", "--run-dir", str(tmp_path), "--name", "slow"],
            oversubscribe=np > 2,
        )
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("straggler:")]
    assert len(lines) == 1, proc.stdout
    assert lines[0].startswith(f"straggler: rank {slow} on host {socket.gethostname()} computes "), lines[0]

    m = json.loads((tmp_path / "slow" / "metrics.json").read_text())
    [found] = m["stragglers"]
    assert (found["rank"], found["host"]) == (slow, socket.gethostname()) and found["ratio"] >= 1.5
    ranks = {r["rank"]: r for r in m["ranks"]}
    workers = sorted(ranks)
    assert workers == list(range(np - 2, np) if "ps" in engine else range(np))  # a dedicated server is no worker
    for r in workers:
        if r != slow:
            # the straggler's extra compute is spent waiting by every other worker, not computing
            assert ranks[r]["compute_ms"] < ranks[slow]["compute_ms"] / 1.5, m["ranks"]
            assert ranks[r]["wait_ms"] > ranks[slow]["wait_ms"] + 0.5 * ranks[r]["compute_ms"], m["ranks"]

    assert tb_texts(tmp_path / "slow", "perf/straggler") == lines
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    tags = EventAccumulator(str(tmp_path / "slow")).Reload().Tags()["scalars"]
    assert {f"perf/{f}_ms/rank{r}" for f in ("compute", "wait") for r in workers} <= set(tags)


def test_a_rank_that_does_not_exist_or_only_serves_is_refused(tmp_path):
    for np, extra, needle in (
        (2, ["--allreduce-engine", "mpi"], "--debug-slow-rank 5:2: there is no rank 5 (ranks 0-1)"),
        (3, ["--strategy", "ps"], "--debug-slow-rank 0:2: rank 0 only serves"),
    ):
        slow = "5:2" if np == 2 else "0:2"
        proc = launch(
            np,
            STRAGGLER_RUN + extra + ["--debug-slow-rank", slow, "--run-dir", str(tmp_path)],
            oversubscribe=np > 2,
            timeout=120,
        )
        assert proc.returncode == 2, proc.stdout + proc.stderr
        errors = [ln for ln in proc.stderr.splitlines() if "error:" in ln]
        assert len(errors) == 1 and needle in errors[0], proc.stderr
