import ast
import subprocess
import sys

import pytest
import torch

from models import MODELS, count_parameters, get_model

from helpers import ROOT


def test_lenet5_shapes_and_size():
    m = get_model("lenet5")
    out = m(torch.zeros(7, 1, 28, 28))
    assert out.shape == (7, 10)
    assert count_parameters(m) == 61_706  # the classic LeNet-5 on 32x32 (28x28 padded by 2)


@pytest.mark.heavy
def test_every_model_runs_on_its_declared_input():
    for name, spec in MODELS.items():
        if spec.task == "lm":  # token ids in, next-token logits and the carried state out
            out, (h, c) = spec.build()(torch.zeros(2, *spec.input_shape, dtype=torch.long))
            assert out.shape == (2, spec.bptt, spec.num_classes), name
            assert h.shape == c.shape and h.shape[1] == 2, name
        else:
            out = spec.build()(torch.zeros(2, *spec.input_shape))
            assert out.shape == (2, spec.num_classes), name


@pytest.mark.heavy
def test_models_never_import_distribution_packages():
    code = (
        "import sys, models\n"
        "[m.build() for m in models.MODELS.values()]\n"
        "bad = [m for m in ('horovod', 'mpi4py') if m in sys.modules]\n"
        "print(','.join(bad))"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""
    for path in (ROOT / "models").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else ([node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            )
            for name in names:
                assert not name.startswith(("horovod", "mpi4py", "torch.distributed")), f"{path.name} imports {name}"
