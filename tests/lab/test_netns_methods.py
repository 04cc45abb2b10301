"""scaling-netns with the communication-reduction variants (lab/scaling/spec.py ``variants``,
lab/scaling/netns.py ``compare``): each row is predicted with its method, local SGD against its mean
step, and the report sets each method beside fp32 on the same exchange. No namespaces needed."""

import argparse

import pytest

from lab.common import costmodel as cm
from lab.scaling import netns, spec

METHODS = ("ring-mpi", "ring-mpi-fp16", "ring-mpi-powersgd-r4", "ring-mpi-localsgd-h4")


def test_the_grids_default_to_the_four_exchanges_and_offer_the_concepts():
    assert spec.GridConfig().strategies == list(spec.DEFAULT_STRATEGIES)
    table = spec.variants()
    assert set(spec.DEFAULT_STRATEGIES) < set(table)
    assert table["ring-mpi-powersgd-r4"].flags == (
        "--allreduce-engine",
        "mpi",
        "--compression",
        "powersgd",
        "--powersgd-rank",
        "4",
    )
    assert table["ring-horovod-localsgd-h4"].method == cm.Method(every=4)
    assert table["ps-sync-dedicated-fp16"].servers == 1 and table["ps-sync-dedicated-fp16"].method.compression == "fp16"
    assert "ring-horovod-bf16" not in table  # Horovod has no bfloat16 allreduce: the trainer refuses it
    assert not any(n.startswith("ps-") and ("powersgd" in n or "localsgd" in n) for n in table)


def grid(tmp_path, strategies, **job):
    args = argparse.Namespace(
        hosts="2",
        strategies=",".join(strategies),
        models="ptb-lstm-small",
        repeats=1,
        steps=8,
        ps_servers=1,
        job_timeout=1200,
    )
    cfg = netns.grid_config(args)
    cfg.out_dir = str(tmp_path)
    (tmp_path / "logs").mkdir()
    jobs = []
    for s in strategies:
        log = f"logs/{s}.log"
        (tmp_path / log).write_text("link traffic (bytes sent/received): h1 1000/2000, h2 3000/500\n")
        jobs.append(
            {
                "model": "ptb-lstm-small",
                "strategy": s,
                "workers": 2,
                "servers": 0,
                "repeat": 1,
                "ok": True,
                "log": log,
                "step_ms": 1000.0,
                "comm_wait_ms": 600.0,
                "samples_per_sec": 32.0,
                "global_batch": 40,
                **job,
            }
        )
    return netns.compare("10mbit", {"jobs": jobs}, cfg)


def test_each_row_is_predicted_with_its_method(tmp_path):
    rows = {r["strategy"]: r for r in grid(tmp_path, METHODS)}
    for r in rows.values():
        assert r["pred_step_ms"] == pytest.approx(r["compute_ms"] + r["pred_extra_ms"] + r["pred_exchange_ms"])
    fp32, fp16 = rows["ring-mpi"], rows["ring-mpi-fp16"]
    assert fp32["method"] == "fp32" and fp32["pred_extra_ms"] == 0
    assert fp16["pred_exchange_ms"] == pytest.approx(fp32["pred_exchange_ms"] / 2)  # alpha = 0 on emulated links
    assert fp16["model_bytes_per_step"] == pytest.approx(fp32["model_bytes_per_step"] / 2)
    assert rows["ring-mpi-powersgd-r4"]["pred_exchange_ms"] < fp32["pred_exchange_ms"] / 10
    local = rows["ring-mpi-localsgd-h4"]
    assert local["step_ms"] == pytest.approx(1e3 * 40 / 32.0)  # the mean step (from samples/s), not the median
    assert local["compute_ms"] == pytest.approx(400.0)  # a local step's
    assert local["pred_exchange_ms"] == pytest.approx(fp32["pred_exchange_ms"] * 2 / 4)  # gradients + parameters / H


def test_the_report_sets_each_method_beside_fp32(tmp_path):
    rows = grid(tmp_path, METHODS)
    table = "\n".join(netns.methods_markdown(rows))
    for s in METHODS[1:]:
        assert f"| ptb-lstm-small | 2 | {s} |" in table
    assert "| ptb-lstm-small | 2 | ring-mpi |" not in table
    (tmp_path / "x").mkdir()
    assert netns.methods_markdown(grid(tmp_path / "x", METHODS[1:2])) == []  # no fp32 row: nothing to compare with
