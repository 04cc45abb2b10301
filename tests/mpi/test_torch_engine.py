"""``--allreduce-engine torch`` (torch.distributed, Gloo on this CPU) with real ranks under mpirun: it
averages the same gradients as the mpi engine and as one process with the whole global batch, and
every wire format and schedule runs on it through the layers (distributed/wire.py, schedules.py)."""

import json

import pytest
import torch

from helpers import ENGINE_RUN, check, launch, load_params, rel_diff, run_args

pytestmark = pytest.mark.mpi

# ENGINE_RUN (tests/helpers.py, as test_ring_engine.py): no warm-up, no LR scaling, momentum and weight decay on.
# LeNet-5's ten tensors in buckets of at most 3,000 bytes: 9 buckets, as the mpi engine's test.
TORCH = ["--allreduce-engine", "torch", "--torch-bucket-bytes", "3000"]


def same_on_every_rank(d, name, np):
    first = load_params(d / f"{name}-0.pt")
    for r in range(1, np):
        params = load_params(d / f"{name}-{r}.pt")
        for k in first:
            assert torch.equal(params[k], first[k]), f"{name}: {k} differs on rank {r}"
    return first


@pytest.fixture(scope="module")
def torch2_dir(tmp_path_factory):
    """The torch engine's 2-rank float32 job (run ``sync``), the reference of the layer tests."""
    d = tmp_path_factory.mktemp("torch2")
    check(launch(2, ENGINE_RUN + TORCH + run_args(d, "sync")))
    return d


# 3 ranks: the long tier (make test under 20 min; CI runs it)
@pytest.mark.parametrize("np", [2, pytest.param(3, marks=pytest.mark.long)])
def test_torch_engine_ends_where_the_mpi_engine_and_one_process_end(request, tmp_path, mpi_engine_run, np):
    d = request.getfixturevalue("torch2_dir") if np == 2 else tmp_path
    if np != 2:
        check(launch(np, ENGINE_RUN + TORCH + run_args(d, "sync"), oversubscribe=True))
    mine = same_on_every_rank(d, "sync", np)  # bit-identical: every rank holds the same sums
    # the mpi engine's job and one process with the np-fold batch: tests/mpi/conftest.py's, shared with
    # test_ring_engine (the same flags, and a checkpoint every 5 steps, which changes nothing)
    ref = mpi_engine_run(np)
    assert rel_diff(mine, same_on_every_rank(ref, "mpi", np)) <= 1e-5
    assert rel_diff(mine, load_params(ref / "one-0.pt")) <= 1e-5
    m = json.loads((d / "sync" / "metrics.json").read_text())
    assert (m["allreduce_engine"], m["torch_backend"], m["workers"], m["torch_buckets"]) == ("torch", "gloo", np, 9)


@pytest.mark.parametrize(
    "flags, near, far",
    [
        (["--compression", "fp16"], 1e-2, 1e-5),  # the rounding happened, and the gradients were still averaged
        (["--compression", "bf16"], 5e-2, 1e-5),
        (["--compression", "powersgd", "--powersgd-rank", "2"], None, 1e-4),  # rank-2 factors, not the gradients
        (["--average-every", "4"], None, 1e-4),  # local steps left their mark; the last step averaged
        (["--diloco-every", "4"], None, 1e-4),
    ],
)
def test_every_wire_format_and_schedule_runs_on_the_torch_engine_alike_on_every_rank(
    tmp_path, torch2_dir, flags, near, far
):
    check(launch(2, ENGINE_RUN + TORCH + flags + run_args(tmp_path, "w")))
    got, sync = same_on_every_rank(tmp_path, "w", 2), load_params(torch2_dir / "sync-0.pt")
    assert rel_diff(got, sync) > far
    if near is not None:
        assert rel_diff(got, sync) < near


def test_local_sgd_with_h_1_on_the_torch_engine_is_its_synchronous_sgd_bit_for_bit(tmp_path, torch2_dir):
    check(launch(2, ENGINE_RUN + TORCH + ["--average-every", "1"] + run_args(tmp_path, "h1")))
    got, want = same_on_every_rank(tmp_path, "h1", 2), load_params(torch2_dir / "sync-0.pt")
    for k in want:
        assert torch.equal(got[k], want[k]), k
