"""Jobs that several test files of this folder assert on, each run once per session: a real-rank
launch costs seconds (mpirun, two interpreters importing torch and Horovod), so the tests that check
different properties of the same job share it instead of each running its own copy."""

import pytest

from helpers import ENGINE_RUN, LM, LM_STEPS, MPI_ENGINE, SHARED_RUN, check, launch, run_args, run_single, write_corpus


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


@pytest.fixture(scope="session")
def lstm_run(tmp_path_factory):
    """2 ranks of the small LSTM (LM, 15 steps of batch 4) on a tiny corpus (``corpus/``): run ``np2``, dumps
    ``np2-0.pt``, ``np2-1.pt``. For test_lstm_ranks (equality with one process) and test_faults (the
    reference of the mid-epoch resume)."""
    d = tmp_path_factory.mktemp("lstm")
    corpus = write_corpus(d / "corpus", lines=(400, 30, 30))
    check(launch(2, LM + LM_STEPS + ["--data-dir", str(corpus), "--batch-size", "4"] + run_args(d, "np2")))
    return d


@pytest.fixture(scope="session")
def mpi_engine_run(tmp_path_factory):
    """np -> a run dir holding the mpi engine's job at np ranks (ENGINE_RUN + MPI_ENGINE, run ``mpi``, traced) and
    one process at the np-fold batch (run ``one``), each run once: the references of test_ring_engine
    (Horovod against them, the resume test) and test_torch_engine (the torch engine against them)."""
    done = {}

    def run(np: int):
        if np not in done:
            d = tmp_path_factory.mktemp(f"mpi-engine-np{np}")
            # traced (tests/mpi/test_trace.py reads the traces): the checks of its result hold with the trace on
            mpi = run_args(d, "mpi", "--trace-steps", "3:6")
            check(launch(np, ENGINE_RUN + MPI_ENGINE + mpi, oversubscribe=True))
            check(run_single(ENGINE_RUN + run_args(d, "one", "--batch-size", str(8 * np))))
            done[np] = d
        return done[np]

    return run
