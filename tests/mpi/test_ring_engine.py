"""``--allreduce-engine mpi`` with real ranks under mpirun: the ring of mpi4py messages averages the
same gradients as Horovod and as one process with the whole global batch, at even and odd world
sizes, with buckets and ring chunks of uneven sizes (empty ones included)."""

import json

import pytest
import torch

from helpers import ENGINE_RUN, MPI_ENGINE, RANKS, ROOT, check, launch, load_params, rel_diff, run_args, run_single

pytestmark = pytest.mark.mpi


def same_on_every_rank(tmp_path, name, np):
    first = load_params(tmp_path / f"{name}-0.pt")
    for r in range(1, np):
        params = load_params(tmp_path / f"{name}-{r}.pt")
        for k in first:
            assert torch.equal(params[k], first[k]), f"{k} differs on rank {r}"
    return first


# 2 ranks in make test; 3 and 4 (odd chunks, empty ones) ~45 s more, in make test-long (CI runs both)
@pytest.mark.parametrize("np", [2, pytest.param(3, marks=pytest.mark.long), pytest.param(4, marks=pytest.mark.long)])
def test_mpi_engine_ends_where_horovod_and_one_process_end(tmp_path, mpi_engine_run, np):
    d = mpi_engine_run(np)  # tests/mpi/conftest.py: the mpi engine's job and one process, shared
    mine = same_on_every_rank(d, "mpi", np)  # bit-identical: every rank holds the same sums
    check(launch(np, ENGINE_RUN + run_args(tmp_path, "hvd"), oversubscribe=True))
    # Horovod too, with momentum and weight decay (tests/mpi/test_train.py runs it without): the same on
    # every rank and within 1e-5 of one process
    hvd = same_on_every_rank(tmp_path, "hvd", np)
    assert rel_diff(mine, hvd) <= 1e-5
    single = load_params(d / "one-0.pt")
    assert rel_diff(mine, single) <= 1e-5 and rel_diff(hvd, single) <= 1e-5
    m = json.loads((d / "mpi" / "metrics.json").read_text())
    assert (m["strategy"], m["allreduce_engine"], m["mpi_algorithm"]) == ("allreduce", "mpi", "ring")
    assert (m["workers"], m["global_batch"], m["mpi_buckets"]) == (np, 8 * np, 9)
    if np == 2:  # the control: training moved the parameters far more than the tolerance above
        check(run_single(ENGINE_RUN + run_args(tmp_path, "short", "--batch-size", "16", "--steps", "1")))
        assert rel_diff(load_params(tmp_path / "short-0.pt"), single) > 1e-2


def test_resume_continues_exactly_with_rank_0s_optimizer_state(tmp_path, mpi_engine_run):
    """The momentum saved by rank 0 reaches every rank at the restart: a cut run ends where an
    uncut one (tests/mpi/conftest.py's) does, bit for bit."""
    args = ENGINE_RUN + MPI_ENGINE
    check(launch(2, args + run_args(tmp_path, "cut", "--exit-after-steps", "5")))
    assert torch.load(tmp_path / "cut" / "checkpoint.pt", weights_only=True)["optimizer"]["state"]
    check(launch(2, args + run_args(tmp_path, "cut", "--resume", "auto")))
    full = load_params(mpi_engine_run(2) / "mpi-1.pt")
    resumed = same_on_every_rank(tmp_path, "cut", 2)
    for k in full:
        assert torch.equal(full[k], resumed[k]), k


@pytest.mark.parametrize("np", [2, 3, 4])
def test_every_rank_gets_the_average_of_every_ranks_gradient(np):
    """The exchange alone on a model with tensors of 1, 2, 5 and 1000 elements (chunks of none,
    one and many elements), buckets of 1 to 3 tensors, both algorithms, and fp16 on the wire: the
    rank program compares each rank's result with the average of all ranks' raw gradients."""
    proc = check(
        launch(
            np,
            ["--mpi-bucket-bytes", "24"],
            module="ring_rank",
            oversubscribe=True,
            env={"PYTHONPATH": f"{RANKS}:{ROOT}"},
        )
    )
    assert proc.stdout.count("ring_rank ok") == np, proc.stdout


@pytest.mark.parametrize(
    "args, needle",
    [
        (["--reduce-op", "adasum"], "--reduce-op adasum"),
        # (--compression fp16 with --mpi-algorithm iallreduce: refused by the config alike,
        # tests/unit/test_concepts_in_process.py)
        (["--mpi-bucket-bytes", "2"], "--mpi-bucket-bytes"),
    ],
)
def test_bad_config_one_line_nonzero_exit_no_hang(tmp_path, args, needle):
    proc = launch(
        2, ["--allreduce-engine", "mpi", "--dataset", "synthetic", "--run-dir", str(tmp_path), *args], timeout=90
    )
    assert proc.returncode != 0
    ours = [ln for ln in proc.stderr.splitlines() if ln.startswith("allreduce_train: error")]
    assert len(ours) == 1, proc.stderr
    assert needle in ours[0]
