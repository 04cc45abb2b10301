"""A transformer from a library nobody here wrote -- Hugging Face's GPT-2 (examples/hf_gpt2: tied input and
output embeddings, an output object that is not a tensor) -- trained at 2 workers with AdamW, a cosine
schedule and bf16 autocast under every concept: the ring engines and their concepts end with identical
parameters on every rank (the engines equal to each other), the parameter server too when synchronous, and
its asynchronous mode trains; the checkpoint's weights load into a plain ``GPT2LMHeadModel`` and evaluate to
the run's own figure. make test-long (each job imports transformers on every rank: ~30 s apiece here)."""

from __future__ import annotations

import json
import math
import sys

import pytest
import torch

from helpers import ROOT, check, launch, load_params, run_args

pytestmark = [pytest.mark.mpi, pytest.mark.long]

# A 2-layer GPT-2 of width 64 over 60,000 characters (31 distinct) in windows of 32; 8 steps of batch 8 per
# worker, one evaluation at the end. The recipe: AdamW with decoupled decay on the matrices only, 2 warm-up
# steps then a cosine to a tenth, bf16 autocast on the CPU.
TASK = ["--task", "examples.hf_gpt2.task:build", "--model-arg", "max_chars=60000", "--model-arg", "block=32"]
RUN = ["--batch-size", "8", "--steps", "8", "--no-progress", "--log-every", "2", "--no-scale-lr"]
RECIPE = [
    "--optimizer",
    "adamw",
    "--lr",
    "0.005",
    "--weight-decay",
    "0.1",
    "--no-decay-norm-bias",
    "--lr-schedule",
    "cosine",
    "--warmup-steps",
    "2",
    "--min-lr",
    "0.0005",
    "--precision",
    "bf16-mixed",
]
MPI = ["--allreduce-engine", "mpi"]
# name -> (processes, flags); every job has 2 workers (a dedicated server is a third process)
RING = {
    "horovod": (2, []),
    "mpi": (2, MPI),
    "torch": (2, ["--allreduce-engine", "torch"]),
    "powersgd": (2, [*MPI, "--compression", "powersgd", "--powersgd-rank", "2"]),
    "diloco": (2, [*MPI, "--diloco-every", "4"]),  # 8 steps: the run ends on an outer step
}
PS = {
    f"ps-{placement}-{mode}": (
        2 if placement == "colocated" else 3,
        ["--strategy", "ps", "--ps-placement", placement, "--ps-mode", mode],
    )
    for mode in ("sync", "async")
    for placement in ("colocated", "dedicated")
}


def hf_task():
    """The task as the trainer builds it (examples/hf_gpt2 imported from the repository root)."""
    sys.path.insert(0, str(ROOT))
    from examples.hf_gpt2.task import build

    return build(max_chars=60000, block=32)


def job(d, name: str, np: int, flags: list[str]) -> dict:
    check(launch(np, TASK + RUN + RECIPE + flags + run_args(d, name), oversubscribe=np > 2, timeout=400))
    return json.loads((d / name / "metrics.json").read_text())


def workers_params(d, name: str, np: int) -> list[dict[str, torch.Tensor]]:
    """Each worker's end parameters (a dedicated server is rank 0, its workers the ranks after it)."""
    return [load_params(d / f"{name}-{r}.pt") for r in range(np - 2, np)]


def assert_identical(name: str, ranks: list[dict[str, torch.Tensor]]) -> None:
    for k in ranks[0]:
        assert torch.equal(ranks[0][k], ranks[1][k]), f"{name}: {k} differs between the workers"


def assert_trained(name: str, m: dict, chance: float) -> None:
    """The evaluation loss is finite and well below uniform guessing over the characters (GPT-2's
    initialisation, weights of std 0.02, starts there)."""
    loss = m["final"]["eval_loss"]
    assert math.isfinite(loss) and loss < chance - 0.3, (name, loss, chance)
    assert (m["optimizer"], m["lr_schedule"], m["precision"], m["workers"]) == ("AdamW", "cosine", "bf16-mixed", 2)


@pytest.fixture(scope="module")
def chance() -> float:
    return math.log(len(hf_task().text.chars))


@pytest.fixture(scope="module")
def ring_runs(tmp_path_factory):
    d = tmp_path_factory.mktemp("hf_ring")
    return d, {name: job(d, name, np, flags) for name, (np, flags) in RING.items()}


@pytest.fixture(scope="module")
def ps_runs(tmp_path_factory):
    d = tmp_path_factory.mktemp("hf_ps")
    return d, {name: job(d, name, np, flags) for name, (np, flags) in PS.items()}


def test_hf_gpt2_trains_the_recipe_under_every_ring_concept_with_ranks_bit_identical(ring_runs, chance):
    d, metrics = ring_runs
    hvd = workers_params(d, "horovod", 2)[0]
    for name, (np, _) in RING.items():
        ranks = workers_params(d, name, np)
        assert_identical(name, ranks)
        assert_trained(name, metrics[name], chance)
        if name in ("mpi", "torch"):  # each engine averages the same two float32 gradients: the same bits
            for k in hvd:
                assert torch.equal(ranks[0][k], hvd[k]), f"{name}: {k} differs from Horovod's"
    # the tied embedding is one parameter: it left training as one tensor under both names
    assert torch.equal(hvd["lm_head.weight"], hvd["transformer.wte.weight"])


def test_hf_gpt2_checkpoint_exports_and_loads_into_a_plain_gpt2_evaluating_to_the_runs_figure(ring_runs, tmp_path):
    """``python -m allreduce_train export RUN_DIR`` writes a plain ``state_dict``: a freshly built
    ``GPT2LMHeadModel`` takes it (strictly) and, evaluated as the workers did (two halves of the evaluation
    text, bf16 autocast), gives the run's final evaluation loss."""
    import subprocess
    import sys

    import torch.nn.functional as F
    from transformers import GPT2LMHeadModel

    d, metrics = ring_runs
    task = hf_task()
    out = tmp_path / "gpt2.pt"
    cmd = [sys.executable, "-m", "allreduce_train", "export", str(d / "horovod"), "--out", str(out)]
    check(subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120))
    saved = torch.load(out, weights_only=True)
    model = GPT2LMHeadModel(task.config)
    model.load_state_dict(saved)
    model.eval()
    _, eval_set = task.datasets()
    n, total, count = len(eval_set), 0.0, 0
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        for lo, hi in ((0, n // 2), (n // 2, n)):  # each worker's share in one batch
            x = torch.stack([eval_set[i][0] for i in range(lo, hi)])
            y = torch.stack([eval_set[i][1] for i in range(lo, hi)])
            logits = model(input_ids=x).logits.float()
            total += F.cross_entropy(logits.flatten(0, 1), y.flatten(), reduction="sum").item()
            count += y.numel()
    assert total / count == pytest.approx(metrics["horovod"]["final"]["eval_loss"], abs=1e-4)


def test_hf_gpt2_trains_the_recipe_on_the_parameter_server(ps_runs, ring_runs, chance):
    """Synchronous, colocated and dedicated: the workers end identical, and equal to the mpi ring's (the
    servers run AdamW on their shards of the same averaged gradient: elementwise, the same bits).
    Asynchronous: it trains (each worker's last pull may differ: the other's pushes land in between)."""
    d, metrics = ps_runs
    ring = workers_params(ring_runs[0], "mpi", 2)[0]
    for name, (np, _) in PS.items():
        ranks = workers_params(d, name, np)
        assert_trained(name, metrics[name], chance)
        mode = name.rsplit("-", 1)[1]
        assert metrics[name]["ps_mode"] == mode
        if mode == "sync":
            assert_identical(name, ranks)
            for k in ring:
                assert torch.equal(ranks[0][k], ring[k]), f"{name}: {k} differs from the mpi ring's"
