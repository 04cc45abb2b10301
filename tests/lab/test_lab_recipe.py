"""The lab follows the recipe: `bench`, `time-to-accuracy` and `recommend` take the trainer's recipe flags (its
[optim] fields and --precision, made from the trainer's config), give them to every training job they start,
refuse a bad recipe in one line before any job, and their reports name the recipe and what the jobs ran."""

import argparse
import dataclasses
import json
import os
import subprocess
import sys

import pytest
import torch

from allreduce_train.cli import make_parser as train_parser
from allreduce_train.config import OptimConfig, build_config
from lab.__main__ import make_parser as lab_parser
from lab.common import recipe, usermodel
from models import MODELS

from helpers import ROOT, lab_in_process

# A transformer's recipe, every kind of flag: a choice, a string, floats, an int, a negated bool
ADAMW = [
    "--optimizer",
    "adamw",
    "--betas",
    "0.9,0.95",
    "--weight-decay",
    "0.1",
    "--no-decay-norm-bias",
    "--lr-schedule",
    "cosine",
    "--warmup-steps",
    "5",
    "--min-lr",
    "0.001",
    "--precision",
    "bf16-mixed",
]
COMMANDS = ("bench", "time-to-accuracy", "recommend")


def subparser(parser: argparse.ArgumentParser, name: str) -> argparse.ArgumentParser:
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return sub.choices[name]


def recipe_actions(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    return {a.dest: a for a in parser._actions if a.dest.startswith(("optim.", "train.precision"))}


def trainer_config(args):
    return build_config(train_parser().parse_args(["train", *args]))


def lab_args(command, *argv):
    return lab_parser().parse_args([command, *argv])


def test_every_lab_command_offers_the_trainers_recipe_flags_with_the_trainers_help():
    train = recipe_actions(subparser(train_parser(), "train"))
    want = {f"optim.{f.name}" for f in dataclasses.fields(OptimConfig)} | {"train.precision"}
    assert set(train) == want  # the trainer's own flags: what the lab must offer
    for command in COMMANDS:
        mine = recipe_actions(subparser(lab_parser(), command))
        assert set(mine) == want, command
        for dest, action in mine.items():
            assert action.option_strings == train[dest].option_strings, dest
            assert action.help == train[dest].help and action.choices == train[dest].choices, dest
            assert action.default is None  # not given: not passed, so the trainer's default stands


def test_the_flags_given_reach_the_trainers_configuration_and_nothing_else_is_passed():
    args = lab_args("bench", *ADAMW[7:], *ADAMW[:7])  # any order: the trainer's field order comes back
    flags = recipe.argv(args)
    assert flags == ADAMW
    cfg = trainer_config(["--model", "lenet5", *flags])
    o = cfg.optim
    assert (o.optimizer, o.betas, o.weight_decay, o.decay_norm_bias) == ("adamw", "0.9,0.95", 0.1, False)
    assert (o.lr_schedule, o.warmup_steps, o.min_lr, cfg.train.precision) == ("cosine", 5, 0.001, "bf16-mixed")
    # repeatable and positive flags as the trainer spells them
    args = lab_args("bench", "--optimizer", "pkg.opt:make", "--optimizer-arg", "a=1", "--optimizer-arg", "b=2")
    assert recipe.argv(args) == ["--optimizer", "pkg.opt:make", "--optimizer-arg", "a=1", "--optimizer-arg", "b=2"]
    assert recipe.argv(lab_args("bench", "--scale-lr", "--decay-norm-bias")) == ["--decay-norm-bias", "--scale-lr"]
    # nothing given, nothing passed: the LSTM keeps its own recipe (Zaremba's SGD at lr 20 without momentum)
    assert recipe.argv(lab_args("time-to-accuracy")) == []
    lstm = trainer_config(["--model", "ptb-lstm-small", *recipe.argv(lab_args("time-to-accuracy"))]).optim
    assert (lstm.optimizer, lstm.lr, lstm.momentum) == ("sgd", 20.0, 0.0)


@pytest.mark.heavy
def test_bench_gives_the_recipe_to_the_trainer_and_to_the_bare_loops_which_build_the_same_optimizer():
    from lab.bench.loops import add_arguments, with_recipe
    from lab.bench.main import BenchSpec, job_args

    spec = BenchSpec(models=["lenet5"], recipe=ADAMW)
    for impl in ("trainer", "ring-mpi", "ps-sync-colocated", "bound"):
        _, args = job_args(impl, "lenet5", spec, "", "/tmp/r", "x")
        cfg = trainer_config(args)
        # after bench's own settings (--weight-decay 0): the user's recipe wins
        assert (cfg.optim.optimizer, cfg.optim.weight_decay, cfg.optim.lr_schedule) == ("adamw", 0.1, "cosine"), impl
        assert cfg.train.precision == "bf16-mixed" and not cfg.optim.decay_norm_bias, impl
    p = argparse.ArgumentParser()
    add_arguments(p)
    for impl in ("horovod", "ddp"):
        _, args = job_args(impl, "lenet5", spec, "/tmp/r.json", "/tmp/r", "x")
        got = p.parse_args(args)
        torch.manual_seed(0)
        model = MODELS["lenet5"].build()
        opt, loss, precision = with_recipe(usermodel.from_args("lenet5", dataset="synthetic"), got, model, None, None)
        # the trainer's optimizer: AdamW, the matrices decayed, biases in a group without decay
        assert type(opt) is torch.optim.AdamW and precision == "bf16-mixed"
        assert [g["weight_decay"] for g in opt.param_groups] == [0.1, 0.0]
        assert opt.param_groups[0]["betas"] == (0.9, 0.95)
        assert all(p.dim() >= 2 for p in opt.param_groups[0]["params"])
        assert all(p.dim() < 2 for p in opt.param_groups[1]["params"])
        # the forward pass under the trainer's autocast: a linear layer computes in bfloat16
        seen: list[torch.dtype] = []
        linear = next(m for m in model.modules() if isinstance(m, torch.nn.Linear))
        linear.register_forward_hook(lambda m, i, o, seen=seen: seen.append(o.dtype))
        value = loss(model, torch.randn(4, 1, 28, 28), torch.tensor([0, 1, 2, 3]))
        assert seen == [torch.bfloat16] and torch.isfinite(value)
    # without recipe flags the bare loops keep their SGD with momentum 0.9 in float32
    _, args = job_args("horovod", "lenet5", BenchSpec(models=["lenet5"]), "/tmp/r.json", "/tmp/r", "x")
    model = MODELS["lenet5"].build()
    opt, loss, precision = with_recipe(
        usermodel.from_args("lenet5", dataset="synthetic"), p.parse_args(args), model, None, None
    )
    assert type(opt) is torch.optim.SGD and opt.param_groups[0]["momentum"] == 0.9 and precision == "32"
    assert loss is None  # the registered model's plain loss


@pytest.mark.heavy
def test_time_to_accuracy_gives_every_job_the_recipe_before_its_extra_flags():
    from lab.tta.main import config_from_args, steps_per_epoch, trainer_args
    from lab.tta.spec import methods

    args = ["--models", "lenet5", "--methods", "ring-mpi,ring-mpi-diloco-h16", *ADAMW, "--extra=--lr=0.003"]
    cfg = config_from_args(lab_args("time-to-accuracy", *args))
    assert cfg.recipe == ADAMW
    for name in cfg.methods:
        tc = trainer_config(trainer_args(cfg, "lenet5", methods()[name], "/tmp/r", "x", 10))
        assert (tc.optim.optimizer, tc.optim.lr_schedule, tc.train.precision) == ("adamw", "cosine", "bf16-mixed")
        assert tc.optim.lr == 0.003 and tc.optim.weight_decay == 0.1, name
    assert steps_per_epoch(cfg, "lenet5", 2) == 60_000 // 128  # the trainer's own data under the recipe's flags


def tta_results(config_recipe, job_recipes):
    from lab.tta.report import metric_key

    acc = "eval/accuracy>=0.8"
    jobs = [
        {
            "model": "lenet5",
            "method": method,
            "workers": 1,
            "repeat": 1,
            "ok": True,
            "hosts": "this machine",
            "target": acc,
            "evals": [{"step": 10, "seconds": 2.0, metric_key(acc): 0.85}],
            "log": "logs/x.log",
            "steps": 10,
            "samples_per_sec": 100.0,
            "loadavg_before": 0.5,
            "final": {metric_key(acc): 0.85},
            "reached": True,
            "steps_to_target": 10,
            "seconds_to_target": 2.0,
            "epochs_to_target": 0.1,
            **({"recipe": r} if r else {}),
        }
        for method, r in job_recipes.items()
    ]
    return {
        "started": "t",
        "minutes": 1.0,
        "command": ["python"],
        "out_dir": "out",
        "notes": [],
        "machine": {"cores": 2, "platform": "linux"},
        "targets": {"lenet5": acc},
        "what": {"lenet5": "test"},
        "config": {"seed": 1, "evals_per_epoch": 4, "emulate_from": 0, "link_rate": "1gbit", "recipe": config_recipe},
        "jobs": jobs,
    }


def test_the_time_to_accuracy_report_names_the_recipe_and_what_each_job_ran(tmp_path):
    from lab.tta.report import markdown, write_csv

    same = "AdamW, cosine schedule, bf16-mixed"
    res = tta_results(ADAMW, {"ring-mpi": same, "ring-mpi-fp16": same})
    text = markdown(res)
    assert f"Recipe: `{' '.join(ADAMW)}` given to every training job." in text
    assert f"- {same}: every job" in text
    # no recipe flags: the trainer's defaults, and a job that ran another optimizer (DiLoCo's AdamW) is named
    res = tta_results([], {"ring-mpi": "SGD, step schedule, 32", "ring-mpi-diloco-h16": "AdamW, step schedule, 32"})
    text = markdown(res)
    assert "Recipe: the trainer's defaults (no recipe flag given): --optimizer sgd (momentum 0.9)" in text
    assert "- SGD, step schedule, 32: ring-mpi\n- AdamW, step schedule, 32: ring-mpi-diloco-h16" in text
    # a grid from before the recipe flags recorded nothing: the report says so
    assert "not recorded" in markdown(tta_results([], {"ring-mpi": ""}))
    write_csv(str(tmp_path / "r.csv"), res["jobs"])
    rows = (tmp_path / "r.csv").read_text().splitlines()
    assert "recipe" in rows[0].split(",") and '"AdamW, step schedule, 32"' in rows[2]


def steps_grid(tmp_path, grid_recipe):
    ran = "AdamW, cosine schedule, bf16-mixed"
    jobs = [
        {
            "model": "lenet5",
            "method": m,
            "workers": 2,
            "ok": True,
            "reached": True,
            "steps_to_target": s,
            "seconds_to_target": t,
            "link_rate": "1gbit",
            "step_ms": 50.0,
            "comm_wait_ms": 10.0,
            "recipe": ran,
        }
        for m, s, t in (("ring-mpi", 100, 10.0), ("ring-mpi-fp16", 100, 9.0), ("ring-mpi-localsgd-h4", 180, 14.0))
    ]
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "results.json").write_text(json.dumps({"config": {"recipe": grid_recipe}, "jobs": jobs}))
    return tmp_path


def test_recommend_measures_its_steps_under_the_recipe():
    from lab.recommend.main import steps_grid_argv
    from lab.tta.main import config_from_args, trainer_args
    from lab.tta.spec import methods

    w = usermodel.from_args("lenet5")
    argv = steps_grid_argv(w, "eval/accuracy>=0.8", ["fp32", "fp16"], "1gbit", "/tmp/o", 2, 4, [], 32, ADAMW)
    assert argv[1:4] == ["-m", "lab", "time-to-accuracy"]
    cfg = config_from_args(lab_args(*argv[3:]))  # the grid's own parser and checks take the command
    assert cfg.recipe == ADAMW
    tc = trainer_config(trainer_args(cfg, "lenet5", methods()["ring-mpi-fp16"], "/tmp/r", "x", 10))
    assert (tc.optim.optimizer, tc.optim.lr_schedule, tc.train.precision) == ("adamw", "cosine", "bf16-mixed")
    assert tc.data.batch_size == 32  # the batch whose compute was measured


@pytest.mark.heavy
def test_recommend_takes_steps_from_a_grid_of_the_same_recipe_names_it_and_refuses_another(tmp_path, capsys):
    base = ["recommend", "--model", "lenet5", "--target", "eval/accuracy>=0.8", "--compute-ms", "5"]
    base += ["--workers", "8", "--link", "10gbit", "--methods", "fp16,localsgd-h4"]
    other = steps_grid(tmp_path / "sgd", [])
    code, err = lab_in_process(capsys, *base, "--steps-from", str(other), "--out", str(tmp_path / "a"), *ADAMW)
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert f"--steps-from {other}: its grid ran under the trainer's defaults" in err and "--optimizer adamw" in err

    mine = steps_grid(tmp_path / "adamw", ADAMW)
    code, err = lab_in_process(capsys, *base, "--steps-from", str(mine), "--out", str(tmp_path / "b"), *ADAMW)
    assert code == 0, err
    report = (tmp_path / "b" / "report.md").read_text()
    assert f"recipe            `{' '.join(ADAMW)}` given to every training job" in report
    assert "[the steps grid ran: AdamW, cosine schedule, bf16-mixed: every job]" in report


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize(
    "bad, needle",
    [
        (["--optimizer", "nope"], "--optimizer: unknown value 'nope'"),
        (["--optimizer", "os:getcwd"], "--optimizer os:getcwd raised TypeError"),  # a callable that raises
        (["--betas", "0.9"], "--betas '0.9'"),
        (["--precision", "16-mixed"], "--precision 16-mixed needs a CUDA device"),
    ],
)
def test_a_bad_recipe_is_one_line_before_any_job(capsys, tmp_path, command, bad, needle):
    if bad[-1] == "16-mixed" and torch.cuda.is_available():
        pytest.skip("a CUDA device is visible: 16-mixed is a recipe here")
    own = {
        "bench": ["--np", "1", "--out", str(tmp_path / "o")],
        "time-to-accuracy": ["--models", "lenet5", "--out-dir", str(tmp_path / "o")],
        "recommend": ["--model", "lenet5", "--target", "eval/accuracy>=0.8", "--out", str(tmp_path / "o")],
    }[command]
    code, err = lab_in_process(capsys, command, *own, *bad)
    assert code == 2 and len(err.strip().splitlines()) == 1 and needle in err, err
    assert not (tmp_path / "o").exists() or not any((tmp_path / "o").rglob("*.json"))  # no job ran


@pytest.mark.long  # two real jobs of the bench (~15 s): make test-long, .ci/run
@pytest.mark.mpi
def test_a_bench_under_adamw_cosine_and_bf16_runs_them_in_the_trainer_and_the_bare_loop(tmp_path):
    out = tmp_path / "bench"
    flags = ["--optimizer", "adamw", "--lr-schedule", "cosine", "--precision", "bf16-mixed"]
    proc = subprocess.run(
        [sys.executable, "-m", "lab", "bench", "--np", "1", "--impls", "trainer,horovod", "--repeats", "1"]
        + ["--steps", "3", "--warmup", "1", "--out", str(out), *flags],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    report = json.loads((out / "bench.json").read_text())
    ran = {j["impl"]: j["recipe"] for j in report["jobs"]}
    assert ran == {"trainer": "AdamW, cosine schedule, bf16-mixed", "horovod": "AdamW, constant schedule, bf16-mixed"}
    (trainer,) = [j for j in report["jobs"] if j["impl"] == "trainer"]
    i = trainer["command"].index("--name")
    metrics = json.loads((out / "jobs" / trainer["command"][i + 1] / "metrics.json").read_text())
    assert (metrics["optimizer"], metrics["lr_schedule"], metrics["precision"]) == ("AdamW", "cosine", "bf16-mixed")
    assert f"Recipe: `{' '.join(flags)}` given to every training job." in proc.stdout
    assert "- AdamW, cosine schedule, bf16-mixed: trainer" in proc.stdout
