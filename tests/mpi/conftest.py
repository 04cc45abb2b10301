"""Jobs that several test files of this folder assert on, each run once per session: a real-rank
launch costs seconds (mpirun, two interpreters importing torch and Horovod), so the tests that check
different properties of the same job share it instead of each running its own copy."""

import pytest

from helpers import SHARED_RUN, check, launch, run_args, run_single


@pytest.fixture(scope="session")
def sync_run(tmp_path_factory):
    """2 ranks of synchronous SGD through Horovod's DistributedOptimizer (SHARED_RUN, batch 16): the
    ordinary path. Run dir (run ``sync``, dumps ``sync-0.pt``, ``sync-1.pt``) for test_train
    (bit-identity, the resume reference, TensorBoard and metrics.json, the global evaluation) and
    test_concepts (the reference every concept is set against)."""
    d = tmp_path_factory.mktemp("sync")
    check(launch(2, SHARED_RUN + run_args(d, "sync", "--batch-size", "16")))
    return d


@pytest.fixture(scope="session")
def one_process_run(tmp_path_factory):
    """The same run in one process at the double batch (no Horovod optimizer wrapper: plain torch
    SGD): where 2 ranks must end (within 1e-5). Run dir (run ``one``, dump ``one-0.pt``)."""
    d = tmp_path_factory.mktemp("one")
    check(run_single(SHARED_RUN + run_args(d, "one", "--batch-size", "32")))
    return d


@pytest.fixture(scope="session")
def alone_run(tmp_path_factory):
    """The 2 ranks of ``sync_run`` with the gradient exchange off: local SGD whose first averaging
    (step 1000) lies past the run's last step, so each rank steps on its own shard's gradient alone
    (only the per-step stop/loss vote travels). Run dir (run ``alone``, dumps ``alone-0.pt``, ``alone-1.pt``)."""
    d = tmp_path_factory.mktemp("alone")
    check(launch(2, SHARED_RUN + run_args(d, "alone", "--batch-size", "16", "--average-every", "1000")))
    return d
