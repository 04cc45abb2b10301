"""BatchNorm's running statistics with real ranks (a small convolutional net with BatchNorm 2-d and 1-d,
tests/helpers.py's userpkg.net:bn): after the evaluations the buffers are the same on every rank and
are the mean of what each rank tracks on its own, under Horovod and the dedicated parameter server (whose
main worker is rank 1); ``--sync-batchnorm`` makes 2 ranks x batch 8 one process with batch 16."""

import os
import subprocess
import sys

import pytest
import torch

from helpers import ROOT, check, launch, load_params, rel_diff, run_args, write_user_package

pytestmark = pytest.mark.mpi

# 12 steps, evaluations at 6 and 12, checkpoints at 5, 10 and 12 (each averages the buffers first)
RUN = [
    "--model",
    "userpkg.net:bn",
    "--dataset",
    "userpkg.data:build",
    "--no-progress",
    "--log-every",
    "6",
    "--warmup-steps",
    "0",
    "--no-scale-lr",
    "--lr",
    "0.05",
    "--steps",
    "12",
    "--eval-every",
    "6",
    "--checkpoint-every",
    "5",
]


def running(params: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: v for k, v in params.items() if k.endswith(("running_mean", "running_var"))}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Horovod with each worker's own statistics (--no-average-buffers), Horovod and the dedicated PS with
    the averaged ones, Horovod with --sync-batchnorm: 2 workers x batch 8; one process with batch 16."""
    d = tmp_path_factory.mktemp("bn")
    site = write_user_package(d / "site")
    env = {"PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])}
    two = [*RUN, "--batch-size", "8"]
    check(launch(2, two + run_args(d, "own", "--no-average-buffers"), env=env))
    check(launch(2, two + run_args(d, "hvd"), env=env))
    check(launch(3, two + run_args(d, "ps", "--strategy", "ps"), env=env, oversubscribe=True))
    check(launch(2, two + run_args(d, "sync", "--sync-batchnorm"), env=env))
    one = [sys.executable, "-m", "allreduce_train", "train", *RUN, "--batch-size", "16", *run_args(d, "one")]
    check(subprocess.run(one, cwd=ROOT, capture_output=True, text=True, timeout=240, env={**os.environ, **env}))
    return d


def test_each_rank_tracks_its_own_statistics_without_the_average(runs):
    """The premise: identical parameters, running statistics apart by percents."""
    r0, r1 = load_params(runs / "own-0.pt"), load_params(runs / "own-1.pt")
    assert all(torch.equal(r0[k], r1[k]) for k in r0.keys() - running(r0).keys())
    assert rel_diff(running(r0), running(r1)) > 1e-2


@pytest.mark.parametrize("name, ranks", [("hvd", (0, 1)), ("ps", (1, 2))])
def test_after_evaluation_the_buffers_are_every_ranks_mean_on_every_rank(runs, name, ranks):
    a, b = (load_params(runs / f"{name}-{r}.pt") for r in ranks)
    for k in a:
        assert torch.equal(a[k], b[k]), f"{name}: {k} differs between ranks"
    own = [running(load_params(runs / f"own-{r}.pt")) for r in (0, 1)]
    mean = {k: (own[0][k].double() + own[1][k].double()) / 2 for k in own[0]}
    # Horovod: the parameters of the run that kept its own, bit for bit (the average never touches training),
    # and its mean to rounding; the PS: another engine's sums, equal to the ring's to 1e-5 (tests/mpi/test_ps.py)
    tol = 1e-6 if name == "hvd" else 1e-5
    assert rel_diff(running(a), mean) <= tol
    own0 = load_params(runs / "own-0.pt")
    params = a.keys() - running(a).keys()
    assert rel_diff({k: a[k] for k in params}, {k: own0[k] for k in params}) <= (0 if name == "hvd" else tol)
    saved = torch.load(runs / name / "checkpoint.pt", weights_only=True)  # written by the main worker
    assert saved["step"] == 12 and all(torch.equal(saved["model"][k], a[k]) for k in a)


def test_sync_batchnorm_at_two_ranks_is_one_process_at_the_double_batch(runs):
    """The statistics of every training pass are the global batch's: parameters and running statistics
    equal one process's on the same 16 samples a step (to float32 rounding: the sums are taken in
    another order). Without it, the same two ranks are as far from it as the optimisation itself."""
    s0, s1, one = (load_params(runs / f"{n}.pt") for n in ("sync-0", "sync-1", "one-0"))
    for k in s0:
        assert torch.equal(s0[k], s1[k]), k
    assert rel_diff(s0, one) <= 1e-5
    assert rel_diff(load_params(runs / "hvd-0.pt"), one) > 1e-3  # each rank's own batch statistics
