"""The two-rank jobs of the GPU check on its one device (``--two-ranks``): the trainer's multi-rank path
through Horovod on Gloo (served here, without MPI), the mpi4py ring and the colocated PS (under mpirun),
each rank's parameters compared at the end (the package's docstring says why so)."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import ClassVar

import torch

from ..common import methods
from .ways import LABELS, log


class _KVStore(BaseHTTPRequestHandler):
    """Gloo's rendezvous for Horovod: a key-value store over HTTP (GET/PUT/DELETE of /scope/key),
    what horovodrun serves (horovod.runner.http.http_server), in the standard library only:
    Horovod's runner module needs psutil, which a bare GPU node's Python may lack."""

    store: ClassVar[dict[str, bytes]] = {}  # one store for all requests (a handler per request)
    lock = threading.Lock()

    def do_GET(self) -> None:
        with self.lock:
            value = self.store.get(self.path)
        self.send_response(200 if value is not None else 404)
        self.send_header("Content-Length", str(len(value or b"")))
        self.end_headers()
        self.wfile.write(value or b"")

    def do_PUT(self) -> None:
        value = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        with self.lock:
            self.store[self.path] = value
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_DELETE(self) -> None:  # a rank's Finalize(): nothing to keep
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *_) -> None:
        pass


def train_args(args: argparse.Namespace, model: str, batch: int, run_dir: str, name: str) -> list[str]:
    return [
        "--model",
        model,
        "--dataset",
        "synthetic",
        "--device",
        args.device,
        "--batch-size",
        str(batch),
        "--steps",
        str(args.two_rank_steps),
        "--perf-warmup-steps",
        str(min(args.warmup_steps, args.two_rank_steps - 1)),
        "--synthetic-samples",
        str(args.synthetic_samples),
        "--seed",
        str(args.seed),
        "--threads",
        str(args.threads),
        "--run-dir",
        run_dir,
        "--name",
        name,
        "--no-tensorboard",
        "--no-progress",
        "--dump-params",
        os.path.join(run_dir, f"{name}-{{rank}}.pt"),
    ]


def start_gloo_pair(args: argparse.Namespace, cli: list[str]) -> tuple[list[subprocess.Popen], ThreadingHTTPServer]:
    """Two trainer ranks with Horovod on Gloo (controller and operations), without MPI: this process
    serves the rendezvous and gives each rank the variables horovodrun --gloo would."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), type("KV", (_KVStore,), {"store": {}}))
    threading.Thread(target=server.serve_forever, daemon=True, name="gloo-rendezvous").start()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMPI_", "PMIX_", "HOROVOD_"))}
    if args.gloo_pythonpath:  # the Horovod without GPU operations (docstring), ahead of the NCCL one
        env["PYTHONPATH"] = args.gloo_pythonpath + os.pathsep + env.get("PYTHONPATH", "")
    env.update(
        {
            "HOROVOD_CONTROLLER": "gloo",
            "HOROVOD_CPU_OPERATIONS": "gloo",
            "HOROVOD_GLOO_IFACE": "lo",
            "HOROVOD_GLOO_RENDEZVOUS_ADDR": "127.0.0.1",
            "HOROVOD_GLOO_RENDEZVOUS_PORT": str(server.server_address[1]),
            "HOROVOD_HOSTNAME": "localhost",
            "HOROVOD_SIZE": "2",
            "HOROVOD_LOCAL_SIZE": "2",
            "HOROVOD_CROSS_RANK": "0",
            "HOROVOD_CROSS_SIZE": "1",
        }
    )
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "allreduce_train", "train", *cli, "--strategy", "allreduce"],
            env={**env, "HOROVOD_RANK": str(r), "HOROVOD_LOCAL_RANK": str(r)},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for r in range(2)
    ]
    return procs, server


def run_two(args: argparse.Namespace, way: str, model: str, batch: int) -> dict:
    """One two-rank job of ``way``; the row, with whether both ranks ended with the same parameters."""
    row = {"model": model, "way": way, "batch": batch, "ranks": 2, "device": args.device}
    if way != "ring-gloo":
        missing = [
            what for what, ok in (("mpirun", shutil.which("mpirun")), ("mpi4py", _importable("mpi4py"))) if not ok
        ]
        if missing:
            return {**row, "skipped": f"no {' or '.join(missing)} on this machine (the {LABELS[way]} row needs MPI)"}
    with tempfile.TemporaryDirectory() as run_dir:
        cli = train_args(args, model, batch, run_dir, way)
        server = None
        try:
            if way == "ring-gloo":
                procs, server = start_gloo_pair(args, cli)
            else:
                engine = methods.registry()[way].flags
                procs = [
                    subprocess.Popen(
                        [sys.executable, "-m", "launch", "-np", "2", "--", *cli, *engine],
                        stdout=subprocess.PIPE,
                        stderr=subprocess.STDOUT,
                        text=True,
                    )
                ]
            outs, rcs = [], []
            deadline = time.monotonic() + args.timeout
            for proc in procs:
                try:
                    outs.append(proc.communicate(timeout=max(1.0, deadline - time.monotonic()))[0])
                    rcs.append(proc.returncode)
                except subprocess.TimeoutExpired:
                    for p in procs:
                        p.kill()
                    outs.append(f"no result after {args.timeout} s")
                    rcs.append("timeout")
        finally:
            if server is not None:
                server.shutdown()
        out = "\n".join(outs)
        metrics_file = os.path.join(run_dir, way, "metrics.json")
        if any(rc != 0 for rc in rcs) or not os.path.exists(metrics_file):
            tail = [ln for ln in out.strip().splitlines() if ln.strip()][-1:] or ["no output"]
            log(f"  FAILED (exit {rcs}); its output ends:\n" + "\n".join(out.strip().splitlines()[-15:]))
            return {**row, "error": f"exit {rcs}: {tail[0][:200]}"}
        with open(metrics_file) as fh:
            metrics = json.load(fh)
        dumps = [torch.load(os.path.join(run_dir, f"{way}-{r}.pt"), weights_only=True) for r in range(2)]
    differ = [k for k in dumps[0] if not torch.equal(dumps[0][k], dumps[1][k])]
    spb = metrics["samples_per_sec"]
    return {
        **row,
        "samples_per_sec": spb,
        "step_ms": 1e3 * metrics["global_batch"] / spb,
        "peak_mb": None,
        "loss_first": float("nan"),
        "loss_last": metrics["final"]["train_loss"],
        "world_size": metrics["world_size"],
        "params_identical": not differ,
        "note": (
            f"world size {metrics['world_size']}"
            + (f", Horovod controller {metrics['horovod_controller']}" if "horovod_controller" in metrics else "")
            + f", {metrics.get('allreduce_engine') or metrics['strategy']}; both ranks' parameters "
            + ("identical at the end" if not differ else f"DIFFER in {len(differ)} tensors (no exchange?)")
        ),
    }


def _importable(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None
