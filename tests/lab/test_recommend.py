"""`recommend`: the plan on small inputs (winner to the target, sources, the steps ratio's worker count, the
cost model's untrusted region), the command end to end on a user's package with measured steps given, and
its one-line errors."""

import json
import os
import subprocess
import sys
import textwrap
from dataclasses import replace
from pathlib import Path

import pytest

from lab.common import costmodel, trust, usermodel
from lab.recommend.main import (
    Inputs,
    RecommendError,
    emulated_check,
    judge,
    measure_state_bytes,
    memory_need,
    parse_latency,
    parse_links,
    parse_size,
    plan,
    predict_cell,
    steps_from,
    summary,
    tta_method,
)

ROOT = Path(__file__).resolve().parents[2]
LINEAR = [(512, 1024), (1024,)]  # one matrix and its bias: 2.1 MB of float32 gradient
METHODS = ["fp32", "fp16", "localsgd-h4"]


def inputs(compute_s=0.010, ratios=None, latency_s=0.0):
    return Inputs(
        "pkg.net:build",
        LINEAR,
        compute_s,
        64,
        latency_s,
        ratios if ratios is not None else {"fp16": 1.0, "localsgd-h4": 1.5},
        sources={"compute": "given", "steps": "measured: x"},
    )


def test_time_to_target_is_the_steps_ratio_times_the_predicted_step():
    inp = inputs()
    c = predict_cell(inp, 8, 1e9 / 8, METHODS)  # 1 Gbit/s: the exchange dominates a 10 ms compute
    net = costmodel.Network(0.0, 1e9 / 8)
    step = {
        m: costmodel.predict_method(costmodel.Method.parse(m), costmodel.ALLREDUCE, 8, LINEAR, 0.010, 64, net).step_s
        for m in METHODS
    }
    assert c["time_vs_fp32"]["fp16"] == pytest.approx(step["fp16"] / step["fp32"])
    assert c["time_vs_fp32"]["localsgd-h4"] == pytest.approx(1.5 * step["localsgd-h4"] / step["fp32"])
    assert c["winner"] == min(c["time_vs_fp32"], key=c["time_vs_fp32"].get)
    assert not c["in_region"] and c["decided"]


def test_a_concept_that_needs_many_more_steps_loses_to_the_target_though_it_wins_per_step():
    slow_link = 100e6 / 8
    per_step = predict_cell(inputs(ratios={"fp16": 1.0, "localsgd-h4": 1.0}), 8, slow_link, METHODS)
    assert per_step["winner"] == "localsgd-h4"  # a quarter of the bytes per step
    to_target = predict_cell(inputs(ratios={"fp16": 1.0, "localsgd-h4": 5.0}), 8, slow_link, METHODS)
    assert to_target["winner"] == "fp16"


def test_a_concept_that_never_reached_the_target_is_not_ranked_and_is_named():
    c = predict_cell(inputs(ratios={"fp16": 1.0, "localsgd-h4": None}), 8, 1e9 / 8, METHODS)
    assert "localsgd-h4" not in c["time_vs_fp32"] and c["not_reached"] == ["localsgd-h4"]


def test_the_untrusted_region_is_where_the_exchange_is_shorter_than_the_compute():
    assert trust.in_region(exchange_s=0.002, compute_s=0.010)
    assert not trust.in_region(exchange_s=0.020, compute_s=0.010)
    # inside: a pick stands only by more than the measured miss; outside: always
    assert not trust.decisive(1.0, 1.4, exchange_s=0.002, compute_s=0.010)
    assert trust.decisive(1.0, trust.MISS * 1.01, exchange_s=0.002, compute_s=0.010)
    assert trust.decisive(1.0, 1.01, exchange_s=0.020, compute_s=0.010)
    assert trust.ps_colocated_untrusted(4) and not trust.ps_colocated_untrusted(2)


def test_a_compute_bound_cell_with_a_small_margin_is_not_decided():
    c = predict_cell(inputs(compute_s=1.0), 8, 100e9 / 8, METHODS)  # 100 Gbit/s, a 1 s compute
    assert c["in_region"] and not c["decided"]


def test_the_summary_names_every_source_and_where_the_steps_ratio_was_not_measured():
    inp = inputs(compute_s=1.0)
    cells = plan(inp, [2, 64], [("10gbit", 10e9 / 8), ("100mbit", 100e6 / 8)], METHODS)
    text = summary(inp, cells, METHODS, None)
    for needle in (
        "[given]",
        "[measured: x]",
        "[assumed: --latency]",
        "[modelled: costmodel.method_cost",
        "[measured here]",
    ):
        assert needle in text, needle
    rows = {ln.split("|")[1].strip(): ln for ln in text.splitlines() if ln.startswith("| 2 ") or ln.startswith("| 64 ")}
    assert " +" not in rows["2"] and " +" in rows["64"]  # measured at 2 workers: said at 64, not at 2
    assert "not extrapolated" in text and "not decided*" in text and "untrusted region" in text
    assert len(text.splitlines()) <= 24  # one screen


def test_parsers_name_their_flag():
    assert parse_latency("50us") == pytest.approx(50e-6) and parse_latency("1ms") == pytest.approx(1e-3)
    assert parse_links("10gbit,100mbit") == [("10gbit", 10e9 / 8), ("100mbit", 100e6 / 8)]
    with pytest.raises(RecommendError, match="--latency"):
        parse_latency("soon")
    with pytest.raises(RecommendError, match="--link"):
        parse_links("fast")


def test_sizes_read_as_slurm_and_the_si_write_them():
    assert parse_size("512MiB") == 512 * 2**20 and parse_size("16GiB") == 16 * 2**30
    assert parse_size("2G") == 2 * 2**30 and parse_size("16GB") == 16e9 and parse_size("100") == 100
    for bad in ("lots", "0G", "-1G", "2Q", "GiB"):
        with pytest.raises(RecommendError, match="--memory-per-rank"):
            parse_size(bad)


def test_the_fastest_that_fits_is_the_fastest_of_the_concepts_whose_shards_fit():
    # 525,312 parameters with AdamW (8 bytes of state each): replicated 16 bytes each (8.0 MiB); at 8 workers
    # zero1 holds 4 + 4 + 8/8 (4.5 MiB), zero2 4 + 4/8 + 8/8 (2.8 MiB), zero3 16/8 (1.0 MiB)
    ratios = {"fp16": 1.0, "zero1": 1.0, "zero2": 1.0, "zero3": 1.0}
    inp = replace(inputs(ratios=ratios), memory_limit=4 * 2**20, state_bytes_per_param=8.0)
    methods = ["fp32", "fp16", "zero1", "zero2", "zero3"]
    c = predict_cell(inp, 8, 1e9 / 8, methods)
    need = c["memory_need"]
    assert need["fp32"] == need["fp16"] == 16 * inp.n_params
    assert need["zero1"] == pytest.approx((8 + 1) * inp.n_params) and need["zero3"] == pytest.approx(2 * inp.n_params)
    assert need["zero1"] > inp.memory_limit > need["zero2"] > need["zero3"]
    assert c["fits"] == ["zero2", "zero3"]
    assert c["winner"] == "fp16"  # half the bytes: the fastest, but it holds the whole model
    assert c["fastest_fitting"] == "zero2"  # the ring's bytes and messages, beside zero3's 1.5x
    text = summary(inp, plan(inp, [8], [("1gbit", 1e9 / 8)], methods), methods, None)
    assert "fits in 4.0 MiB per rank" in text
    assert "| 8 | zero2 1.00 (not fp16) | fp32 8.0 MiB, fp16 8.0 MiB, zero1 4.5 MiB |" in text
    # plain SGD: no optimizer state; every concept fits in 4.1 MiB (fp32: 4 + 4 bytes per parameter, 4.0 MiB)
    sgd = replace(inp, memory_limit=4.1 * 2**20, state_bytes_per_param=0.0)
    assert predict_cell(sgd, 8, 1e9 / 8, methods)["fastest_fitting"] == "fp16"
    # nothing fits: said, with every need
    tiny = replace(inp, memory_limit=2**20)
    assert memory_need(tiny, "zero3", 8) > tiny.memory_limit
    assert "| 8 | none fits |" in summary(tiny, plan(tiny, [8], [("1gbit", 1e9 / 8)], methods), methods, None)


@pytest.mark.parametrize("flags, want", [(["--optimizer", "adamw"], 8), ([], 4), (["--momentum", "0"], 0)])
def test_the_optimizer_state_per_parameter_is_measured_from_the_recipes_optimizer(flags, want):
    w = usermodel.from_args("lenet5", dataset="synthetic")
    assert measure_state_bytes(w, flags) == want  # AdamW's two moments, SGD's momentum buffer, plain SGD none


# What lab/tta/main.py records for a job that failed (ok false, the job's one error line from lab/common/jobs.py)
CRASH = "allreduce_train: error on rank 0: IndexError: list index out of range"


def grid(tmp_path, reached=True, failed=()):
    jobs = [
        {
            "model": "userpkg.net:build",
            "method": m,
            "workers": 2,
            "ok": True,
            "reached": reached or m != "ring-mpi",
            "steps_to_target": s,
            "seconds_to_target": t,
            "link_rate": "1gbit",
            "step_ms": 50.0,
            "comm_wait_ms": 10.0,
        }
        for m, s, t in (("ring-mpi", 100, 10.0), ("ring-mpi-fp16", 100, 9.0), ("ring-mpi-localsgd-h4", 180, 14.0))
        if m not in failed
    ]
    jobs += [
        {"model": "userpkg.net:build", "method": m, "workers": 2, "ok": False, "error": CRASH, "log": f"logs/{m}.log"}
        for m in failed
    ]
    d = tmp_path / "grid"
    d.mkdir(parents=True)
    (d / "results.json").write_text(json.dumps({"jobs": jobs}))
    return d


def test_steps_ratios_come_from_a_finished_grid(tmp_path):
    ratios, n, _, failed = steps_from(str(grid(tmp_path) / "results.json"), "userpkg.net:build", METHODS)
    assert n == 2 and ratios == {"fp32": 1.0, "fp16": 1.0, "localsgd-h4": pytest.approx(1.8)} and failed == {}
    with pytest.raises(RecommendError, match=r"float32 .* did not reach the target"):
        steps_from(str(grid(tmp_path / "b", reached=False) / "results.json"), "userpkg.net:build", METHODS)


def test_a_crashed_job_is_reported_as_failed_with_its_error_line_not_as_slow(tmp_path):
    d = grid(tmp_path, failed=("ring-mpi-localsgd-h4",))
    ratios, _, _, failed = steps_from(str(d / "results.json"), "userpkg.net:build", METHODS)
    assert ratios["localsgd-h4"] is None and failed == {"localsgd-h4": CRASH}
    inp = Inputs("userpkg.net:build", LINEAR, 0.010, 64, 0.0, ratios, failed=failed)
    cells = plan(inp, [2, 8], [("1gbit", 1e9 / 8)], METHODS)
    assert all(c["failed"] == {"localsgd-h4": CRASH} and c["not_reached"] == [] for c in cells)
    text = summary(inp, cells, METHODS, None)
    assert f"not ranked, localsgd-h4 failed: {CRASH}" in text and "fp16 1.00, localsgd-h4 failed  [" in text
    assert "did not reach" not in text and "not reached" not in text


def test_a_crashed_float32_job_stops_the_recommendation_with_its_error_line(tmp_path):
    d = grid(tmp_path, failed=("ring-mpi",))
    with pytest.raises(RecommendError, match=r"float32 \(ring-mpi\) failed .*IndexError: list index out of range"):
        steps_from(str(d / "results.json"), "userpkg.net:build", METHODS)


# The MLP 8-32-3 of issue 40: compute 0.4 ms, 2 KB of gradient, and its check on 2 emulated hosts at 1 Gbit/s
MLP = [(32, 8), (32,), (3, 32), (3,)]
MLP_METHODS = ["fp32", "fp16", "localsgd-h4", "localsgd-h16"]


def mlp_check_jobs(measured):
    """The grid's jobs at 2 emulated hosts as tta records them: float32's step 1.0 ms of which 0.6 ms waited
    (0.4 ms compute), each concept's time to the target ``measured`` times float32's, the same steps."""
    return {
        tta_method(m): {
            "method": tta_method(m),
            "workers": 2,
            "ok": True,
            "reached": True,
            "link_rate": "1gbit",
            "step_ms": 1.0,
            "comm_wait_ms": 0.6,
            "steps_to_target": 100,
            "seconds_to_target": 10.0 * measured.get(m, 1.0),
        }
        for m in MLP_METHODS
    }


def test_a_pick_whose_check_missed_by_more_than_the_trust_factor_is_not_decided_and_says_why():
    inp = Inputs("userpkg.mlp:build", MLP, 0.0004, 64, 50e-6, {"fp16": 1.0, "localsgd-h4": 1.0, "localsgd-h16": 1.0})
    check = emulated_check(mlp_check_jobs({"fp16": 1.25, "localsgd-h4": 1.78, "localsgd-h16": 1.86}), inp, MLP_METHODS)
    assert check is not None
    got = check["methods"]
    predicted = got["localsgd-h16"]["predicted"]
    assert predicted == pytest.approx(1.0, abs=0.05)  # the model has no per-step cost here: ~float32's time
    assert got["fp16"]["within_trust"] and not got["localsgd-h4"]["within_trust"]
    assert not got["localsgd-h16"]["within_trust"]
    links = [("10gbit", 10e9 / 8)]
    # unchecked, the model's answer for 8 workers is issue 40's: local SGD H = 16 well under float32, decided
    (bare,) = plan(inp, [8], links, MLP_METHODS)
    assert bare["winner"] == "localsgd-h16" and bare["time_vs_fp32"]["localsgd-h16"] < 0.6 and bare["decided"]
    (cell,) = plan(inp, [8], links, MLP_METHODS, check)
    assert cell["winner"] == "localsgd-h16" and not cell["decided"] and cell["margin_decided"]
    assert cell["check_missed"] == {"localsgd-h16": f"predicted {predicted:.2f}, measured 1.86"}
    text = summary(inp, [cell], MLP_METHODS, check)
    assert "**localsgd-h16**" not in text and "localsgd-h16 0." in text and "not decided†" in text
    assert f"missed by more than {trust.MISS:.2f}x" in text and f"localsgd-h16 {predicted:.2f} / 1.86 missed†" in text
    assert f"fp16 {got['fp16']['predicted']:.2f} / 1.25," in text  # within the factor: no mark


def test_a_concept_measured_faster_than_predicted_by_more_than_the_factor_unsettles_the_pick_it_lost_to():
    cell = predict_cell(inputs(ratios={"fp16": 1.0, "localsgd-h4": 1.0}), 8, 100e6 / 8, METHODS)
    assert cell["winner"] == "localsgd-h4" and cell["decided"]
    slower = {"methods": {"fp16": {"predicted": 0.6, "measured": 1.2, "within_trust": False}}}
    assert judge(cell, slower)["decided"]  # the runner-up is even slower than predicted: the pick stands
    faster = {"methods": {"fp16": {"predicted": 1.2, "measured": 0.6, "within_trust": False}}}
    assert not judge(cell, faster)["decided"] and list(judge(cell, faster)["check_missed"]) == ["fp16"]
    assert trust.check_holds(1.0, trust.MISS) and not trust.check_holds(1.0, trust.MISS * 1.01)
    assert not trust.check_holds(trust.MISS * 1.01, 1.0)


PACKAGE = {
    "__init__.py": "",
    "net.py": textwrap.dedent("""
    import torch.nn as nn


    def build(hidden=16):
        return nn.Sequential(nn.Flatten(), nn.Linear(28 * 28, hidden), nn.ReLU(), nn.Linear(hidden, 10))
    """),
    # a model that crashes at its first training step under local SGD only (it reads the trainer's command
    # line): a concept's job failing as PowerSGD's did on a small MLP before it was fixed (issue 40)
    "picky.py": textwrap.dedent("""
    import sys

    import torch.nn as nn


    class Picky(nn.Sequential):
        def forward(self, x):
            if self.training and "--average-every" in sys.argv:
                raise RuntimeError("this model does not train under local SGD")
            return super().forward(x)


    def build():
        return Picky(nn.Flatten(), nn.Linear(28 * 28, 10))
    """),
    "data.py": textwrap.dedent("""
    import torch
    from torch.utils.data import TensorDataset


    def build():
        g = torch.Generator().manual_seed(0)
        y = torch.randint(0, 10, (256,), generator=g)
        x = torch.randn(256, 1, 28, 28, generator=g) + y.view(-1, 1, 1, 1).float()
        return TensorDataset(x[:192], y[:192]), TensorDataset(x[192:], y[192:])
    """),
}


def user_env(tmp_path):
    pkg = tmp_path / "site" / "userpkg"
    pkg.mkdir(parents=True)
    for name, text in PACKAGE.items():
        (pkg / name).write_text(text)
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path / "site"), str(ROOT)])}


def lab(args, env, timeout=240):
    return subprocess.run(
        [sys.executable, "-m", "lab", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout
    )


@pytest.mark.heavy
def test_recommend_prints_a_time_to_accuracy_answer_for_a_users_model(tmp_path):
    (tmp_path / "b").mkdir()
    env, d = user_env(tmp_path), grid(tmp_path / "b")
    out = tmp_path / "out"
    proc = lab(
        [
            "recommend",
            "--model",
            "userpkg.net:build",
            "--model-arg",
            "hidden=8",
            "--target",
            "eval/accuracy>=0.5",
            "--steps-from",
            str(d),
            "--compute-ms",
            "5",
            "--workers",
            "2,64",
            "--link",
            "1gbit,100gbit",
            "--latency",
            "20us",
            "--methods",
            "fp16,localsgd-h4",
            "--out",
            str(out),
        ],
        env,
    )
    assert proc.returncode == 0, proc.stderr
    assert "Which concept reaches the target fastest for userpkg.net:build" in proc.stdout
    assert "0.025 MB float32" in proc.stdout  # 784 x 8 + 8 + 8 x 10 + 10 parameters, measured from the model
    assert "check, 2 emulated hosts at 1gbit" in proc.stdout
    res = json.loads((out / "recommend.json").read_text())
    assert {(c["workers"], c["link"]) for c in res["cells"]} == {
        (2, "1gbit"),
        (2, "100gbit"),
        (64, "1gbit"),
        (64, "100gbit"),
    }
    assert res["check"]["methods"]["fp16"]["measured"] == pytest.approx(0.9)
    assert (out / "recommend.png").stat().st_size > 10_000


@pytest.mark.heavy
def test_recommend_answers_what_fits_in_the_memory_per_rank_beside_the_fastest(tmp_path):
    # the grid's sharded jobs as the time-to-accuracy grid names them (ring-mpi-zeroS), under AdamW
    d = grid(tmp_path / "b")
    res = json.loads((d / "results.json").read_text())
    res["config"] = {"recipe": ["--optimizer", "adamw"]}
    base = next(j for j in res["jobs"] if j["method"] == "ring-mpi")
    res["jobs"] += [{**base, "method": f"ring-mpi-zero{s}", "seconds_to_target": 10.0 + s} for s in (1, 2, 3)]
    (d / "results.json").write_text(json.dumps(res))
    out = tmp_path / "out"
    common = ["recommend", "--model", "userpkg.net:build", "--model-arg", "hidden=8", "--target", "eval/loss<=1"]
    proc = lab(
        [*common, "--steps-from", str(d), "--compute-ms", "5", "--workers", "2,64", "--link", "1gbit"]
        + ["--methods", "fp16", "--optimizer", "adamw", "--memory-per-rank", "70KiB", "--out", str(out)],
        user_env(tmp_path),
    )
    assert proc.returncode == 0, proc.stderr
    # 6,370 parameters, AdamW's 8 bytes each, measured: replicated 16 bytes each (99.5 KiB) does not fit; at 2
    # workers zero1 holds 12 (74.6 KiB) and does not either, zero2 10 (62.2 KiB) does; at 64 zero1 does
    assert "fits in 70.0 KiB per rank" in proc.stdout and "6,370 parameters, 8 bytes" in proc.stdout
    cells = {c["workers"]: c for c in json.loads((out / "recommend.json").read_text())["cells"]}
    assert cells[2]["fits"] == ["zero2", "zero3"] and cells[2]["fastest_fitting"] == "zero2"
    assert cells[64]["fits"] == ["zero1", "zero2", "zero3"] and cells[64]["fastest_fitting"] in cells[64]["fits"]
    assert cells[2]["memory_need"]["fp32"] == 16 * 6370
    assert "| 2 | zero2 1.00 (not fp16) | fp32 99.5 KiB, fp16 99.5 KiB, zero1 74.6 KiB |" in proc.stdout


@pytest.mark.long  # a time-to-accuracy grid of 2 jobs, then recommend (~40 s): make test-long, .ci/run
def test_recommend_names_a_concept_whose_real_job_crashed_as_failed_with_its_error_line(tmp_path):
    env, grid_dir = user_env(tmp_path), tmp_path / "grid"
    own = ["--model", "userpkg.picky:build", "--dataset", "userpkg.data:build"]
    proc = lab(
        ["time-to-accuracy", *own, "--workers", "2", "--emulate-from", "0", "--target", "eval/accuracy>=0.0"]
        + ["--methods", "ring-mpi,ring-mpi-localsgd-h4", "--max-epochs", "1", "--evals-per-epoch", "2"]
        + ["--extra=--batch-size", "--extra=16", "--out-dir", str(grid_dir)],
        env,
        timeout=600,
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr  # the grid ran, one of its jobs failed
    failed = [j for j in json.loads((grid_dir / "results.json").read_text())["jobs"] if not j["ok"]]
    assert [j["method"] for j in failed] == ["ring-mpi-localsgd-h4"]
    assert "this model does not train under local SGD" in failed[0]["error"]
    proc = lab(
        ["recommend", *own, "--target", "eval/accuracy>=0.0", "--steps-from", str(grid_dir), "--compute-ms", "1"]
        + ["--workers", "2,8", "--link", "1gbit", "--methods", "localsgd-h4", "--out", str(tmp_path / "out")],
        env,
    )
    assert proc.returncode == 0, proc.stderr
    assert f"not ranked, localsgd-h4 failed: {failed[0]['error']}" in proc.stdout
    assert "did not reach" not in proc.stdout and "at 2 workers: localsgd-h4 failed  [measured" in proc.stdout


@pytest.mark.heavy
@pytest.mark.parametrize(
    "args, needle",
    [
        (["--model", "userpkg.nope:build"], "cannot import userpkg.nope"),
        (["--model", "userpkg.net:missing"], "has no attribute 'missing'"),
        (["--model", "userpkg.net:build", "--workers", "1"], "--workers"),
        (["--model", "userpkg.net:build", "--target", "accuracy"], "--target"),
        (["--model", "userpkg.net:build", "--memory-per-rank", "16 gigs"], "--memory-per-rank"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(tmp_path, args, needle):
    env, d = user_env(tmp_path), grid(tmp_path)
    full = ["recommend", "--steps-from", str(d), "--compute-ms", "5", "--out", str(tmp_path / "o")]
    proc = lab(full + (args if "--target" in args else [*args, "--target", "eval/accuracy>=0.5"]), env)
    assert proc.returncode == 2 and needle in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
