"""``make tensorboard``: serve the latest comparison (or a given logdir) and print the URL to open.

    python -m lab.tbcheck.tbview                  # the newest <out>/tensorboard under runs/
    python -m lab.tbcheck.tbview runs/scaling/20261203-170000/tensorboard --port 6010

The latest comparison is the newest ``tensorboard/`` directory (by its event files) that a
``scaling``, ``scaling-netns`` or ``bench`` run wrote under ``runs/``; with none, the training
runs in ``runs/``. TensorBoard listens on 127.0.0.1 only. The URL opens the Custom Scalars tab
with smoothing 0 (TensorBoard keeps the smoothing in the URL fragment; its default, 0.6, bends
a curve of two or three points away from the measured values).

TensorBoard runs in this process, with its own web assets but for two changes, so that every
dashboard the page opens -- ``http://127.0.0.1:PORT/`` included, which opens Time Series -- starts
unsmoothed and with "Ignore outliers in chart scaling" unticked:

- one script in its page (:data:`DEFAULTS_SCRIPT`) fills in TensorBoard's own stored settings where
  the user never made one: Time Series keeps smoothing and the outlier box in the browser's storage
  (``_tb_global_settings``), Scalars and Custom Scalars keep the outlier box there (``_ignoreYOutliers``);
  a choice made in the page is kept;
- Scalars' and Custom Scalars' smoothing is no stored setting (the URL fragment carries it, and a tab
  click drops it): its default in the page's code, 0.6, becomes 0 (:func:`patched_assets`).

Smoothed, a curve of two or three points bends away from the measured values (and Time Series' data
table shows the smoothed ones); with outliers ignored a chart's y axis spans the values between their
5th and 95th percentiles, and a comparison line of two to four points has its lowest and highest value
outside it: they leave the plot. The Custom Scalars layout has no field for a y range (layout.proto: a
title and tag regexes).
"""

from __future__ import annotations

import argparse
import io
import os
import re
import sys
import zipfile

from ..common.tblog import COMPARISON_DIR

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


# Loaded first by TensorBoard's page (index.html): the settings below unless the user chose.
DEFAULTS_JS = "allreduce-train-defaults.js"
DEFAULTS_SCRIPT = """// allreduce_train (lab/tbcheck/tbview.py): every dashboard starts unsmoothed and with "Ignore
// outliers in chart scaling" unticked, so a comparison line of a few points is drawn whole at its
// measured values; a choice made in the page is kept (only settings never made are filled in).
(function () {
  try {
    var store = window.localStorage;
    // Scalars and Custom Scalars (Polymer): the outlier box
    if (store.getItem("_ignoreYOutliers") === null) store.setItem("_ignoreYOutliers", "false");
    // Time Series: one JSON object of the settings made in the page
    var settings = {};
    try { settings = JSON.parse(store.getItem("_tb_global_settings") || "{}") || {}; } catch (e) { settings = {}; }
    if (!("scalarSmoothing" in settings)) settings.scalarSmoothing = 0;
    if (!("ignoreOutliers" in settings)) settings.ignoreOutliers = false;
    store.setItem("_tb_global_settings", JSON.stringify(settings));
  } catch (e) { /* no storage: TensorBoard's own defaults */ }
})();
"""
# Scalars' and Custom Scalars' smoothing default in the page's code: '"_smoothingWeight",{defaultValue:.6}'
POLYMER_SMOOTHING = re.compile(r'("_smoothingWeight",\s*\{\s*defaultValue:\s*)(?:0?\.6)\b')


def command(logdir: str, port: int, stock: bool = False) -> list[str]:
    """The TensorBoard command line, loopback only: this module's server (``stock``: the venv's plain
    ``tensorboard``, with TensorBoard's own defaults in the page)."""
    if stock:
        exe = os.path.join(os.path.dirname(sys.executable), "tensorboard")
        return [exe, "--logdir", logdir, "--host", "127.0.0.1", "--port", str(port)]
    return [sys.executable, "-m", "lab.tbcheck.tbview", "--serve", logdir, "--port", str(port)]


def patched_assets(original: bytes) -> bytes:
    """TensorBoard's web assets (a zip) with :data:`DEFAULTS_SCRIPT` added and loaded first by index.html,
    and the Polymer dashboards' smoothing default 0 in index.js (:data:`POLYMER_SMOOTHING`). A RuntimeError
    when either place is not found (another TensorBoard's page): better no server than a smoothed one."""
    out = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(original)) as src, zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as dst:
        for info in src.infolist():
            data = src.read(info.filename)
            if info.filename == "index.html":
                html = data.decode("utf-8")
                if "<head>" not in html:
                    raise RuntimeError("TensorBoard's index.html has no <head>: cannot add the defaults script")
                data = html.replace("<head>", f'<head><script src="{DEFAULTS_JS}"></script>', 1).encode("utf-8")
            elif info.filename == "index.js":
                js, n = POLYMER_SMOOTHING.subn(r"\g<1>0", data.decode("utf-8"))
                if not n:
                    raise RuntimeError(
                        "TensorBoard's index.js has no '_smoothingWeight' default of 0.6: cannot start Scalars "
                        "and Custom Scalars unsmoothed (another TensorBoard version? lab/tbcheck/tbview.py)"
                    )
                data = js.encode("utf-8")
            dst.writestr(info, data)
        dst.writestr(DEFAULTS_JS, DEFAULTS_SCRIPT)
    return out.getvalue()


def serve(logdir: str, port: int) -> int:
    """TensorBoard on 127.0.0.1:``port`` in this process with the patched assets, until it is stopped."""
    from tensorboard import assets, program

    with assets.get_default_assets_zip_provider()() as fh:
        data = patched_assets(fh.read())
    tb = program.TensorBoard(assets_zip_provider=lambda: io.BytesIO(data))
    tb.configure(argv=[None, "--logdir", logdir, "--host", "127.0.0.1", "--port", str(port)])
    return tb.main()


def check_port(port: int) -> str:
    """Why ``port`` must not be used ("" when it may)."""
    if port in FORBIDDEN_PORTS:
        return f"{FORBIDDEN_PORTS[port]}; use another port, e.g. PORT={DEFAULT_PORT} (the default)"
    if not 0 < port < 65536:
        return f"port {port} is not a TCP port (1-65535)"
    return ""


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m lab.tbcheck.tbview",
        description="Serve a TensorBoard logdir on 127.0.0.1: the latest comparison "
        "(scaling, scaling-netns, bench) by default.",
    )
    p.add_argument(
        "logdir", nargs="?", default="", help="logdir to serve (default: the newest runs/**/tensorboard, else runs/)"
    )
    p.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"(default: {DEFAULT_PORT}; 6006 is refused)")
    p.add_argument("--root", default="runs", help="where to look for the latest comparison (default: runs)")
    p.add_argument("--serve", action="store_true", help="serve LOGDIR and print nothing else (tb-check's server)")
    args = p.parse_args(argv)
    why = check_port(args.port)
    if why:
        print(f"tensorboard: error: {why}", file=sys.stderr)
        return 2
    if args.serve:
        if not os.path.isdir(args.logdir):
            print(f"tensorboard: error: --serve {args.logdir or '(none)'}: give the logdir to serve", file=sys.stderr)
            return 2
        return serve(args.logdir, args.port)
    logdir, tab = args.logdir, "custom_scalars"
    if logdir and not os.path.isdir(logdir):
        print(
            f"tensorboard: error: {logdir}: no such directory; give a logdir, e.g. RUN=runs/scaling/<time>/tensorboard",
            file=sys.stderr,
        )
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
    print(
        f"+ tensorboard --logdir {logdir} --host 127.0.0.1 --port {args.port} (in this process; "
        'every dashboard starts unsmoothed, "Ignore outliers in chart scaling" unticked)',
        flush=True,
    )
    try:
        return serve(logdir, args.port)
    except KeyboardInterrupt:  # Ctrl-C ends the server
        return 0


if __name__ == "__main__":
    sys.exit(main())
