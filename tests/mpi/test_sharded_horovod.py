"""``--strategy sharded`` on Horovod's collectives (``--allreduce-engine horovod``, the default) with real ranks:
stages 1 and 2 end where the ring through Horovod ends on the same samples, with AdamW."""

import json

import pytest
import torch

from helpers import ENGINE_RUN, check, launch, load_params, rel_diff, run_args

pytestmark = [pytest.mark.mpi, pytest.mark.long]  # ~15 s a job: make test-long, .ci/run

# AdamW (its state is what stage 1 shards) at ENGINE_RUN's 12 steps; LeNet-5's ten tensors in buckets of at
# most 3,000 bytes, most of them not a multiple of 2 or 3 elements, so Horovod's shards differ in size
ADAMW = ENGINE_RUN + ["--optimizer", "adamw", "--lr", "0.002", "--weight-decay", "0.1"]
SHARDED = ["--strategy", "sharded", "--horovod-bucket-bytes", "3000"]


def same_on_every_rank(d, name, np):
    first = load_params(d / f"{name}-0.pt")
    for r in range(1, np):
        other = load_params(d / f"{name}-{r}.pt")
        assert all(torch.equal(other[k], first[k]) for k in first), f"{name}: rank {r} differs from rank 0"
    return first


@pytest.fixture(scope="module")
def ring(tmp_path_factory):
    """np -> a run dir holding the ring allreduce through Horovod at np ranks (run ``ring``), run once."""
    done = {}

    def run(np: int):
        if np not in done:
            d = tmp_path_factory.mktemp(f"hvd-ring-np{np}")
            check(launch(np, ADAMW + run_args(d, "ring"), oversubscribe=True))
            done[np] = d
        return done[np]

    return run


# At 2 ranks a sum is the same whatever the order and x / 2 is x * 0.5 (Horovod's Average): bit for bit.
# At 3 ranks MPI_Reduce_scatter and MPI_Allreduce add the three workers' gradients in orders of their own
# (Open MPI picks each algorithm), and the layer divides by 3 where Horovod multiplies by float32(1/3): the
# averaged gradients differ in their last bit on a share of the elements, and 12 AdamW steps carry that on.
@pytest.mark.parametrize("np, tol", [(2, 0.0), (3, 1e-5)])
@pytest.mark.parametrize("stage", [1, 2])
def test_sharded_stages_1_and_2_end_where_horovods_ring_ends(tmp_path, ring, np, tol, stage):
    name = f"s{stage}"
    check(launch(np, ADAMW + SHARDED + ["--shard-stage", str(stage)] + run_args(tmp_path, name), oversubscribe=True))
    mine = same_on_every_rank(tmp_path, name, np)
    ref = same_on_every_rank(ring(np), "ring", np)
    if tol == 0.0:
        assert all(torch.equal(mine[k], ref[k]) for k in ref)
    else:
        assert rel_diff(mine, ref) <= tol
    m = json.loads((tmp_path / name / "metrics.json").read_text())
    assert (m["strategy"], m["allreduce_engine"], m["shard_stage"], m["workers"]) == ("sharded", "horovod", stage, np)
