"""The modern recipe under real ranks: AdamW with a no-decay group, a cosine schedule with warm-up and
bf16 autocast, on every engine and concept; ranks bit-identical where the concept makes them so, the
engines equal to each other and to one process, and a resume mid-schedule bit-exact."""

from __future__ import annotations

import json

import pytest
import torch

from helpers import ENGINE_RUN, RECIPE, check, launch, load_params, rel_diff, run_args, run_single

pytestmark = pytest.mark.mpi

ENGINES = {
    "horovod": [],
    "mpi": ["--allreduce-engine", "mpi", "--mpi-bucket-bytes", "3000"],
    "torch": ["--allreduce-engine", "torch"],
}


def same_on_every_rank(d, name: str, ranks=(0, 1)) -> dict[str, torch.Tensor]:
    first = load_params(d / f"{name}-{ranks[0]}.pt")
    for r in ranks[1:]:
        other = load_params(d / f"{name}-{r}.pt")
        for k in first:
            assert torch.equal(first[k], other[k]), f"{name}: {k} differs between rank {ranks[0]} and rank {r}"
    return first


@pytest.fixture(scope="module")
def recipe_runs(tmp_path_factory):
    """Each engine's 2-rank job with RECIPE (run ENGINE); the mpi engine's with float32 compute (run
    ``mpi32``) and one process at the double batch with float32 compute (run ``one``)."""
    d = tmp_path_factory.mktemp("recipe")
    for name, flags in ENGINES.items():
        check(launch(2, ENGINE_RUN + RECIPE + flags + run_args(d, name)))
    check(launch(2, ENGINE_RUN + RECIPE + ENGINES["mpi"] + ["--precision", "32"] + run_args(d, "mpi32")))
    check(run_single(ENGINE_RUN + RECIPE + ["--precision", "32"] + run_args(d, "one", "--batch-size", "16")))
    return d


def test_every_engine_trains_the_recipe_with_ranks_and_engines_bit_identical(recipe_runs):
    d = recipe_runs
    hvd = same_on_every_rank(d, "horovod")
    for name in ENGINES:
        # each engine averages the same two float32 gradients, (a + b) / 2 in any order: the same bits
        got = same_on_every_rank(d, name)
        for k in hvd:
            assert torch.equal(got[k], hvd[k]), f"{name}: {k} differs from Horovod's"
        m = json.loads((d / name / "metrics.json").read_text())
        assert (m["optimizer"], m["lr_schedule"], m["precision"]) == ("AdamW", "cosine", "bf16-mixed")
    # bf16 autocast took effect: its parameters are measurably not float32 compute's
    assert rel_diff(hvd, same_on_every_rank(d, "mpi32")) > 1e-3


def test_adamw_with_a_cosine_at_2_ranks_equals_one_process_at_the_double_batch(recipe_runs):
    """Float32 compute: the workers' averaged gradient is the global batch's, so AdamW's moments and the
    schedule's LR are one process's (within float32 summation order)."""
    got, one = same_on_every_rank(recipe_runs, "mpi32"), load_params(recipe_runs / "one-0.pt")
    assert rel_diff(got, one) <= 1e-5
    assert json.loads((recipe_runs / "one" / "metrics.json").read_text())["optimizer"] == "AdamW"


def test_the_logged_lr_follows_the_cosine_schedule(recipe_runs):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(recipe_runs / "horovod"))
    acc.Reload()
    lrs = {e.step: e.value for e in acc.Scalars("train/lr")}
    # ENGINE_RUN logs every 4 steps: the LR of the update of step 4 (after 3 steps: warm-up 4/4), 8, 12
    assert lrs[4] == pytest.approx(0.002)
    assert lrs[12] == pytest.approx(0.0002 + 0.0018 * 0.5 * (1 + torch.cos(torch.tensor(torch.pi * 7 / 8)).item()))


@pytest.mark.long  # make test under 20 min: the long tier (CI runs it)
def test_resume_mid_schedule_is_bit_exact_with_adamw_and_bf16(recipe_runs, tmp_path):
    """Cut at step 5 (a checkpoint), resumed to 12: the mpi engine's uncut job exactly (AdamW's moments
    and step count, the schedule's position all come back)."""
    flags = ENGINE_RUN + RECIPE + ENGINES["mpi"]
    check(launch(2, flags + run_args(tmp_path, "cut", "--exit-after-steps", "5")))
    saved = torch.load(tmp_path / "cut" / "checkpoint.pt", weights_only=True)
    assert saved["step"] == 5 and "exp_avg_sq" in saved["optimizer"]["state"][0]
    assert saved["lr_schedule"]["lr_schedule"] == "cosine"
    check(launch(2, flags + run_args(tmp_path, "cut", "--resume", "auto")))
    resumed, full = same_on_every_rank(tmp_path, "cut"), load_params(recipe_runs / "mpi-0.pt")
    for k in full:
        assert torch.equal(full[k], resumed[k]), k


@pytest.mark.long  # 3 jobs; make test has the engines' runs, the long tier's HF GPT-2 and matrix the rest
@pytest.mark.parametrize(
    ("name", "flags"),
    [
        ("powersgd", ["--compression", "powersgd", "--powersgd-rank", "2"]),
        ("localsgd", ["--average-every", "4"]),  # 12 steps: ends on an averaging
        ("diloco", ["--diloco-every", "4", "--optimizer", "adamw"]),
    ],
)
def test_the_concepts_run_the_recipe_and_end_alike_on_every_rank(tmp_path, name, flags):
    check(launch(2, ENGINE_RUN + RECIPE + ENGINES["mpi"] + flags + run_args(tmp_path, name)))
    same_on_every_rank(tmp_path, name)
    m = json.loads((tmp_path / name / "metrics.json").read_text())
    assert m["optimizer"] == "AdamW" and m["precision"] == "bf16-mixed"


def test_bad_recipe_input_is_one_line_exit_2_and_nothing_written(tmp_path):
    """The set-up errors under real ranks (the configuration's own refusals: tests/unit/test_recipe.py)."""
    for extra, needle in (
        (["--optimizer", "nosuchmod:make"], "--optimizer nosuchmod:make: cannot import nosuchmod"),
        (["--precision", "16-mixed"], "--precision 16-mixed needs a CUDA device"),
    ):
        out = launch(2, ENGINE_RUN + extra + ["--run-dir", str(tmp_path / "runs")])
        assert out.returncode == 2, out.stderr
        lines = [ln for ln in out.stderr.splitlines() if ln.startswith("allreduce_train: error")]
        assert len(lines) == 1 and needle in lines[0], out.stderr
        assert "Traceback" not in out.stderr
        assert not list((tmp_path / "runs").glob("*/checkpoint.pt"))
