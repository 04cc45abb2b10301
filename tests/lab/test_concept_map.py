"""``python -m lab concept-map`` (lab/conceptmap): the cost model's map of the fastest method per step
draws one panel per model and worker count into a PNG and a TensorBoard image, marks the measured
points of a scaling-netns results.json, and refuses bad input with one line."""

import json

import pytest

from lab.__main__ import main
from lab.common import costmodel as cm
from lab.common import gradients
from lab.conceptmap import main as cmap

MODELS = ("lenet5", "ptb-lstm-small", "resnet18")


def measured_results(path, rows):
    path.write_text(json.dumps({"rows": rows}))
    return str(path)


def row(model, strategy, method, step, pred, rate="10mbit", n=2):
    return {
        "rate": rate,
        "model": model,
        "strategy": strategy,
        "method": method,
        "workers": n,
        "ok": True,
        "step_ms": step,
        "pred_step_ms": pred,
    }


@pytest.mark.heavy
def test_the_map_has_a_panel_per_model_and_n_in_a_png_and_tensorboard(tmp_path, capsys):
    import matplotlib.image as mpimg
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    measured = measured_results(
        tmp_path / "results.json",
        [
            row("ptb-lstm-small", "allreduce-mpi", "fp32", 16000.0, 15000.0),
            row("ptb-lstm-small", "allreduce-mpi-fp16", "fp16", 8100.0, 7500.0),
            row("ptb-lstm-small", "allreduce-mpi-powersgd-r4", "powersgd-r4", 900.0, 450.0),
            # the model's pick: the shorter extra compute + exchange (fp16's 16 ms), not the shorter predicted
            # step (fp32's 25 ms, on a job that measured less compute)
            {**row("lenet5", "allreduce-mpi", "fp32", 30.0, 25.0, rate="100mbit"), "compute_ms": 1.0},
            {**row("lenet5", "allreduce-mpi-fp16", "fp16", 35.0, 26.0, rate="100mbit"), "compute_ms": 10.0},
            row("lenet5", "ps-colocated", "fp32", 10.0, 20.0, rate="100mbit"),  # not an allreduce: not compared
            {"rate": "100mbit", "model": "lenet5", "strategy": "allreduce-mpi-localsgd-h4", "workers": 2, "ok": False},
        ],
    )
    out = tmp_path / "map"
    copy = tmp_path / "docs" / "concept_map.png"
    assert (
        main(
            [
                "concept-map",
                "--view",
                "step",
                "--resolution",
                "12",
                "--measured",
                measured,
                "--out",
                str(out),
                "--copy-to",
                str(copy),
            ]
        )
        == 0
    )
    res = json.loads((out / "concept_map.json").read_text())
    assert res["panels"] == [f"{m}, N = {n}" for m in MODELS for n in (4, 16, 64, 256)]
    assert res["methods"] == ["fp32", "fp16", "powersgd-r4", "localsgd-h4"]
    assert len(res["winners"]) == 12 and all(len(g) == 12 and len(g[0]) == 12 for g in res["winners"].values())
    # the measured points: the fastest measured and the model's pick among the same rows
    pts = {(p["model"], p["rate"]): p for p in res["measured"]}
    assert set(pts) == {("ptb-lstm-small", "10mbit"), ("lenet5", "100mbit")}
    assert pts[("ptb-lstm-small", "10mbit")]["measured_best"] == "powersgd-r4"
    assert pts[("lenet5", "100mbit")]["measured_best"] == "fp32"
    assert pts[("lenet5", "100mbit")]["predicted_best"] == "fp16"
    assert pts[("ptb-lstm-small", "10mbit")]["gbit"] == pytest.approx(0.01)
    assert "| ptb-lstm-small | 10mbit | 2 | ring-mpi | powersgd-r4 | powersgd-r4 |" in (out / "report.md").read_text()

    img = mpimg.imread(out / "concept_map.png")
    assert copy.read_bytes() == (out / "concept_map.png").read_bytes()
    ev = EventAccumulator(str(out / "tensorboard" / cmap.TB_RUN), size_guidance={"images": 0, "tensors": 0}).Reload()
    assert ev.Tags()["images"] == ["concepts/map"]
    (tb_img,) = ev.Images("concepts/map")
    assert (tb_img.height, tb_img.width) == img.shape[:2]
    assert "concepts/report/text_summary" in ev.Tags()["tensors"]
    # the winners' colours are drawn: PowerSGD and local SGD both win somewhere on the default axes
    rgb = (img[:, :, :3] * 255).round().reshape(-1, 3)
    for label in ("powersgd-r4", "localsgd-h4"):
        want = [int(cmap.colour(label)[i : i + 2], 16) for i in (1, 3, 5)]
        assert (abs(rgb - want).max(axis=1) <= 2).sum() > 1000, label


def test_winners_follow_the_link():
    methods = [cm.Method.parse(m) for m in ("fp32", "fp16", "powersgd-r4")]
    shapes = gradients.shapes("ptb-lstm-small")
    best, gain = cmap.winners(methods, shapes, 16, 0.1, [0.01, 100.0], [1.0], cm.HOST)
    assert [methods[i].label for i in best[0]] == ["powersgd-r4", "fp32"]  # slow link: send less; fast: nothing to save
    assert gain[0][0] < 0.2 and gain[0][1] == pytest.approx(1.0)
    fp16_only = [cm.BASELINE, cm.Method(cm.FP16)]
    best, _ = cmap.winners(fp16_only, shapes, 16, 0.1, [0.1], [50.0], cm.HOST)
    assert best == [[1]]


def test_the_sharded_stages_never_win_a_point_per_step_and_stage_3_loses_where_latency_counts():
    methods = [cm.Method.parse(m) for m in ("fp32", "zero1", "zero2", "zero3")]
    shapes, modules = gradients.shapes("resnet18"), gradients.modules("resnet18")
    bw, lat = [0.1, 1.0, 100.0], [1.0, 1000.0]
    best, gain = cmap.winners(methods, shapes, 16, 0.1, bw, lat, cm.HOST, modules=modules)
    assert best == [[0, 0, 0], [0, 0, 0]]  # stages 1-2 tie with fp32 (the same bytes and messages), 3 moves more
    assert all(g == pytest.approx(1.0) for row in gain for g in row)
    only3 = [cm.Method(shard=3)]  # alone: its step over fp32's, 1.5x the bytes and (N-1)(2M+1) messages
    _, slow = cmap.winners(only3, shapes, 16, 0.1, bw, lat, cm.HOST, modules=modules)
    assert all(g > 1 for row in slow for g in row) and slow[1][2] > slow[0][2]  # latency: a cost per gathered module
    assert cmap.colour("zero2") == cmap.colour("zero3") != cmap.colour("fp32")


@pytest.mark.parametrize(
    "argv, flag",
    [
        (["--methods", "fp8"], "--methods"),
        (["--models", "vgg"], "--models"),
        (["--workers", "1,4"], "--workers"),
        (["--latency-us", "10,1"], "--latency-us"),
        (["--compute-ms", "lenet5"], "--compute-ms"),
        (["--measured", "no/such/results.json"], "--measured"),
    ],
)
def test_bad_input_is_one_line_naming_the_flag(tmp_path, capsys, argv, flag):
    assert main(["concept-map", "--out", str(tmp_path), *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("concept-map: error: " + flag)


def test_a_file_that_is_not_a_results_json_is_refused(tmp_path, capsys):
    bad = tmp_path / "x.json"
    bad.write_text("[1, 2]")
    assert main(["concept-map", "--out", str(tmp_path / "o"), "--measured", str(bad)]) == 2
    assert "--measured" in capsys.readouterr().err


@pytest.mark.heavy
def test_time_to_accuracy_is_the_default_view_and_a_method_that_needs_more_steps_can_lose_its_cells(tmp_path):
    shapes = gradients.shapes("ptb-lstm-small")
    methods = [cm.Method.parse(m) for m in ("fp32", "localsgd-h16")]
    # 10 Mbit/s: local SGD's sixteenth of the bytes wins per step, and still with 1.1x the steps
    per_step, _ = cmap.winners(methods, shapes, 16, 0.1, [0.01], [50.0], cm.HOST)
    to_target, _ = cmap.winners(methods, shapes, 16, 0.1, [0.01], [50.0], cm.HOST, {"localsgd-h16": 1.1})
    assert per_step == to_target == [[1]]
    # ... but not with 40x the steps; a method without measured steps is never picked
    assert cmap.winners(methods, shapes, 16, 0.1, [0.01], [50.0], cm.HOST, {"localsgd-h16": 40.0})[0] == [[0]]
    assert cmap.winners(methods, shapes, 16, 0.1, [0.01], [50.0], cm.HOST, {})[0] == [[0]]
    out = tmp_path / "map"
    assert main(["concept-map", "--resolution", "6", "--out", str(out)]) == 0
    res = json.loads((out / "concept_map.json").read_text())
    assert res["view"] == "tta" and res["methods"] == list(cmap.TTA_METHODS)
    assert res["steps_ratio"]["lenet5"]["localsgd-h16"] == pytest.approx(1682 / 986)
    assert res["per_step"] == ["resnet18"] and "resnet18, N = 4 (per step)" in res["panels"]
    assert "Time to accuracy" in (out / "report.md").read_text()
