"""``commbench-netns``: the network model checked alone -- the gradient exchange on emulated hosts
(no compute) against the alpha-beta cost model.

    python -m lab commbench-netns                  # 1gbit and 100mbit, 2 and 4 hosts
    python -m lab commbench-netns --rates 100mbit --hosts 4 --impls mpi,ps-sync-colocated

For every link rate and worker count, commbench's front end runs unchanged with its launcher hook
swapped for the emulated cluster's (lab/emulation/netns.py): one rank per emulated host, so every rank has
a link of its own -- N workers, plus K server hosts for the dedicated PS. Each exchange's median
time is set beside costmodel.exchange_time for that rate with alpha = 0 (the emulation adds no
latency): for allreduce and the colocated PS 2(N-1)/N S/B, for K dedicated servers
2 max(S, N S/K)/B. The kernel's link counters (the launcher's "link traffic" line of every job)
say how many bytes really crossed the links.

Output: runs/commbench-netns/<time>/report.md and results.json; <rate>/n<N>/ holds each commbench
run's own commbench.json/.md, logs/ every job's output.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import time
from typing import Any

from ..common import costmodel
from ..common.jobs import EMULATED_ALLREDUCE, EMULATED_ALLREDUCE_HELP, loadavg
from . import main as commbench
from .exchanges import KIND

DEFAULT_IMPLS = "ring-horovod,ring-mpi,mpi,ps-sync-colocated,ps-sync-dedicated"
DEFAULT_SIZES = "256K,1M,4M,16M"
TOLERANCE = 0.15  # the target: within +-15 % of the model at 100 Mbit/s for messages >= 4 MB
CHECKED_BYTES = 4 << 20


def add_arguments(p: argparse.ArgumentParser) -> None:
    from launch.mpirun import add_mca_arg, add_mpi_allreduce_arg

    p.add_argument("--rates", default="1gbit,100mbit", help="link rates per direction (default: 1gbit,100mbit)")
    p.add_argument("--hosts", default="2,4", help="worker counts, one emulated host each (default: 2,4)")
    p.add_argument(
        "--impls",
        default=DEFAULT_IMPLS,
        help=f"commbench implementations (default: {DEFAULT_IMPLS}; {', '.join(commbench.IMPLS)})",
    )
    p.add_argument(
        "--ps-servers-list", default="1,2", help="K values for ps-sync-dedicated, a host each (default: %(default)s)"
    )
    p.add_argument("--sizes", default=DEFAULT_SIZES, help=f"message sizes (default: {DEFAULT_SIZES})")
    p.add_argument("--iters", type=int, default=5, help="timed exchanges per size (default: 5)")
    p.add_argument("--warmup", type=int, default=1, help="untimed exchanges first (default: 1)")
    add_mca_arg(p, help="an Open MPI parameter for every job, overriding the emulation's (repeatable)")
    p.add_argument("--job-timeout", type=float, default=1800, help="seconds per job before it is stopped")
    add_mpi_allreduce_arg(p, EMULATED_ALLREDUCE, EMULATED_ALLREDUCE_HELP)
    p.add_argument("--out-dir", default="", help="default: runs/commbench-netns/<time>")


def predicted_s(row: dict[str, Any], net: costmodel.Network) -> float:
    """The cost model's time for one commbench result on ``net``."""
    return costmodel.exchange_time(KIND[row["impl"]], row["workers"], row["bytes"], net, servers=max(1, row["servers"]))


def compare(rate: str, report: dict[str, Any], net: costmodel.Network) -> list[dict[str, Any]]:
    rows = []
    for r in report["results"]:
        if r["workload_kind"] != "size":
            continue
        p = predicted_s(r, net)
        rows.append(
            {
                "rate": rate,
                "impl": r["impl"],
                "job": r.get("job", "default"),
                "workers": r["workers"],
                "servers": r["servers"],
                "bytes": r["bytes"],
                "measured_s": r["time_s"],
                "p25_s": r["time_p25_s"],
                "p75_s": r["time_p75_s"],
                "predicted_s": p,
                "ratio": r["time_s"] / p if p > 0 else float("nan"),
                "max_abs_err": r["max_abs_err"],
            }
        )
    return rows


def markdown(res: dict[str, Any]) -> str:
    out = [
        "# The network model alone: commbench on emulated hosts vs the alpha-beta model",
        "",
        f"`{res['command']}` on {res['cpus']} CPU cores, started {res['started']}, {res['minutes']:.0f} min; "
        f"load average (1 min) {res['load_before']} before, {res['load_after']} after. Every rank on an emulated "
        "host of its own (a network namespace with one full-duplex link of the given rate to a switch, "
        "docs/emulated_cluster.md); the exchanges alone, no model compute. Open MPI's MPI_Allreduce: "
        f"{res.get('mpi_allreduce', 'not recorded')}.",
        "",
        "- measured: median over iterations of the slowest worker (commbench); p25-p75 its spread;",
        "- model: costmodel.py with alpha = 0 (no latency is emulated) and B = the link rate / 8: "
        "allreduce and colocated PS 2(N-1)/N S/B, K dedicated servers 2 max(S, N S/K)/B;",
        f"- within: |measured / model - 1| <= {TOLERANCE:.0%}.",
        "",
    ]
    for rate in res["rates"]:
        sel = [r for r in res["rows"] if r["rate"] == rate]
        out += [
            f"## {rate} per link",
            "",
            "| size | implementation | N (+K) | measured ms | p25-p75 ms | model ms | measured / model | within |",
            "|---:|---|---|---:|---:|---:|---:|---|",
        ]
        for r in sorted(sel, key=lambda r: (r["bytes"], r["workers"], r["impl"], r["servers"])):
            n = f"{r['workers']}" + (f" (+{r['servers']})" if r["servers"] else "")
            out.append(
                f"| {commbench.human_bytes(r['bytes'])} | {r['impl']} | {n} | {1e3 * r['measured_s']:.1f} | "
                f"{1e3 * r['p25_s']:.1f}-{1e3 * r['p75_s']:.1f} | {1e3 * r['predicted_s']:.1f} | "
                f"{r['ratio']:.2f} | {'yes' if abs(r['ratio'] - 1) <= TOLERANCE else 'no'} |"
            )
        big = [r for r in sel if r["bytes"] >= CHECKED_BYTES]
        ok = [r for r in big if abs(r["ratio"] - 1) <= TOLERANCE]
        if big:
            out += [
                "",
                f"Messages >= {commbench.human_bytes(CHECKED_BYTES)}: {len(ok)} of {len(big)} within "
                f"+-{TOLERANCE:.0%} of the model (measured / model from {min(r['ratio'] for r in big):.2f} "
                f"to {max(r['ratio'] for r in big):.2f}).",
            ]
        out.append("")
    bad = [r for r in res["rows"] if r["max_abs_err"] != 0]
    if not res["rows"]:
        out.append("No exchange was measured.")
    else:
        out.append(
            f"{len(bad)} exchange(s) returned a wrong sum."
            if bad
            else "Every exchange returned the exact expected sum."
        )
    if res["failures"]:
        out += ["", "Failed jobs: " + "; ".join(res["failures"])]
    return "\n".join(out) + "\n"


def main(args: argparse.Namespace) -> int:
    from lab.common.jobs import emulated_launcher
    from lab.emulation.netns import unavailable_reason
    from launch import mpirun

    from ..common.links import RateError, link_network, parse_rates

    try:
        rates = parse_rates(args.rates)
        hosts = commbench._ints(args.hosts, "--hosts")
        if any(n < 2 for n in hosts):
            raise commbench.BenchError(f"--hosts: the exchange needs >= 2 workers (got {args.hosts!r})")
    except (commbench.BenchError, RateError) as e:
        print(f"commbench-netns: error: {e}", file=sys.stderr)
        return 2
    reason = unavailable_reason()
    if reason:
        print(f"commbench-netns: error: {reason}", file=sys.stderr)
        return 2
    out_dir = args.out_dir or os.path.join("runs", "commbench-netns", time.strftime("%Y%m%d-%H%M%S"))
    started, t0, load_before = time.strftime("%Y-%m-%d %H:%M"), time.monotonic(), loadavg()
    rows: list[dict[str, Any]] = []
    failures: list[str] = []
    mca = mpirun.parse_mca(args.mca)
    try:
        for rate in rates:
            for n in hosts:
                print(f"== {rate} per link, {n} emulated workers", flush=True)
                front = commbench.front_args(
                    [
                        "--np",
                        str(n),
                        "--impls",
                        args.impls,
                        "--sizes",
                        args.sizes,
                        "--models",
                        "",
                        "--iters",
                        str(args.iters),
                        "--warmup",
                        str(args.warmup),
                        "--ps-servers-list",
                        args.ps_servers_list,
                        "--horovod-cycle-ms",
                        "",
                        "--horovod-fusion-mb",
                        "",
                        "--timeline-size",
                        "",
                        "--out-dir",
                        os.path.join(out_dir, rate, f"n{n}"),
                        "--job-timeout",
                        str(args.job_timeout),
                    ]
                )
                report = commbench.run_front(
                    front,
                    launcher=emulated_launcher(
                        rate, timeout=args.job_timeout - 60, mca=mca, mpi_allreduce=args.mpi_allreduce
                    ),
                )
                failures += [f"{rate} N={n} {f}" for f in report["failures"]]
                rows += compare(rate, report, link_network(rate))
    except commbench.BenchError as e:
        print(f"commbench-netns: error: {e}", file=sys.stderr)
        return 2
    res = {
        "command": shlex.join(["python", "-m", "lab", *sys.argv[1:]]),
        "started": started,
        "minutes": (time.monotonic() - t0) / 60,
        "cpus": os.cpu_count(),
        "load_before": " ".join(f"{v:.1f}" for v in load_before),
        "load_after": " ".join(f"{v:.1f}" for v in loadavg()),
        "rates": rates,
        "hosts": hosts,
        "mca": mca,
        "mpi_allreduce": mpirun.describe_mpi_allreduce(args.mpi_allreduce, mca),
        "rows": rows,
        "failures": failures,
    }
    with open(os.path.join(out_dir, "results.json"), "w") as fh:
        json.dump(res, fh, indent=1)
        fh.write("\n")
    text = markdown(res)
    with open(os.path.join(out_dir, "report.md"), "w") as fh:
        fh.write(text)
    print(text, flush=True)
    print(f"-> {out_dir}/report.md", flush=True)
    return 1 if failures else 0
