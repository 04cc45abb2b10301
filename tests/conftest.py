"""pytest set-up for every test folder: tests/ goes on sys.path (pytest puts a rootdir conftest's
folder there), so test files import ``helpers`` and nothing imports conftest."""
