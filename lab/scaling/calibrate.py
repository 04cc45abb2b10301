"""The scaling grid's cost model: calibrated by a short commbench, it predicts every measured point
and the scaling to 1024 workers (:mod:`lab.common.costmodel`)."""

from __future__ import annotations

import math
import os
import shlex
import subprocess
import sys
from dataclasses import asdict
from typing import Any

from ..common import costmodel, gradients
from .spec import REPORT_WORKERS, GridConfig, GridError, Plan, Variant

CYCLE_CANDIDATES = "0.2,5"  # besides Horovod's default of 1 ms


def choose_cycle(commbench_report: dict[str, Any]) -> tuple[float | None, str]:
    """The HOROVOD_CYCLE_TIME whose allreduce sweep was fastest (geometric mean over the sizes
    every configuration measured): (ms or None for Horovod's default, the commbench job label)."""
    times: dict[str, dict[int, float]] = {}
    for r in commbench_report["results"]:
        job = r.get("job", "default")
        horovod = r["impl"] == "ring-horovod" and r["workload_kind"] == "size"
        if horovod and (job == "default" or job.startswith("cycle=")):
            times.setdefault(job, {})[r["bytes"]] = r["time_s"]
    if not times:
        return None, "default"
    common = set.intersection(*(set(t) for t in times.values()))
    if not common:
        return None, "default"
    best = min(times, key=lambda j: sum(math.log(times[j][b]) for b in common))
    return (None if best == "default" else float(best[len("cycle=") : -len("ms")])), best


def calibrate(
    commbench_report: dict[str, Any], vs: list[Variant], horovod_job: str = "default"
) -> dict[str, dict[str, Any]]:
    """alpha and B per strategy, fitted to its commbench size sweep (Horovod: the knobs the grid used)."""
    out = {}
    for v in vs:
        want = horovod_job if v.commbench_impl == "ring-horovod" else ("default", f"K={v.servers}")
        pts = [
            r
            for r in commbench_report["results"]
            if r["impl"] == v.commbench_impl and r["workload_kind"] == "size" and r.get("job", "default") in want
        ]
        if not pts or pts[0]["workers"] < 2:
            continue
        n, k = pts[0]["workers"], max(1, pts[0]["servers"])
        net = costmodel.fit_alpha_beta(v.kind, n, [(r["bytes"], r["time_s"]) for r in pts], servers=k)
        out[v.name] = {
            "impl": v.commbench_impl,
            "workers": n,
            "alpha_s": net.alpha,
            "bandwidth_Bps": net.bandwidth,
            "points": len(pts),
        }
    return out


COMPUTE_SOURCES = {
    "one-worker": "the one-worker allreduce step (any strategy's when allreduce has none) minus its exchange wait",
    "fewest-workers": "the grid has no one-worker run: the median step of the fewest workers measured minus their "
    "exchange wait, which on shared cores includes the other ranks' competition for them",
}


def compute_times(rows: list[dict[str, Any]], plans: dict[str, Plan]) -> tuple[dict[str, float], dict[str, str]]:
    """Seconds of compute per step and model, and where each came from (a key of COMPUTE_SOURCES):
    the one-worker allreduce step (from its throughput, so that the prediction at N=1 reproduces
    it) minus its exchange wait; any strategy's one-worker run when allreduce has none; without any
    one-worker run (the emulated grid runs N hosts only) the fewest workers' median step minus wait."""
    out: dict[str, float] = {}
    source: dict[str, str] = {}
    for any_strategy in (False, True):
        for r in rows:
            if r["workers"] == 1 and r["repeats"] and (any_strategy or r["strategy"] == "ring-horovod"):
                step_s = plans[r["model"]].batch_size / r["samples_per_sec_mean"]
                out.setdefault(r["model"], max(0.0, step_s - r["comm_wait_ms_mean"] / 1e3))
                source.setdefault(r["model"], "one-worker")
    for r in sorted((r for r in rows if r["repeats"]), key=lambda r: (r["workers"], r["strategy"] != "ring-horovod")):
        if r["model"] not in out:
            out[r["model"]] = max(0.0, (r["step_ms_mean"] - r["comm_wait_ms_mean"]) / 1e3)
            source[r["model"]] = "fewest-workers"
    return out, source


def known_network(vs: list[Variant], net: costmodel.Network, label: str) -> dict[str, dict[str, Any]]:
    """The calibration table when the network is known, not fitted (emulated links of a set rate)."""
    return {
        v.name: {"impl": label, "workers": 0, "alpha_s": net.alpha, "bandwidth_Bps": net.bandwidth, "points": 0}
        for v in vs
    }


def predictions(
    rows,
    vs: list[Variant],
    models: list[str],
    plans: dict[str, Plan],
    calib,
    given: costmodel.Network,
    sizes: dict[str, int],
) -> tuple[dict[str, float], dict[str, str], dict[str, dict[str, list[dict]]]]:
    """(per model: compute seconds per step and where they came from; beside each measured row:
    the calibrated prediction; per model and strategy: the curve to 1024 workers on the given network)."""
    compute, source = compute_times(rows, plans)
    table = {v.name: v for v in vs}
    for r in rows:
        v, c = table.get(r["strategy"]), compute.get(r["model"])
        cal = calib.get(r["strategy"])
        if v is None or c is None or cal is None:
            r.update(predicted_samples_per_sec=math.nan, predicted_efficiency=math.nan, prediction_error_pct=math.nan)
            continue
        net = costmodel.Network(cal["alpha_s"], cal["bandwidth_Bps"])
        p = _predict(v, r["model"], r["workers"], sizes[r["model"]], c, plans[r["model"]].batch_size, net)
        err = 100 * (p.samples_per_sec - r["samples_per_sec_mean"]) / r["samples_per_sec_mean"]
        r.update(
            predicted_samples_per_sec=p.samples_per_sec, predicted_efficiency=p.efficiency, prediction_error_pct=err
        )
    curves: dict[str, dict[str, list[dict]]] = {}
    for m in models:
        if m not in compute:
            continue
        for v in vs:
            curves.setdefault(m, {})[v.name] = [
                asdict(_predict(v, m, n, sizes[m], compute[m], plans[m].batch_size, given)) for n in REPORT_WORKERS
            ]
    return compute, source, curves


def _predict(
    v: Variant, model: str, n: int, nbytes: float, compute_s: float, batch: int, net: costmodel.Network
) -> costmodel.Prediction:
    """The cost model's step for variant ``v``: its communication-reduction method priced in (16-bit,
    PowerSGD from the model's tensor shapes, local SGD's period), the plain model for fp32."""
    if v.method == costmodel.BASELINE:
        return costmodel.predict(v.kind, n, nbytes, compute_s, batch, net, servers=max(1, v.servers))
    return costmodel.predict_method(
        v.method,
        v.kind,
        n,
        gradients.shapes(model),
        compute_s,
        batch,
        net,
        servers=max(1, v.servers),
        modules=gradients.modules(model),
    )


def run_commbench(cfg: GridConfig, vs: list[Variant], out: str) -> str:
    """A short commbench at 2 workers for calibration, run as its own command on this machine
    (``python -m lab commbench``: the grid reads its commbench.json, it imports none of it);
    returns the path of that file."""
    cycles = {"auto": CYCLE_CANDIDATES, "default": ""}.get(cfg.horovod_cycle_ms, cfg.horovod_cycle_ms)
    out_dir = os.path.join(out, "commbench")
    argv = [
        sys.executable,
        "-m",
        "lab",
        "commbench",
        "--np",
        "2",
        "--impls",
        ",".join(sorted({v.commbench_impl for v in vs})),
        "--sizes",
        cfg.commbench_sizes,
        "--models",
        "",
        "--budget",
        "0.25",
        "--ps-servers-list",
        str(cfg.ps_servers),
        "--horovod-cycle-ms",
        cycles,
        "--horovod-fusion-mb",
        "",
        "--timeline-size",
        "",
        "--out-dir",
        out_dir,
        "--job-timeout",
        str(cfg.job_timeout),
    ]
    rc = subprocess.run(argv).returncode  # every job inside is bounded by --job-timeout
    path = os.path.join(out_dir, "commbench.json")
    if not os.path.exists(path):
        raise GridError(f"`{shlex.join(argv[1:])}` wrote no commbench.json (exit {rc})")
    return path
