"""The training loop in one process, through the single-process exchange (no mpirun)."""

import json

import pytest
import torch

from allreduce_train.data.images import ShardedBatches, synthetic
from allreduce_train.distributed.local import LocalExchange
from allreduce_train.errors import ConfigError
from allreduce_train.optim import LRSchedule
from allreduce_train.run_logger import RunLogger
from allreduce_train.trainer import Trainer
from models import MODELS

from helpers import parse

ARGS = [
    "--model",
    "lenet5",
    "--dataset",
    "synthetic",
    "--synthetic-samples",
    "640",
    "--batch-size",
    "32",
    "--steps",
    "12",
    "--eval-every",
    "6",
    "--log-every",
    "3",
    "--warmup-steps",
    "4",
    "--no-progress",
    "--threads",
    "1",
]


def lr_at(step: int, cfg, workers: int, steps_per_epoch: int) -> float:
    """The trainer's LR (--lr's group) for the update after ``step`` steps."""
    return LRSchedule.make(cfg.optim, workers, 0, steps_per_epoch).lr(step, cfg.optim.lr)


def train(tmp_path, extra=(), name="run"):
    cfg = parse([*ARGS, "--run-dir", str(tmp_path), *extra])
    trainer = Trainer(cfg, LocalExchange(), str(tmp_path / name))
    (tmp_path / name).mkdir(exist_ok=True)
    setup = trainer.build()
    log = RunLogger(str(tmp_path / name), setup.total_steps, setup.start_step, tensorboard=False, progress=False)
    result = trainer.run(setup, log)
    result["run_dir"] = str(tmp_path / name)
    trainer.report(result, log)
    log.close()
    return setup.model, result


def test_the_loop_is_plain_sgd_with_warm_up_on_the_shard_order(tmp_path):
    model, result = train(tmp_path)
    cfg = parse([*ARGS, "--run-dir", str(tmp_path)])
    spec = MODELS["lenet5"]
    torch.manual_seed(cfg.train.seed)
    ref = spec.build()
    opt = torch.optim.SGD(ref.parameters(), lr=cfg.optim.lr, momentum=cfg.optim.momentum)
    train_set, _ = synthetic(spec.input_shape, spec.num_classes, 640, cfg.train.seed)
    batches = ShardedBatches(train_set, 32, 0, 1, cfg.train.seed)
    step = 0
    for epoch in range(2):
        for x, y in batches.batches(epoch):
            if step == 12:
                break
            for group in opt.param_groups:
                group["lr"] = lr_at(step, cfg, 1, batches.steps_per_epoch)
            opt.zero_grad()
            torch.nn.functional.cross_entropy(ref(x), y).backward()
            opt.step()
            step += 1
    for (name, p), q in zip(model.state_dict().items(), ref.state_dict().values(), strict=True):
        assert torch.equal(p, q), name
    assert result["steps"] == 12 and result["completed"] and result["strategy"] == "local"


def test_metrics_json_and_the_done_line(tmp_path, capsys):
    train(tmp_path)
    saved = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert saved["steps"] == 12 and saved["workers"] == 1 and saved["global_batch"] == 32
    assert saved["samples_per_sec"] > 0 and saved["step_ms"] > 0
    assert set(saved["final"]) == {"train_loss", "eval_loss", "eval_accuracy"}
    assert "done: 12 steps, eval loss" in capsys.readouterr().out


def test_exit_after_steps_then_resume_ends_bit_identical(tmp_path):
    whole, _ = train(tmp_path, name="whole")
    train(tmp_path, ["--exit-after-steps", "5", "--checkpoint-every", "100"], name="parts")
    again, result = train(tmp_path, ["--resume", "auto"], name="parts")
    assert result["steps"] == 12
    for (name, p), q in zip(whole.state_dict().items(), again.state_dict().values(), strict=True):
        assert torch.equal(p, q), name


def test_the_checkpoint_keeps_its_format_and_one_written_before_its_later_keys_resumes_alike(tmp_path):
    whole, _ = train(tmp_path, name="whole")
    train(tmp_path, ["--exit-after-steps", "5", "--checkpoint-every", "100"], name="parts")
    path = tmp_path / "parts" / "checkpoint.pt"
    state = torch.load(path, map_location="cpu", weights_only=True)
    # what every earlier version wrote and read: a change here needs a version field and a reader of the old
    assert set(state) == {"model", "optimizer", "step", "config", "workers", "lr_schedule", "precision", "best"}
    assert state["step"] == 5 and [set(w) - {"cuda_rng"} for w in state["workers"]] == [{"rng", "task", "exchange"}]
    # as written before the loss scaler, the LR recipe, --keep-best and the wire formats' state
    old = {key: state[key] for key in ("model", "optimizer", "step", "config")}
    old["workers"] = [{"rng": w["rng"], "task": w["task"]} for w in state["workers"]]
    torch.save(old, path)
    again, result = train(tmp_path, ["--resume", "auto"], name="parts")
    assert result["steps"] == 12
    for (name, p), q in zip(whole.state_dict().items(), again.state_dict().values(), strict=True):
        assert torch.equal(p, q), name


def test_zaremba_schedule_halves_the_lr_after_every_epoch_past_the_fourth():
    cfg = parse(["--model", "ptb-lstm-small"])
    assert (cfg.train.epochs, cfg.optim.lr_decay, cfg.optim.lr_decay_after) == (13, 0.5, 4)
    spe = 100
    lrs = [lr_at(epoch * spe, cfg, 4, spe) for epoch in range(7)]
    assert lrs == [20.0, 20.0, 20.0, 20.0, 10.0, 5.0, 2.5]  # not scaled by the 4 workers: the recipe's --no-scale-lr
    assert lr_at(5 * spe - 1, cfg, 4, spe) == 10.0  # constant within an epoch


def test_warm_up_then_constant_without_decay():
    cfg = parse(["--lr", "0.1", "--warmup-steps", "10"])
    assert [lr_at(s, cfg, 2, 50) for s in (0, 5, 10, 500)] == [
        0.1,
        pytest.approx(0.15),
        pytest.approx(0.2),
        pytest.approx(0.2),
    ]


def test_a_target_stops_the_run_and_records_the_time_to_it(tmp_path):
    # the run is deterministic: the evaluations of a full run tell where a target will be met
    _, full = train(tmp_path, ["--eval-every", "2"], name="full")
    goal = full["evals"][2]["eval_loss"]
    expect = next(e["step"] for e in full["evals"] if e["eval_loss"] <= goal)
    _, result = train(tmp_path, ["--eval-every", "2", "--target", f"eval/loss<={goal!r}"], name="tta")
    t = result["target"]
    assert t["reached"] and t["step"] == result["steps"] == expect < 12
    assert [e["eval_loss"] for e in result["evals"]] == [e["eval_loss"] for e in full["evals"][: len(result["evals"])]]
    assert 0 < t["seconds"] == result["evals"][-1]["seconds"]
    assert json.loads((tmp_path / "tta" / "metrics.json").read_text())["target"]["step"] == expect
    assert "target" not in full and len(full["evals"]) == 6


def test_an_unreadable_target_names_the_flag():
    with pytest.raises(ConfigError, match=r"--target 'accuracy>0\.9'"):
        parse(["--target", "accuracy>0.9"])


def test_flush_denormal_turns_underflowing_floats_to_zero_and_is_off_by_default(tmp_path):
    tiny = torch.tensor([1e-40])  # a float32 denormal
    if not torch.set_flush_denormal(True):
        pytest.skip("this CPU cannot flush denormals (torch.set_flush_denormal needs SSE3)")
    torch.set_flush_denormal(False)
    try:
        train(tmp_path, name="keep")
        assert (tiny * 1.0).item() != 0  # torch's default: denormals are kept
        train(tmp_path, extra=["--flush-denormal"], name="flush")
        assert (tiny * 1.0).item() == 0
    finally:
        torch.set_flush_denormal(False)  # a process-wide setting: leave the other tests torch's default
