"""A user's own model, data or task that cannot be used: one line naming the flag and the cause, exit 2,
no traceback, before any rank trains (the user package lives in a temporary directory on PYTHONPATH).
The three cases under mpirun carry the mpi mark (they are tests/mpi's kind, kept beside their cases)."""

import os
import subprocess
import sys

import pytest

from helpers import ROOT, parse, write_user_package

BASE = ["--allreduce-engine", "mpi", "--no-progress", "--no-tensorboard", "--steps", "2"]

CASES = {
    "module not importable": (
        ["--model", "nosuchpkg.net:build", "--dataset", "userpkg.data:build"],
        "--model nosuchpkg.net:build: cannot import nosuchpkg.net",
    ),
    "module raises on import": (
        ["--model", "userpkg.broken:build", "--dataset", "userpkg.data:build"],
        "importing userpkg.broken raised ImportError: a dependency of the user module",
    ),
    "attribute missing": (["--model", "userpkg.net:nope", "--dataset", "userpkg.data:build"], "module userpkg.net"),
    "not callable": (
        ["--model", "userpkg.net:NOT_CALLABLE", "--dataset", "userpkg.data:build"],
        "NOT_CALLABLE is a int, not a callable",
    ),
    "callable raises": (
        ["--model", "userpkg.net:raises", "--dataset", "userpkg.data:build"],
        "raised RuntimeError: the user's model failed to build",
    ),
    "wrong return type": (
        ["--model", "userpkg.net:wrong_type", "--dataset", "userpkg.data:build"],
        "returned a str; return a torch.nn.Module",
    ),
    "output does not fit the loss": (
        ["--model", "userpkg.net:bad_output", "--dataset", "userpkg.data:build"],
        "the loss on one training batch (inputs a tensor of shape (64, 1, 28, 28)",
    ),
    "unknown keyword argument": (
        ["--model", "userpkg.net:build", "--model-arg", "depth=3", "--dataset", "userpkg.data:build"],
        "unexpected keyword argument 'depth'",
    ),
    "dataset smaller than a global batch": (
        ["--model", "userpkg.net:build", "--dataset", "userpkg.data:tiny"],
        "10 training samples are fewer than one global batch",
    ),
    "iterable dataset": (
        ["--model", "userpkg.net:build", "--dataset", "userpkg.data:iterable"],
        "give a map-style dataset",
    ),
    "task of the wrong type": (
        ["--task", "userpkg.task:not_a_task"],
        "returned a object; return an allreduce_train.Task",
    ),
    "reference without a callable": (
        ["--model", "userpkg.net", "--dataset", "userpkg.data:build"],
        "unknown model 'userpkg.net'",
    ),
    "reference with bad syntax": (
        ["--model", "user pkg:build", "--dataset", "userpkg.data:build"],
        "write MODULE:CALLABLE",
    ),
    "model argument for a registered model": (
        ["--model", "lenet5", "--model-arg", "x=1"],
        "--model-arg is for your own",
    ),
}


@pytest.fixture(scope="module")
def user_root(tmp_path_factory):
    root = write_user_package(tmp_path_factory.mktemp("site"))
    sys.path.insert(0, str(root))
    yield root
    sys.path.remove(str(root))
    for name in [m for m in sys.modules if m == "userpkg" or m.startswith("userpkg.")]:
        del sys.modules[name]


@pytest.mark.heavy
@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_own_code_fails_the_set_up_with_one_line_naming_it(case, user_root, tmp_path):
    """In one process, through the trainer's own set-up (an exchange of one rank): each case raises the
    one-line error that the command line prints (the end-to-end path is the test below)."""
    from allreduce_train.distributed.local import LocalExchange
    from allreduce_train.errors import UserError
    from allreduce_train.trainer import Trainer

    args, needle = CASES[case]
    with pytest.raises(UserError) as info:
        cfg = parse([*BASE, *args, "--run-dir", str(tmp_path)])
        Trainer(cfg, LocalExchange(), str(tmp_path / "run")).build()
    assert needle in str(info.value) and "\n" not in str(info.value)


@pytest.mark.mpi
@pytest.mark.parametrize("case", ["reference with bad syntax", "module not importable", "output does not fit the loss"])
def test_bad_own_code_ends_every_rank_with_one_line_and_exit_2(case, user_root, tmp_path):
    """The command line at 2 ranks under mpirun: one line from rank 0, exit 2, no traceback, no rank left."""
    args, needle = CASES[case]
    env = {**os.environ, "PYTHONPATH": str(user_root), "OMP_NUM_THREADS": "1"}
    env.pop("ALLREDUCE_TRAIN_TRACEBACK", None)
    proc = subprocess.run(
        [sys.executable, "-m", "launch", "-np", "2", "--", *BASE, *args, "--run-dir", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=180,
        env=env,
    )
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-2000:])
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("allreduce_train: error")]
    assert len(errors) == 1 and needle in errors[0], proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr and "Traceback" not in proc.stdout
    assert not any(p.name.startswith("events") for p in tmp_path.rglob("*")), "nothing trained"
