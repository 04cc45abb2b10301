"""Real ranks under mpirun: the communication-reduction concepts (docs/concepts.md) hold only if the
ranks really exchanged what the concept sends."""

import json

import pytest
import torch

from helpers import SHARED_RUN, check, launch, load_params, rel_diff, run_args

pytestmark = pytest.mark.mpi

# SHARED_RUN: tests/mpi/conftest.py's shared run (20 steps, a checkpoint every 7); its sync_run is the reference,
# and each concept's job differs from it only in the concept's flags
PS_FP16 = ["--strategy", "ps", "--ps-placement", "colocated", "--compression", "fp16"]


@pytest.fixture(scope="module")
def float32_params(one_process_run):
    """Where float32 training ends: one process at the double batch (2 ranks end within 1e-5 of it,
    tests/mpi/test_train.py)."""
    return load_params(one_process_run / "one-0.pt")


@pytest.fixture(scope="module")
def ps_fp16_dir(tmp_path_factory):
    """A colocated PS job with fp16 pushes and pulls, run to the end (shared by two tests)."""
    d = tmp_path_factory.mktemp("psfp16")
    check(launch(2, SHARED_RUN + PS_FP16 + run_args(d, "full", "--batch-size", "16")))
    return d


def same_on_every_rank(d, name):
    r0, r1 = load_params(d / f"{name}-0.pt"), load_params(d / f"{name}-1.pt")
    for k in r0:
        assert torch.equal(r0[k], r1[k]), f"{name}: {k} differs between ranks"
    return r0


@pytest.mark.parametrize(
    "flags, tol",
    [
        (["--compression", "fp16"], 1e-2),  # Horovod's Compression.fp16
        (["--allreduce-engine", "mpi", "--compression", "bf16"], 5e-2),  # the mpi4py ring sums bfloat16
        (None, 1e-2),  # the parameter server: fp16 pushes and pulls, float32 master parameters on the servers
    ],
)
def test_16_bit_on_the_wire_ends_near_float32_but_not_on_it_and_alike_on_every_rank(
    tmp_path, float32_params, ps_fp16_dir, flags, tol
):
    if flags is None:
        d, name = ps_fp16_dir, "full"
    else:
        d, name = tmp_path, "w16"
        check(launch(2, SHARED_RUN + flags + run_args(d, name, "--batch-size", "16")))
    got = same_on_every_rank(d, name)
    # the rounding to 16 bits happened (a float32 exchange ends within 1e-5 of the reference) ...
    assert rel_diff(got, float32_params) > 1e-5
    # ... and the gradients were still averaged: each rank alone would be far off (test_train's control)
    assert rel_diff(got, float32_params) < tol


@pytest.mark.long  # make test under 20 min: the long tier (CI runs it)
def test_ps_with_16_bit_pulls_resumes_exactly_from_the_servers_master_parameters(tmp_path, ps_fp16_dir):
    args = SHARED_RUN + PS_FP16 + ["--batch-size", "16"]
    check(launch(2, args + run_args(tmp_path, "cut", "--exit-after-steps", "9")))
    saved = torch.load(tmp_path / "cut" / "checkpoint.pt", weights_only=True)
    assert saved["step"] == 9
    # the checkpoint holds float32 master parameters, not the workers' fp16-rounded copies
    assert any(not torch.equal(v, v.half().float()) for v in saved["model"].values())
    check(launch(2, args + run_args(tmp_path, "cut", "--resume", "auto")))
    full, resumed = load_params(ps_fp16_dir / "full-0.pt"), same_on_every_rank(tmp_path, "cut")
    for k in full:
        assert torch.equal(full[k], resumed[k]), k
    assert json.loads((tmp_path / "cut" / "metrics.json").read_text())["steps"] == 20


@pytest.fixture(scope="module")
def local4_dir(tmp_path_factory):
    """Local SGD with H=4 on the mpi4py ring, run to the end (20 steps: the last one averages)."""
    d = tmp_path_factory.mktemp("local4")
    check(launch(2, SHARED_RUN + LOCAL4 + run_args(d, "full", "--batch-size", "16")))
    return d


LOCAL4 = ["--allreduce-engine", "mpi", "--average-every", "4"]


def test_local_sgd_with_h_1_is_synchronous_sgd_bit_for_bit(tmp_path, sync_run):
    """Through local SGD's path (Horovod without its DistributedOptimizer: one grouped allreduce of a
    synchronous step's gradients, after backward) the run ends on the ordinary path's parameters."""
    check(launch(2, SHARED_RUN + run_args(tmp_path, "h1", "--batch-size", "16", "--average-every", "1")))
    got, want = same_on_every_rank(tmp_path, "h1"), load_params(sync_run / "sync-0.pt")
    for k in want:
        assert torch.equal(got[k], want[k]), k


def test_local_sgd_with_h_4_averages_parameters_but_is_not_synchronous_sgd(local4_dir, sync_run):
    got = same_on_every_rank(local4_dir, "full")  # identical only because the last step averaged them
    assert rel_diff(got, load_params(sync_run / "sync-0.pt")) > 1e-4  # the local steps left their mark


def test_local_sgd_resumes_exactly_mid_period_with_every_workers_own_state(tmp_path, local4_dir):
    args = SHARED_RUN + LOCAL4 + ["--batch-size", "16"]
    check(launch(2, args + run_args(tmp_path, "cut", "--exit-after-steps", "9")))  # 9 = one step into a period
    saved = torch.load(tmp_path / "cut" / "checkpoint.pt", weights_only=True)
    own = [w["local_sgd"]["params"] for w in saved["workers"]]
    assert any(not torch.equal(a, b) for a, b in zip(*own, strict=True)), "mid-period the workers' parameters differ"
    check(launch(2, args + run_args(tmp_path, "cut", "--resume", "auto")))
    full, resumed = load_params(local4_dir / "full-0.pt"), same_on_every_rank(tmp_path, "cut")
    for k in full:
        assert torch.equal(full[k], resumed[k]), k


PSGD = ["--compression", "powersgd", "--powersgd-rank", "2"]


@pytest.fixture(scope="module")
def powersgd_mpi_dir(tmp_path_factory):
    """PowerSGD over the mpi engine, run to the end (shared by two tests)."""
    d = tmp_path_factory.mktemp("psgd")
    check(launch(2, SHARED_RUN + PSGD + run_args(d, "full", "--batch-size", "16", "--allreduce-engine", "mpi")))
    return d


@pytest.mark.parametrize("engine", ["horovod", "mpi"])
def test_powersgd_ends_alike_on_every_rank_and_away_from_exact_averaging(tmp_path, sync_run, powersgd_mpi_dir, engine):
    if engine == "mpi":
        d = powersgd_mpi_dir
    else:
        d = tmp_path
        check(launch(2, SHARED_RUN + PSGD + run_args(d, "full", "--batch-size", "16")))
    got = same_on_every_rank(d, "full")  # identical: every rank applied the same low-rank average
    assert rel_diff(got, load_params(sync_run / "sync-0.pt")) > 1e-4  # rank-2 factors, not the gradients


def test_powersgd_resumes_exactly_with_every_workers_error_feedback_and_qs(tmp_path, powersgd_mpi_dir):
    args = SHARED_RUN + PSGD + ["--batch-size", "16", "--allreduce-engine", "mpi"]
    check(launch(2, args + run_args(tmp_path, "cut", "--exit-after-steps", "9")))
    saved = torch.load(tmp_path / "cut" / "checkpoint.pt", weights_only=True)
    errors = [w["exchange"]["error"] for w in saved["workers"]]
    assert any(not torch.equal(a, b) for a, b in zip(*errors, strict=True)), "each worker keeps its own error"
    check(launch(2, args + run_args(tmp_path, "cut", "--resume", "auto")))
    full, resumed = load_params(powersgd_mpi_dir / "full-0.pt"), same_on_every_rank(tmp_path, "cut")
    for k in full:
        assert torch.equal(full[k], resumed[k]), k
