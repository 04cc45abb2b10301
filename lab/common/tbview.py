"""``make tensorboard``: serve the latest comparison (or a given logdir) and print the URL to open.

    python -m lab.common.tbview                  # the newest <out>/tensorboard under runs/
    python -m lab.common.tbview runs/scaling/20261203-170000/tensorboard --port 6010

The latest comparison is the newest ``tensorboard/`` directory (by its event files) that a
``scaling``, ``scaling-netns`` or ``bench`` run wrote under ``runs/``; with none, the training
runs in ``runs/``. TensorBoard listens on 127.0.0.1 only. The URL opens the Custom Scalars tab
with smoothing 0 (TensorBoard keeps the smoothing in the URL fragment; its default, 0.6, bends
a curve of two or three points away from the measured values).
"""

from __future__ import annotations

import argparse
import os
import sys

from .tblog import COMPARISON_DIR

DEFAULT_PORT = 6007
# hwloc's GL plugin, loaded by every mpirun, probes X display :6 = TCP port 6000 + 6; a server
# there that does not speak X11 leaves mpirun waiting forever.
FORBIDDEN_PORTS = {6006: "port 6006 is X display :6 to hwloc, and a server on it hangs every mpirun on this machine"}


def newest_events(path: str) -> float:
    """The modification time of the newest event file under ``path`` (0 when there is none)."""
    newest = 0.0
    for root, _, files in os.walk(path):
        for f in files:
            if f.startswith("events.out.tfevents."):
                newest = max(newest, os.path.getmtime(os.path.join(root, f)))
    return newest


def latest_comparison(root: str = "runs") -> str | None:
    """The newest ``<out>/tensorboard`` logdir under ``root`` that holds event files, or None."""
    found = []
    for parent, dirs, _ in os.walk(root):
        if os.path.basename(parent) == COMPARISON_DIR:
            dirs[:] = []  # its runs are not comparisons of their own
            t = newest_events(parent)
            if t:
                found.append((t, parent))
        else:
            # a job's own runs never hold a comparison: do not walk every job of a big grid
            dirs[:] = [d for d in dirs if d not in ("jobs", "hparams", "logs")]
    return max(found)[1] if found else None


def url(port: int, tab: str = "custom_scalars") -> str:
    return f"http://127.0.0.1:{port}/#{tab}&_smoothingWeight=0"


def command(logdir: str, port: int) -> list[str]:
    """The TensorBoard command line: the venv's tensorboard, loopback only."""
    exe = os.path.join(os.path.dirname(sys.executable), "tensorboard")
    return [exe, "--logdir", logdir, "--host", "127.0.0.1", "--port", str(port)]


def check_port(port: int) -> str:
    """Why ``port`` must not be used ("" when it may)."""
    if port in FORBIDDEN_PORTS:
        return f"{FORBIDDEN_PORTS[port]}; use another port, e.g. PORT={DEFAULT_PORT} (the default)"
    if not 0 < port < 65536:
        return f"port {port} is not a TCP port (1-65535)"
    return ""


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m lab.common.tbview",
                                description="Serve a TensorBoard logdir on 127.0.0.1: the latest comparison "
                                            "(scaling, scaling-netns, bench) by default.")
    p.add_argument("logdir", nargs="?", default="", help="logdir to serve (default: the newest runs/**/tensorboard, "
                                                         "else runs/)")
    p.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"(default: {DEFAULT_PORT}; 6006 is refused)")
    p.add_argument("--root", default="runs", help="where to look for the latest comparison (default: runs)")
    args = p.parse_args(argv)
    why = check_port(args.port)
    if why:
        print(f"tensorboard: error: {why}", file=sys.stderr)
        return 2
    logdir, tab = args.logdir, "custom_scalars"
    if logdir and not os.path.isdir(logdir):
        print(f"tensorboard: error: {logdir}: no such directory; give a logdir, e.g. RUN=runs/scaling/<time>/tensorboard",
              file=sys.stderr)
        return 2
    if not logdir:
        logdir = latest_comparison(args.root) or ""
        if not logdir:
            logdir, tab = args.root, "scalars"
            print(f"no comparison under {args.root}/ (make scaling, make bench write one): serving {logdir}/")
    if os.path.basename(os.path.normpath(logdir)) != COMPARISON_DIR:
        tab = "scalars"
    print(f"serving {logdir}; open {url(args.port, tab)}", flush=True)
    parent = os.path.dirname(os.path.normpath(logdir))
    for sub, what in (("hparams", "every job in the HParams tab"), ("jobs", "every job's own run")):
        if tab == "custom_scalars" and os.path.isdir(os.path.join(parent, sub)):
            print(f"  {what}: make tensorboard RUN={os.path.join(parent, sub)}", flush=True)
    cmd = command(logdir, args.port)
    print("+ " + " ".join(cmd), flush=True)
    os.execv(cmd[0], cmd)  # the server in this process: Ctrl-C ends it


if __name__ == "__main__":
    sys.exit(main())
