"""lab.pause_probe (docs/emulated_cluster.md): real ranks under mpirun; each
rank checks every exchange against the exact sum of all ranks' tensors, so a line per pause only
comes out of exchanges that really happened."""

import re

import pytest

from lab.pause_probe import IMPLS

from helpers import check, launch

MODULE = "lab.pause_probe"


@pytest.mark.mpi
@pytest.mark.parametrize("impl,extra", [(i, []) for i in IMPLS] + [("horovod", ["--connect-first"])])
def test_two_ranks_time_exact_exchanges_after_each_pause(impl, extra):
    out = check(
        launch(2, ["--impl", impl, "--pauses", "0,15", "--mb", "0.3", "--iters", "2", *extra], module=MODULE)
    ).stdout
    lines = re.findall(rf"^{impl}, 2 ranks, 0\.3 MB, pause (\d+) ms: median \d+ ms \(\d+-\d+; \d+, \d+\)$", out, re.M)
    assert lines == ["0", "15"], out


@pytest.mark.heavy
def test_bad_pauses_are_one_line_naming_the_flag():
    proc = launch(1, ["--pauses", "0,soon"], module=MODULE)
    assert proc.returncode != 0
    assert "--pauses '0,soon': give milliseconds separated by commas" in proc.stderr
