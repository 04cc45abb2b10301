"""pytest set-up for every test folder: tests/ goes on sys.path (pyproject's ``pythonpath``; test modules
are imported with ``--import-mode=importlib``, so two folders may hold test files of the same name), so
test files import ``helpers`` and nothing imports conftest. Before the first test,
emulated hosts left by a dead run are removed (see pytest_sessionstart)."""

import pytest


def pytest_sessionstart(session):
    """Emulated hosts left by a run that died before its clean-up (a launcher killed with SIGKILL, a
    machine's session ended under a job) make every emulated run refuse to start (by design: the
    launcher names them and the cleanup command). The suite removes them before its first test and
    says which; the hosts of runs still alive are kept."""
    try:
        from lab.emulation import netns
    except ImportError:  # the lab is not on the path: nothing of it runs either
        return
    old = netns.leftovers()
    if not old:
        return
    netns.remove(old)
    print(f"\nconftest: removed emulated hosts of a run whose creator is gone: {', '.join(old)}")


@pytest.fixture(scope="session")
def namespaces_permitted():
    """For a test that makes emulated hosts (lab/emulation/netns.py): skips it, with the reason, where
    network namespaces cannot be made (not root, no ip or tc). Asking for it also marks the test ``cluster``
    (pytest_collection_modifyitems below), so make test leaves it to make test-cluster."""
    from lab.emulation import netns

    reason = netns.unavailable_reason()
    if reason:
        pytest.skip(reason)


@pytest.hookimpl(tryfirst=True)  # before pytest's own -m selection reads the markers
def pytest_collection_modifyitems(items):
    """The emulated-cluster tests (emulated hosts in network namespaces, the emulated Slurm cluster) are one
    tier, ``cluster``: minutes of set-up each, run by make test-cluster and .ci/run, left out of make test."""
    for item in items:
        if "namespaces_permitted" in getattr(item, "fixturenames", ()) or item.get_closest_marker("slurm"):
            item.add_marker(pytest.mark.cluster)
