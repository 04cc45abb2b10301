"""``--strategy sharded --allreduce-engine torch`` (PyTorch's own sharding: ZeroRedundancyOptimizer for stage
1, ``fully_shard`` -- FSDP2 -- for stages 2 and 3, on Gloo here) with real ranks under mpirun, against the
torch engine's ring on the same samples with AdamW.

Why bit-identical at 2 ranks: stage 1 sums the gradients with the ring's own bucketed ``all_reduce`` and
steps each parameter with the same per-element AdamW; under FSDP2 each element's gradient is the sum of the
two ranks' (one addition either way) divided by 2 (FSDP2 reduce-scatters float32 and bfloat16 with
``ReduceOp.AVG``, the ring divides its sum), and AdamW runs per element on the DTensor shard as on the whole
tensor (CPU: the single-tensor path for both). At 3 ranks the three-way sums need not run in the ring's
order: there the figures may differ by rounding (1e-5, the tolerance of the engines' own comparisons).

``long``: 15 jobs of 6 to 15 s each on this 2-core machine (make test-long, which CI runs).
"""

import json
import re
import shutil

import pytest
import torch

from helpers import ENGINE_RUN, RANKS, RECIPE, ROOT, check, launch, load_params, rel_diff, run_args

pytestmark = [pytest.mark.mpi, pytest.mark.long]

ADAMW = ["--optimizer", "adamw", "--lr", "0.002"]  # ENGINE_RUN's weight decay, decoupled
RING = ["--allreduce-engine", "torch", "--torch-bucket-bytes", "3000"]  # LeNet-5 in 9 buckets, as test_torch_engine


def sharded(stage: int) -> list[str]:
    return ["--strategy", "sharded", "--shard-stage", str(stage), *RING]


def same_on_every_rank(d, name, np):
    first = load_params(d / f"{name}-0.pt")
    for r in range(1, np):
        params = load_params(d / f"{name}-{r}.pt")
        for k in first:
            assert torch.equal(params[k], first[k]), f"{name}: {k} differs on rank {r}"
    return first


def assert_bit_identical(got, want):
    assert got.keys() == want.keys()
    for k in want:
        assert torch.equal(got[k], want[k]), k


@pytest.fixture(scope="module")
def ring_dir(tmp_path_factory):
    """The torch engine's ring at 2 ranks with AdamW (run ``ring``; a checkpoint every 5 steps and at the end)."""
    d = tmp_path_factory.mktemp("ring")
    check(launch(2, ENGINE_RUN + ADAMW + RING + run_args(d, "ring")))
    return d


@pytest.fixture(scope="module")
def stage_dir(tmp_path_factory):
    """stage -> the 2-rank job of ``--shard-stage`` STAGE on the ring's flags (run ``sN``), each run once."""
    done = {}

    def run(stage: int):
        if stage not in done:
            d = tmp_path_factory.mktemp(f"s{stage}")
            check(launch(2, ENGINE_RUN + ADAMW + sharded(stage) + run_args(d, f"s{stage}")))
            done[stage] = d
        return done[stage]

    return run


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_every_stage_ends_bit_identical_to_the_torch_ring_with_adamw_and_saves_the_rings_checkpoint(
    ring_dir, stage_dir, stage
):
    d = stage_dir(stage)
    assert_bit_identical(same_on_every_rank(d, f"s{stage}", 2), same_on_every_rank(ring_dir, "ring", 2))
    # the checkpoint holds the whole state in AdamW's own format, plain tensors, gathered from the shards:
    # the ring's, tensor for tensor (so either resumes the other's)
    mine = torch.load(d / f"s{stage}" / "checkpoint.pt", weights_only=True)
    ring = torch.load(ring_dir / "ring" / "checkpoint.pt", weights_only=True)
    assert mine["step"] == ring["step"] == 12
    assert_bit_identical(mine["model"], ring["model"])
    assert mine["optimizer"]["param_groups"] == ring["optimizer"]["param_groups"]
    assert mine["optimizer"]["state"].keys() == ring["optimizer"]["state"].keys()
    for i, st in ring["optimizer"]["state"].items():
        assert_bit_identical(mine["optimizer"]["state"][i], st)
    m = json.loads((d / f"s{stage}" / "metrics.json").read_text())
    impl = "ZeroRedundancyOptimizer" if stage == 1 else "fully_shard"
    assert (m["strategy"], m["shard_stage"], m["shard_impl"], m["workers"]) == ("sharded", stage, impl, 2)


def test_a_stage_3_run_cut_and_resumed_ends_bit_identical_to_the_uncut_run(tmp_path, stage_dir):
    args = ENGINE_RUN + ADAMW + sharded(3) + run_args(tmp_path, "cut")
    check(launch(2, args + ["--exit-after-steps", "7"]))  # the checkpoint of step 7 (not one of every 5)
    check(launch(2, args + ["--resume", "auto"]))
    assert_bit_identical(same_on_every_rank(tmp_path, "cut", 2), same_on_every_rank(stage_dir(3), "s3", 2))


def test_a_stage_2_checkpoint_of_2_workers_resumes_at_3_under_stage_2_as_under_the_ring(tmp_path):
    args = ENGINE_RUN + ADAMW
    check(launch(2, args + sharded(2) + run_args(tmp_path, "s2", "--exit-after-steps", "7")))
    shutil.copytree(tmp_path / "s2", tmp_path / "ring")  # the same checkpoint, resumed by the ring
    out = check(launch(3, args + sharded(2) + run_args(tmp_path, "s2", "--resume", "auto"), oversubscribe=True))
    assert "elastic: resumed with 3 workers from a checkpoint of 2" in out.stdout + out.stderr
    check(launch(3, args + RING + run_args(tmp_path, "ring", "--resume", "auto"), oversubscribe=True))
    got, ring = same_on_every_rank(tmp_path, "s2", 3), same_on_every_rank(tmp_path, "ring", 3)
    assert rel_diff(got, ring) <= 1e-5  # the order of three-way sums (module docstring)
    assert json.loads((tmp_path / "s2" / "metrics.json").read_text())["steps"] == 12


# 97 evaluation samples scored one at a time: 49 forwards on rank 0, 48 on rank 1, at steps 5, 10 and 12. A
# forward that gathered per module would wait at rank 0's 49th for a gather rank 1 never starts.
UNEVEN_EVALUATION = ["--synthetic-samples", "970", "--eval-batch-size", "1", "--eval-every", "5"]


@pytest.fixture(scope="module")
def recipe_ring_dir(tmp_path_factory):
    """The torch engine's ring at 2 ranks under RECIPE, evaluating uneven shares (run ``ring``)."""
    d = tmp_path_factory.mktemp("recipe-ring")
    check(launch(2, ENGINE_RUN + RECIPE + UNEVEN_EVALUATION + RING + run_args(d, "ring")))
    return d


@pytest.mark.parametrize("stage", [1, 3])
def test_the_recipe_two_groups_cosine_bf16_autocast_runs_every_stage_as_the_ring(tmp_path, recipe_ring_dir, stage):
    """RECIPE: AdamW with a group without decay (ZeroRedundancyOptimizer and the rebuilt class keep both
    groups and the schedule's LR), bf16 autocast over the sharded modules; the evaluations' uneven shares
    run on parameters gathered whole beforehand (whole_parameters), to the ring's figures."""
    check(launch(2, ENGINE_RUN + RECIPE + UNEVEN_EVALUATION + sharded(stage) + run_args(tmp_path, "s")))
    assert_bit_identical(same_on_every_rank(tmp_path, "s", 2), same_on_every_rank(recipe_ring_dir, "ring", 2))
    evals = [
        [{k: v for k, v in e.items() if k != "seconds"} for e in json.loads((d / "metrics.json").read_text())["evals"]]
        for d in (tmp_path / "s", recipe_ring_dir / "ring")
    ]
    assert [e["step"] for e in evals[0]] == [5, 10, 12] and evals[0] == evals[1]


def test_gloo_serves_every_collective_and_both_of_pytorchs_sharding_apis_that_the_engine_uses():
    """The findings of docs/engines.md, as tests/ranks/fsdp_gloo_rank.py probes them: every probe ran on both
    ranks, each with the same result on both (a sum; parameters after steps on each rank's own samples), and
    FSDP2 cut the 7 x 5 matrix into rows 4 + 3."""
    proc = check(launch(2, [], module="fsdp_gloo_rank", env={"PYTHONPATH": f"{RANKS}:{ROOT}"}, timeout=120))
    # two ranks' lines may meet in one line of mpirun's output: each probe's line found by its own shape
    found = re.findall(r"rank ([01]) ([^\n]+?) ok (\[[^\]]*\]|(?:shard \(\d, \d\) )?sum -?[\d.]+)", proc.stdout)
    by_rank = {r: {name: value for rr, name, value in found if rr == r} for r in "01"}
    assert len(by_rank["0"]) == len(by_rank["1"]) == 6, proc.stdout
    shards = set()
    for name, value in by_rank["0"].items():
        other = by_rank["1"][name]
        if "shard" in value:
            shards.add((value.split(" sum ")[0], other.split(" sum ")[0]))
            value, other = value.split(" sum ")[1], other.split(" sum ")[1]
        assert value == other, name
    assert shards == {("shard (4, 5)", "shard (3, 5)")}


def test_bf16_on_the_wire_reduce_scatters_stage_2s_gradients_as_the_rings_bf16_allreduce(tmp_path, ring_dir):
    """--compression bf16 is FSDP2's reduce_dtype: each gradient rounded to bf16 before the sum, as the ring's
    bucket is, then summed in bf16 and divided by 2 (ReduceOp.AVG; the ring divides its bf16 sum): bit for bit
    again."""
    bf16 = ["--compression", "bf16"]
    check(launch(2, ENGINE_RUN + ADAMW + RING + bf16 + run_args(tmp_path, "ring")))
    check(launch(2, ENGINE_RUN + ADAMW + sharded(2) + bf16 + run_args(tmp_path, "s2")))
    got = same_on_every_rank(tmp_path, "s2", 2)
    assert_bit_identical(got, same_on_every_rank(tmp_path, "ring", 2))
    assert rel_diff(got, load_params(ring_dir / "ring-0.pt")) > 1e-4  # the rounding happened
