"""``--strategy sharded`` on the mpi engine at real ranks: ZeRO stages 1 and 2 against the ring allreduce
(``--allreduce-engine mpi``) on the same samples, stage 3, checkpoints, resumes, clipping.

The model has what a sharding trips over: a matrix cut across two workers' shards, a tiny 2x16 matrix, a
bias-only layer, a BatchNorm (parameters and running statistics) and two layers sharing one weight; small
buckets (``--mpi-bucket-bytes 2048``) put several parameters in a bucket and cut some between shards.

Why bit-identical: the sharded reduce-scatter is the ring's first phase, so every shard's sum is the
ring's, added in the same order; the division by N is the same; AdamW is element-wise, so its update of
a shard is the ring's update of those elements; the allgather only copies. Under ``--grad-clip`` the
norm is summed over shards in float64 (as the parameter servers do) where torch's clip_grad_norm_ takes
the float32 norm of per-parameter norms: the factor differs in its last bits, so there the parameters
agree with the ring's to 1e-5 (relative), and bit for bit between the workers.
"""

from __future__ import annotations

import json
import os

import pytest
import torch

from allreduce_train.checkpoint import export, load, shard_file

from helpers import check, launch, load_params, rel_diff, run_args, write_user_package

pytestmark = pytest.mark.mpi

NET = '''
import torch
import torch.nn as nn


class Shift(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.bias = nn.Parameter(torch.zeros(width))

    def forward(self, x):
        return x + self.bias


class Tied(nn.Module):
    """A 16x784 matrix, a BatchNorm, two layers with one weight, a tiny 2x16 matrix, a bias-only layer."""

    def __init__(self, classes=10):
        super().__init__()
        self.inp, self.bn = nn.Linear(28 * 28, 16), nn.BatchNorm1d(16)
        self.a, self.b = nn.Linear(16, 16), nn.Linear(16, 16)
        self.b.weight = self.a.weight
        self.tiny, self.shift, self.out = nn.Linear(16, 2, bias=False), Shift(2), nn.Linear(2, classes)

    def forward(self, x):
        h = torch.relu(self.bn(self.inp(x.flatten(1))))
        h = torch.relu(self.b(torch.relu(self.a(h))))
        return self.out(self.shift(self.tiny(h)))


def build(classes=10):
    return Tied(classes)
'''

STEPS = 6
RUN = [
    "--model",
    "shardnet:build",
    "--dataset",
    "userpkg.data:build",
    "--dataset-arg",
    "n=384",
    "--dataset-arg",
    "evaluation=32",
    "--batch-size",
    "16",
    "--steps",
    str(STEPS),
    "--eval-every",
    "3",
    "--checkpoint-every",
    "3",
    "--optimizer",
    "adamw",
    "--lr",
    "0.01",
    "--weight-decay",
    "0.01",
    "--warmup-steps",
    "0",
    "--no-progress",
    "--no-tensorboard",
    "--log-every",
    "1",
    "--allreduce-engine",
    "mpi",
    "--mpi-bucket-bytes",
    "2048",
]


class Jobs:
    """Runs of this module, each launched once (by name) and shared by the tests that look at it."""

    def __init__(self, root):
        self.root = root
        self.site = write_user_package(root / "site")
        (self.site / "shardnet.py").write_text(NET)
        self.env = {"PYTHONPATH": os.pathsep.join([str(self.site), os.environ.get("PYTHONPATH", "")])}
        self.done: set[str] = set()

    def run(self, name: str, np: int, *flags: str) -> str:
        if name not in self.done:
            args = RUN + list(flags) + run_args(self.root, name)
            check(launch(np, args, env=self.env, oversubscribe=np > 2, timeout=400))
            self.done.add(name)
        return name

    def ring(self, np: int, *flags: str) -> str:
        return self.run(f"ring{np}{''.join(flags)}", np, "--strategy", "allreduce", *flags)

    def sharded(self, stage: int, np: int, *flags: str) -> str:
        return self.run(
            f"s{stage}-{np}{''.join(flags)}", np, "--strategy", "sharded", "--shard-stage", str(stage), *flags
        )

    def params(self, name: str, np: int) -> list[dict[str, torch.Tensor]]:
        return [load_params(self.root / f"{name}-{r}.pt") for r in range(np)]

    def metrics(self, name: str) -> dict:
        return json.loads((self.root / name / "metrics.json").read_text())

    def checkpoint(self, name: str) -> dict:
        """The run's checkpoint as a resume reads it (a sharded run's: its manifest and shard files joined)."""
        return load(str(self.root / name / "checkpoint.pt"))


@pytest.fixture(scope="module")
def jobs(tmp_path_factory):
    return Jobs(tmp_path_factory.mktemp("sharded"))


def identical(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


LONG = pytest.mark.long
CASES = [
    pytest.param(2, 2, id="stage2-2ranks"),
    pytest.param(1, 2, id="stage1-2ranks", marks=LONG),
    pytest.param(1, 3, id="stage1-3ranks", marks=LONG),
    pytest.param(2, 3, id="stage2-3ranks", marks=LONG),
    pytest.param(1, 4, id="stage1-4ranks", marks=LONG),
    pytest.param(2, 4, id="stage2-4ranks", marks=LONG),
]


@pytest.mark.parametrize(("stage", "np"), CASES)
def test_stages_1_and_2_end_bit_identical_to_the_ring_on_every_rank(jobs, stage, np):
    ring, sharded = jobs.params(jobs.ring(np), np), jobs.params(jobs.sharded(stage, np), np)
    assert identical(ring[0], ring[-1])
    for r, mine in enumerate(sharded):
        assert identical(mine, ring[0]), f"rank {r} of stage {stage} at {np} ranks differs from the ring"
    assert jobs.metrics(jobs.sharded(stage, np))["shard_stage"] == stage


def test_the_checkpoint_holds_the_whole_optimizer_state_of_the_ring(jobs):
    """One file per worker's shard and a manifest naming them (those of its step alone: step 3's are gone
    once step 6's manifest is written); joined, AdamW's own format: every moment in its parameter's shape,
    equal to the state the ring's unsharded AdamW holds after the same steps (the tied weight once)."""
    manifest = torch.load(jobs.root / jobs.sharded(2, 2) / "checkpoint.pt", weights_only=True)
    names = [shard_file(STEPS, r, 2) for r in range(2)]
    assert manifest["optimizer"]["shards"] == names and manifest["optimizer"]["state"] == {}
    assert sorted(os.listdir(jobs.root / jobs.sharded(2, 2) / "shards")) == sorted(map(os.path.basename, names))
    ring, sharded = jobs.checkpoint(jobs.ring(2)), jobs.checkpoint(jobs.sharded(2, 2))
    assert sharded["optimizer"]["param_groups"] == ring["optimizer"]["param_groups"]
    assert sharded["optimizer"]["state"].keys() == ring["optimizer"]["state"].keys()
    for i, st in ring["optimizer"]["state"].items():
        for k, v in st.items():
            assert torch.equal(sharded["optimizer"]["state"][i][k], v), f"state {i} {k}"
    shapes = [p.shape for p in sharded["model"].values()]
    assert {v["exp_avg"].shape for v in sharded["optimizer"]["state"].values()} <= set(shapes)


def test_the_model_exports_from_a_sharded_checkpoint(jobs, tmp_path):
    """``export`` reads the manifest's model: the parameters every rank ended with."""
    export(str(jobs.root / jobs.sharded(2, 2)), str(tmp_path / "model.pt"))
    weights = torch.load(tmp_path / "model.pt", weights_only=True)
    ends = jobs.params(jobs.sharded(2, 2), 2)[0]
    assert weights and all(torch.equal(v, ends[k]) for k, v in weights.items())


@LONG
def test_stage_3_trains_and_ends_as_the_ring_on_every_rank(jobs):
    """Parameters sharded too, gathered per module for forward and backward: the same sums in the same
    order, so the ring's parameters, bit for bit, and a falling loss."""
    ring, sharded = jobs.params(jobs.ring(2), 2), jobs.params(jobs.sharded(3, 2), 2)
    for mine in sharded:
        assert identical(mine, ring[0])
    evals = jobs.metrics(jobs.sharded(3, 2))["evals"]
    assert [e["step"] for e in evals] == [3, 6] and evals[1]["eval_loss"] < evals[0]["eval_loss"]
    assert evals == [
        {**e, "seconds": s["seconds"]} for e, s in zip(jobs.metrics(jobs.ring(2))["evals"], evals, strict=True)
    ]


@LONG
@pytest.mark.parametrize("stage", [2, 3])
def test_a_resumed_run_ends_bit_identical_to_an_uninterrupted_one(jobs, stage):
    name, flags = f"resume{stage}", ["--strategy", "sharded", "--shard-stage", str(stage)]
    check(launch(2, RUN + flags + run_args(jobs.root, name, "--exit-after-steps", "3"), env=jobs.env))
    check(launch(2, RUN + flags + run_args(jobs.root, name, "--resume", "auto"), env=jobs.env))
    assert jobs.metrics(name)["steps"] == STEPS
    for mine in jobs.params(name, 2):
        assert identical(mine, jobs.params(jobs.sharded(stage, 2), 2)[0])


@LONG
def test_a_resume_at_another_worker_count_reshards_the_state_as_the_ring_continues(jobs):
    """3 steps at 2 ranks, the rest at 3: the checkpoint's whole state is cut into 3 shards; the ring making
    the same elastic restart ends with the same parameters, bit for bit."""
    ends = {}
    for concept, flags in (("ring", ("--strategy", "allreduce")), ("sharded", ("--strategy", "sharded"))):
        name = f"elastic-{concept}"
        check(launch(2, RUN + list(flags) + run_args(jobs.root, name, "--exit-after-steps", "3"), env=jobs.env))
        resume = RUN + list(flags) + run_args(jobs.root, name, "--resume", "auto")
        proc = check(launch(3, resume, env=jobs.env, oversubscribe=True))
        assert "elastic: resumed with 3 workers from a checkpoint of 2" in proc.stdout + proc.stderr
        ends[concept] = jobs.params(name, 3)
    for mine in ends["sharded"]:
        assert identical(mine, ends["ring"][0])


@LONG
def test_grad_clip_is_applied_over_the_shards(jobs):
    clipped = jobs.params(jobs.sharded(2, 2, "--grad-clip", "0.05"), 2)
    ring = jobs.params(jobs.ring(2, "--grad-clip", "0.05"), 2)[0]
    assert identical(clipped[0], clipped[1])
    assert rel_diff(clipped[0], ring) < 1e-5  # the norm's last bits: see the module docstring
    assert rel_diff(ring, jobs.params(jobs.ring(2), 2)[0]) > 1e-3  # the clipping did clip


@pytest.mark.parametrize("stage", [pytest.param(2, id="stage2"), pytest.param(3, id="stage3", marks=LONG)])
def test_each_worker_holds_half_the_optimizer_state_and_gradients_of_the_ring_at_2_ranks(jobs, stage):
    """metrics.json's memory after the first step, per rank: half the gradients and AdamW's two moments of
    half the elements, and at stage 3 half the parameters (the tied weight once). A bucket of an odd number
    of elements gives one worker one element more; each segment of a parameter keeps a step counter (4
    bytes) of its own."""
    run = jobs.sharded(stage, 2)
    slack = 8 * jobs.metrics(run)["shard_buckets"]
    steps = 4 * (len(jobs.checkpoint(run)["optimizer"]["state"]) + jobs.metrics(run)["shard_buckets"])
    ring = jobs.metrics(jobs.ring(2))["memory"]["after_first_step"]
    for r, mine in zip(ring, jobs.metrics(run)["memory"]["after_first_step"], strict=True):
        assert abs(mine["grads"] - r["grads"] / 2) <= slack
        assert abs(mine["optimizer"] - r["optimizer"] / 2) <= slack + steps
        if stage == 3:  # its shards, and the NaN its freed parameters point at
            assert abs(mine["params"] - r["params"] / 2) <= slack + 4
        else:
            assert mine["params"] == r["params"]
