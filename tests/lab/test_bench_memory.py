"""``python -m lab bench-memory`` (lab/memory): per-rank memory of each method beside the ZeRO formula, one
table (markdown and CSV) and one PNG; bad input refused with one line."""

import csv

import pytest

from lab.__main__ import main
from lab.memory import main as bench
from lab.memory.model import build, parameters


def test_the_models_size_is_its_flags():
    for width, depth in ((8, 1), (32, 3)):
        assert sum(p.numel() for p in build(width, depth).parameters()) == parameters(width, depth)


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--workers", "1,x"], "--workers '1,x': comma-separated integers"),
        (["--methods", "ring"], "--methods 'ring': choose from ring-mpi, ps-sync-dedicated"),
        (["--width", "0"], "--width, --depth, --steps"),
    ],
)
def test_bad_input_is_one_line(argv, needle, capsys):
    assert main(["bench-memory", *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("bench-memory: error:") and needle in err[0]


@pytest.mark.long  # 4 jobs (~1 min)
def test_the_table_sets_each_ranks_bytes_beside_the_formula(tmp_path, capsys):
    import matplotlib.image as mpimg

    argv = ["bench-memory", "--workers", "1,2", "--width", "64", "--depth", "1", "--fit-ranks", "0"]
    # the PS by its older name: read as the registry's (ps-sync-dedicated)
    assert main([*argv, "--methods", "ring-mpi,ps-dedicated", "--out", str(tmp_path)]) == 0
    n = parameters(64, 1)
    rows = list(csv.DictReader((tmp_path / "memory.csv").open()))
    assert {(r["method"], r["workers"], r["role"]) for r in rows} == {
        ("ring-mpi", "1", "worker"),
        ("ring-mpi", "2", "worker"),
        ("ps-sync-dedicated", "1", "worker"),
        ("ps-sync-dedicated", "1", "server"),
        ("ps-sync-dedicated", "2", "worker"),
        ("ps-sync-dedicated", "2", "server"),
    }
    for r in rows:
        # what the formula counts is what the ranks hold (AdamW's step counts apart: 4 bytes per tensor)
        held = sum(int(r[k]) for k in ("params", "grads", "optimizer"))
        want = sum(float(r[f"formula_{k}"]) for k in ("params", "grads", "optimizer"))
        assert 0 <= held - want <= 4 * 64, r
        assert int(r["params"]) == 4 * n and (r["role"] == "server" or int(r["grads"]) == 4 * n)
    table = (tmp_path / "memory.md").read_text()
    assert "| ring-mpi | 2 | worker |" in table and "ring-mpi-zero" not in table  # not asked for
    assert mpimg.imread(str(tmp_path / "memory.png")).shape[0] > 100
    assert bench.METHODS.keys() >= {"ring-mpi-zero1", "ring-mpi-zero2", "ring-mpi-zero3"}
