"""``--strategy sharded``: the flags, the combinations refused before any rank starts (one line, exit 2),
and the layout every rank computes alike."""

from __future__ import annotations

import pytest

from allreduce_train.distributed.sharded.layout import make_layout
from allreduce_train.errors import ConfigError

from helpers import parse

BASE = ["--model", "lenet5", "--dataset", "synthetic", "--strategy", "sharded"]


def test_the_stage_defaults_to_2_and_the_engine_is_the_allreduce_engine():
    cfg = parse([*BASE, "--allreduce-engine", "mpi"])
    assert cfg.exchange.shard_stage == 2 and cfg.exchange.engine == "mpi"
    assert parse([*BASE, "--shard-stage", "3"]).exchange.shard_stage == 3


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--average-every", "2"], r"--strategy sharded keeps 1/N.*use --strategy allreduce"),
        (["--diloco-every", "2"], r"--strategy sharded keeps 1/N.*use --strategy allreduce"),
        (["--compression", "powersgd"], r"--compression powersgd with --strategy sharded.*use --compression fp16"),
        (["--reduce-op", "adasum"], r"--reduce-op adasum with --strategy sharded.*use --reduce-op average"),
        (["--precision", "16-mixed"], r"--precision 16-mixed with --strategy sharded.*use --precision bf16-mixed"),
        (["--allreduce-engine", "mpi", "--mpi-algorithm", "iallreduce"], r"phases apart; use --mpi-algorithm ring"),
        (["--allreduce-engine", "mpi", "--sync-batchnorm"], r"the mpi engine has no SyncBatchNorm"),
    ],
)
def test_a_combination_that_cannot_run_is_refused_in_one_line_naming_the_fix(argv, needle, capsys):
    from allreduce_train.cli import main

    with pytest.raises(ConfigError, match=needle) as refused:
        parse([*BASE, *argv])
    assert "\n" not in str(refused.value)
    capsys.readouterr()
    code: str | int | None
    try:
        code = main(["train", *BASE, *argv])
    except SystemExit as e:  # every rank leaves alike (job.configure)
        code = e.code
    assert code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("allreduce_train: error: ")


@pytest.mark.parametrize("workers", [1, 2, 3, 4])
def test_the_layout_gives_every_element_of_every_bucket_to_exactly_one_worker(workers):
    sizes = [5, 12544, 16, 32, 2, 256, 1, 20]

    def bounds(numel: int) -> list[tuple[int, int]]:
        cut = [numel * i // workers for i in range(workers + 1)]
        return [(cut[(r + 1) % workers], cut[(r + 1) % workers + 1]) for r in range(workers)]

    lay = make_layout(sizes, 300, bounds, workers)
    assert sorted(p for members in lay.buckets for p in members) == list(range(len(sizes)))
    owned = [[0] * n for n in sizes]
    for (b, r), segs in lay.segments.items():
        lo, hi = lay.bounds[b][r]
        assert sum(h - low for _, low, h in segs) == hi - lo  # a shard is its segments, end to end
        for p, low, h in segs:
            assert p in lay.buckets[b]
            for i in range(low, h):
                owned[p][i] += 1
    assert all(c == 1 for counts in owned for c in counts)
