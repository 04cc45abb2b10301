"""The one-way rule: the core never imports an experiment; launch/ and models/ stay independent."""

import ast

import pytest

from helpers import ROOT


def imports(path):
    """Absolute module names imported by ``path`` (relative imports resolved against its package)."""
    package = list(path.relative_to(ROOT).parent.parts)  # a module's package; an __init__'s own
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            mod = ".".join(base + ([node.module] if node.module else []))
            out += [mod] + [f"{mod}.{a.name}" for a in node.names]
    return out


def files(folder):
    return sorted((ROOT / folder).rglob("*.py"))


def test_the_core_never_imports_an_experiment():
    core = [p for p in files("allreduce_train") if "experiments" not in p.relative_to(ROOT).parts]
    assert len(core) > 10
    bad = [(str(p.relative_to(ROOT)), m) for p in core for m in imports(p)
           if m.startswith("allreduce_train.experiments")]
    assert not bad, bad


@pytest.mark.parametrize("folder, forbidden", [
    ("models", ("horovod", "mpi4py", "torch.distributed", "allreduce_train", "launch")),
    ("launch", ("allreduce_train", "models", "torch", "horovod")),
])
def test_models_and_launch_import_only_what_their_docstring_allows(folder, forbidden):
    bad = [(str(p.relative_to(ROOT)), m) for p in files(folder) for m in imports(p)
           if any(m == f or m.startswith(f + ".") for f in forbidden)]
    assert not bad, bad


def test_the_import_reader_sees_relative_imports():
    # guards the guard: a relative import of an experiment from the core would be caught
    src = ROOT / "allreduce_train" / "experiments" / "scaling" / "grid.py"
    assert "allreduce_train.experiments.costmodel" in imports(src)
