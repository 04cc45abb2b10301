"""pytest set-up for every test folder: tests/ goes on sys.path (pyproject's ``pythonpath``; test modules
are imported with ``--import-mode=importlib``, so two folders may hold test files of the same name), so
test files import ``helpers`` and nothing imports conftest. Before the first test,
emulated hosts left by a dead run are removed (see pytest_sessionstart)."""


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
