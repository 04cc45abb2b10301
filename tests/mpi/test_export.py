"""Checkpoints the ecosystem can load, with real ranks: a 2-rank run's weights exported and scored by plain
PyTorch, new runs started from them (--init-from: weights only, step 0, a fresh optimizer and schedule), and
the checkpoints a run keeps beside the latest (--keep-checkpoints, --keep-best) across a resume."""

import json
import os
import subprocess
import sys

import pytest
import torch

from helpers import ROOT, SHARED_RUN, check, launch, load_params, parse, rel_diff, run_args

pytestmark = pytest.mark.mpi

RUN = SHARED_RUN + ["--batch-size", "16"]  # sync_run's flags (tests/mpi/conftest.py)

# Plain PyTorch, as a user elsewhere runs it: the model class from models/ (torch only), the weights by
# torch.load, the evaluation written out here; nothing of the trainer is imported (checked at the end).
PLAIN_EVAL = r"""
import sys

import torch
import torch.nn.functional as F

from models import MODELS

weights, evaluation = sys.argv[1:3]
model = MODELS["lenet5"].build()
model.load_state_dict(torch.load(weights, weights_only=True))
data = torch.load(evaluation, weights_only=True)
with torch.no_grad():
    loss = F.cross_entropy(model.eval()(data["inputs"]), data["targets"]).item()
ours = sorted(m for m in sys.modules if m.split(".")[0] in ("allreduce_train", "lab", "launch", "horovod", "mpi4py"))
assert not ours, ours
print(loss)
"""


def run(*argv: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, *argv], cwd=ROOT, capture_output=True, text=True, timeout=timeout, env=os.environ
    )


@pytest.fixture(scope="module")
def exported(sync_run, tmp_path_factory):
    """sync_run's weights (its checkpoint.pt at step 20), exported through the command line."""
    out = tmp_path_factory.mktemp("export") / "lenet5.pt"
    proc = check(run("-m", "allreduce_train", "export", str(sync_run / "sync"), "--out", str(out)))
    assert f"from {sync_run / 'sync' / 'checkpoint.pt'}, step 20" in proc.stdout
    return out


def test_exported_weights_load_into_plain_torch_and_score_the_runs_final_evaluation(sync_run, exported, tmp_path):
    from allreduce_train.tasks import make_task

    sd = torch.load(exported, weights_only=True)
    dumped = load_params(sync_run / "sync-0.pt")  # rank 0's parameters at the end of the run
    assert sd.keys() == dumped.keys() and all(torch.equal(sd[k], dumped[k]) for k in sd)
    cfg = parse(RUN)
    _, evaluation = make_task(cfg).shards(cfg, 0, 1)  # the whole evaluation set, both workers' shares
    torch.save({"inputs": evaluation.inputs, "targets": evaluation.targets}, tmp_path / "eval.pt")
    proc = check(run("-c", PLAIN_EVAL, str(exported), str(tmp_path / "eval.pt")))
    final = json.loads((sync_run / "sync" / "metrics.json").read_text())["final"]["eval_loss"]
    # the trainer summed the two workers' shares in float64 batch by batch; here one float32 mean
    assert float(proc.stdout) == pytest.approx(final, rel=1e-5)


# One step of fine-tuning with a warm-up and the LR scaled by the 2 workers: at step 0 the warm-up's LR is
# the one-worker LR, 0.05; a run that went on from the source's step 20 would step at 0.1.
FINE_TUNE = ["--steps", "1", "--warmup-steps", "10", "--scale-lr", "--checkpoint-every", "1"]
FIRST_LR = 0.05


@pytest.fixture(scope="module")
def fine_tuned(sync_run, exported, tmp_path_factory):
    """Two fine-tuning runs of one step at 2 ranks (Horovod), one from the export and one from sync_run's
    checkpoint.pt (which also holds its momentum buffers and step): run dirs ``from-export``, ``from-checkpoint``."""
    d = tmp_path_factory.mktemp("init-from")
    for name, source in (("from-export", exported), ("from-checkpoint", sync_run / "sync" / "checkpoint.pt")):
        check(launch(2, RUN + FINE_TUNE + run_args(d, name, "--init-from", str(source))))
    return d


def test_init_from_starts_at_step_0_from_the_files_weights_with_a_fresh_optimizer_and_schedule(exported, fine_tuned):
    from models import MODELS

    start = torch.load(exported, weights_only=True)
    saved = torch.load(fine_tuned / "from-export" / "checkpoint.pt", weights_only=True)
    assert saved["step"] == 1  # counted from 0, not from the source's 20
    assert json.loads((fine_tuned / "from-export" / "metrics.json").read_text())["steps"] == 1
    # SGD's first step from a fresh state: momentum buffer = gradient, p1 = p0 - lr * buffer. So p1 + lr * buffer
    # gives back p0, the file's weights, and lr is the warm-up's first (the schedule restarted too).
    names = [n for n, _ in MODELS["lenet5"].build().named_parameters()]
    buffers = saved["optimizer"]["state"]
    for i, name in enumerate(names):
        back = saved["model"][name] + FIRST_LR * buffers[i]["momentum_buffer"]
        assert torch.allclose(back, start[name], rtol=1e-5, atol=1e-6), name
    assert not all(
        torch.allclose(saved["model"][n] + 2 * FIRST_LR * buffers[i]["momentum_buffer"], start[n], rtol=1e-5, atol=1e-6)
        for i, n in enumerate(names)
    )
    torch.manual_seed(42)  # what a run without --init-from starts from (--seed 42): far from the file
    assert rel_diff(MODELS["lenet5"].build().state_dict(), start) > 1e-2


def test_init_from_a_checkpoint_takes_its_weights_only(fine_tuned):
    """From sync_run's checkpoint.pt (momentum buffers and step 20 in it) the run is the one from the
    exported weights, bit for bit, on both ranks: neither the optimizer state nor the step came along."""
    for rank in (0, 1):
        a = load_params(fine_tuned / f"from-export-{rank}.pt")
        b = load_params(fine_tuned / f"from-checkpoint-{rank}.pt")
        assert all(torch.equal(a[k], b[k]) for k in a), rank
    a, b = (torch.load(fine_tuned / n / "checkpoint.pt", weights_only=True) for n in ("from-export", "from-checkpoint"))
    assert b["step"] == 1
    for i, s in a["optimizer"]["state"].items():
        assert torch.equal(s["momentum_buffer"], b["optimizer"]["state"][i]["momentum_buffer"])


@pytest.mark.parametrize(
    "concept, workers",
    [
        pytest.param(["--strategy", "none"], (0, 1), id="none"),
        # rank 0 serves, rank 1 trains; make test-long (the property is make test's under the two others)
        pytest.param(["--strategy", "ps"], (1,), id="ps-dedicated", marks=pytest.mark.long),
    ],
)
def test_init_from_reaches_every_worker_under_other_exchanges(exported, tmp_path, concept, workers):
    """Only the main worker reads the file; every worker starts from it (a step at a vanishing LR barely moves
    them). Without the exchange (--strategy none) that took a broadcast of its own."""
    start = torch.load(exported, weights_only=True)
    flags = ["--steps", "1", "--lr", "1e-30", "--init-from", str(exported)]
    check(launch(2, RUN + concept + run_args(tmp_path, "ft", *flags)))
    for rank in workers:
        assert rel_diff(load_params(tmp_path / f"ft-{rank}.pt"), start) < 1e-6, rank


def test_init_from_another_models_weights_is_one_line_exit_2_and_leaves_no_run_directory(tmp_path):
    torch.save(torch.nn.Linear(3, 2).state_dict(), tmp_path / "other.pt")
    flags = ["--run-dir", str(tmp_path), "--name", "ft", "--init-from", str(tmp_path / "other.pt")]
    proc = launch(2, RUN + flags, timeout=90)
    assert proc.returncode == 2, proc.stderr
    ours = [ln for ln in proc.stderr.splitlines() if ln.startswith("allreduce_train: error")]
    assert len(ours) == 1, proc.stderr
    assert ours[0].startswith(f"allreduce_train: error: --init-from {tmp_path}/other.pt: not this model's weights: ")
    assert "10 missing (features.0.weight, features.0.bias, features.3.weight and 7 more)" in ours[0]
    assert "2 not in this model (weight, bias)" in ours[0]
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "ft").exists()


def test_kept_step_checkpoints_and_the_best_evaluation_survive_a_resume(tmp_path):
    """Cut at step 12 and resumed to 20, checkpoints every 4 steps, evaluations every 5: the latest plus the
    last 2 step files; checkpoint-best.pt holds the best evaluation by the target's metric and direction.
    The target (eval/loss>=100, never reached) makes the highest loss the best: the first evaluation, before
    the cut, which the resumed run beats only if it forgot it."""
    args = RUN + ["--checkpoint-every", "4", "--eval-every", "5", "--keep-checkpoints", "2"]
    args += ["--keep-best", "--target", "eval/loss>=100"]
    check(launch(2, args + run_args(tmp_path, "kept", "--exit-after-steps", "12")))
    d = tmp_path / "kept"
    evals = json.loads((d / "metrics.json").read_text())["evals"]
    assert sorted(os.listdir(d / "checkpoints")) == ["step-000008.pt", "step-000012.pt"]
    check(launch(2, args + run_args(tmp_path, "kept", "--resume", "auto")))
    evals += json.loads((d / "metrics.json").read_text())["evals"]
    assert [e["step"] for e in evals] == [5, 10, 15, 20]
    best = max(evals, key=lambda e: e["eval_loss"])
    assert best["step"] < 12, f"the loss did not fall, so this run cannot tell memory from forgetting: {evals}"

    assert sorted(os.listdir(d / "checkpoints")) == ["step-000016.pt", "step-000020.pt"]
    assert torch.load(d / "checkpoint.pt", weights_only=True)["step"] == 20
    assert os.path.samefile(d / "checkpoint.pt", d / "checkpoints" / "step-000020.pt")
    kept = torch.load(d / "checkpoint-best.pt", weights_only=True)
    assert kept["step"] == best["step"]
    assert kept["best"] == {"metric": "eval/loss", "op": ">=", "value": best["eval_loss"], "step": best["step"]}
    assert not [f for f in os.listdir(d) if f.endswith(".tmp")]
