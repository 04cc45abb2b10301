"""Measure the emulated links (docs/emulated_cluster.md); needs root.

    python -m lab.emulation.probe bench --link-rate 100mbit             # one TCP stream h2 -> h1
    python -m lab.emulation.probe duplex --link-rate 100mbit --seconds 5

``duplex`` asks whether an emulated link carries its rate in both directions at once: h2 -> h1 alone,
then h1 -> h2 and h2 -> h1 at the same time (one stream each way, as a parameter server's push and a
ring's neighbour exchange need), then one connection carrying both directions at once (as Open MPI's
TCP transport does with one connection per pair of ranks), then --streams parallel streams one way.
The other subcommands are the two ends of those streams, run inside the hosts' namespaces.
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from .netns import CMD_TIMEOUT, ClusterError, ClusterSpec, EmulatedCluster, _run, format_rate, unavailable_reason

CHECKOUT = Path(__file__).resolve().parents[2]  # where python -m lab.emulation.probe runs inside a namespace


def tcp_sink(port: int) -> None:
    """Accept one connection, read it to the end, print bits/s from the first byte to the last."""
    srv = socket.create_server(("0.0.0.0", port))
    srv.settimeout(CMD_TIMEOUT)
    conn, _ = srv.accept()
    conn.settimeout(CMD_TIMEOUT)
    n, t0, t1 = 0, None, None
    while chunk := conn.recv(1 << 20):
        t1 = time.perf_counter()
        t0 = t0 or t1
        n += len(chunk)
    print(f"{8 * n / (t1 - t0) if t0 is not None and t1 is not None and t1 > t0 else 0.0:.0f} {n}")


def tcp_source(addr: str, port: int, seconds: float) -> None:
    deadline = time.monotonic() + CMD_TIMEOUT
    while True:  # the sink may still be starting
        try:
            conn = socket.create_connection((addr, port), timeout=CMD_TIMEOUT)
            break
        except ConnectionRefusedError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)
    buf = b"\0" * (1 << 20)
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        conn.sendall(buf)
    conn.close()


def measure(cluster: EmulatedCluster, src: int, dst: int, seconds: float = 2.0) -> tuple[float, int]:
    """One TCP stream from host ``src`` to host ``dst``: (payload bits/s as received, bytes received)."""
    port = 5201
    python = [sys.executable, "-m", "lab.emulation.probe"]
    cwd = CHECKOUT
    sink = subprocess.Popen(
        cluster.spec.exec_prefix(dst) + python + ["tcp-sink", str(port)], stdout=subprocess.PIPE, text=True, cwd=cwd
    )
    try:
        _run(
            cluster.spec.exec_prefix(src) + python + ["tcp-source", cluster.spec.address(dst), str(port), str(seconds)]
        )
        out, _ = sink.communicate(timeout=seconds + CMD_TIMEOUT)
    finally:
        if sink.poll() is None:
            sink.kill()
            sink.wait()
    bps, nbytes = out.split()
    return float(bps), int(nbytes)


def streams(cluster: EmulatedCluster, pairs: list[tuple[int, int]], seconds: float) -> list[float]:
    """Concurrent TCP streams src -> dst; the payload Mbit/s each receiver measured."""
    spec = cluster.spec
    python = [sys.executable, "-m", "lab.emulation.probe"]
    cwd = CHECKOUT
    sinks: list[subprocess.Popen] = []
    sources: list[subprocess.Popen] = []
    try:
        for i, (_src, dst) in enumerate(pairs):
            sinks.append(
                subprocess.Popen(
                    spec.exec_prefix(dst) + python + ["tcp-sink", str(5301 + i)],
                    stdout=subprocess.PIPE,
                    text=True,
                    cwd=cwd,
                )
            )
        for i, (src, dst) in enumerate(pairs):
            sources.append(
                subprocess.Popen(
                    spec.exec_prefix(src) + python + ["tcp-source", spec.address(dst), str(5301 + i), str(seconds)],
                    cwd=cwd,
                )
            )
        for p in sources:
            p.wait(timeout=seconds + CMD_TIMEOUT)
        return [float(s.communicate(timeout=CMD_TIMEOUT)[0].split()[0]) / 1e6 for s in sinks]
    finally:
        for p in sinks + sources:
            if p.poll() is None:
                p.kill()
                p.wait()


def both_ways(conn: socket.socket, seconds: float) -> None:
    """Send for ``seconds`` while receiving what the peer sends; print the received payload Mbit/s."""
    got, t = [0], [0.0, 0.0]  # bytes received; first and last arrival (0.0: none yet)

    def receive():
        while chunk := conn.recv(1 << 20):
            t[1] = time.perf_counter()
            t[0] = t[0] or t[1]
            got[0] += len(chunk)

    reader = threading.Thread(target=receive)
    reader.start()
    buf, end = b"\0" * (1 << 20), time.monotonic() + seconds
    while time.monotonic() < end:
        conn.sendall(buf)
    conn.shutdown(socket.SHUT_WR)
    reader.join()
    print(f"{8 * got[0] / (t[1] - t[0]) / 1e6 if t[1] and t[1] > t[0] else 0.0:.1f}")


def one_connection(cluster: EmulatedCluster, seconds: float) -> list[float]:
    """h1 and h2 send to each other over one TCP connection at the same time; Mbit/s each received."""
    spec, me = cluster.spec, [sys.executable, "-m", "lab.emulation.probe"]
    server = subprocess.Popen(
        spec.exec_prefix(1) + me + ["serve", "5401", str(seconds)], stdout=subprocess.PIPE, text=True, cwd=CHECKOUT
    )
    try:
        client = subprocess.run(
            spec.exec_prefix(2) + me + ["connect", spec.address(1), "5401", str(seconds)],
            capture_output=True,
            text=True,
            timeout=seconds + CMD_TIMEOUT,
            cwd=CHECKOUT,
        )
        return [float(server.communicate(timeout=CMD_TIMEOUT)[0]), float(client.stdout)]
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()


def duplex(link_rate: str, seconds: float, n_streams: int) -> None:
    """Does an emulated link carry its rate in both directions at once? Prints one line per pattern."""
    print(f"load average before: {' '.join(Path('/proc/loadavg').read_text().split()[:3])}")
    with EmulatedCluster(ClusterSpec(hosts=2, link_rate=link_rate), log=lambda m: None) as cluster:
        (one,) = streams(cluster, [(2, 1)], seconds)
        print(f"one way      h2 -> h1: {one:7.1f} Mbit/s")
        a, b = streams(cluster, [(1, 2), (2, 1)], seconds)
        print(f"both ways    h1 -> h2: {a:7.1f} Mbit/s, h2 -> h1: {b:7.1f} Mbit/s at the same time")
        a, b = one_connection(cluster, seconds)
        print(f"one connection, both ways: h2 -> h1 {a:7.1f} Mbit/s, h1 -> h2 {b:7.1f} Mbit/s at the same time")
        many = streams(cluster, [(2, 1)] * n_streams, seconds)
        print(
            f"{n_streams} streams  h2 -> h1: "
            + ", ".join(f"{v:.1f}" for v in many)
            + f" Mbit/s, together {sum(many):.1f}"
        )
    print(f"load average after: {' '.join(Path('/proc/loadavg').read_text().split()[:3])}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m lab.emulation.probe", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("bench", help="build two emulated hosts, measure one TCP stream between them")
    b.add_argument("--link-rate", default="1gbit")
    b.add_argument("--seconds", type=float, default=3.0)
    d = sub.add_parser("duplex", help="one way, both ways, one connection both ways, parallel streams")
    d.add_argument("--link-rate", default="100mbit")
    d.add_argument("--seconds", type=float, default=5.0)
    d.add_argument("--streams", type=int, default=2)
    s = sub.add_parser("tcp-sink", help="(internal) receive one TCP stream, print bits/s and bytes")
    s.add_argument("port", type=int)
    s = sub.add_parser("tcp-source", help="(internal) send one TCP stream")
    s.add_argument("addr")
    s.add_argument("port", type=int)
    s.add_argument("seconds", type=float)
    s = sub.add_parser("serve", help="(internal) one end of a connection used both ways")
    s.add_argument("port", type=int)
    s.add_argument("seconds", type=float)
    s = sub.add_parser("connect", help="(internal) the other end")
    s.add_argument("addr")
    s.add_argument("port", type=int)
    s.add_argument("seconds", type=float)
    args = p.parse_args(argv)

    if args.cmd == "tcp-sink":
        tcp_sink(args.port)
        return 0
    if args.cmd == "tcp-source":
        tcp_source(args.addr, args.port, args.seconds)
        return 0
    if args.cmd == "serve":
        srv = socket.create_server(("0.0.0.0", args.port))
        both_ways(srv.accept()[0], args.seconds)
        return 0
    if args.cmd == "connect":
        for _ in range(100):
            try:
                conn = socket.create_connection((args.addr, args.port), timeout=CMD_TIMEOUT)
                break
            except ConnectionRefusedError:
                time.sleep(0.1)
        both_ways(conn, args.seconds)
        return 0
    reason = unavailable_reason()
    if reason:
        print(f"lab.emulation.probe: error: {reason}", file=sys.stderr)
        return 2
    try:
        if args.cmd == "duplex":
            duplex(args.link_rate, args.seconds, args.streams)
            return 0
        spec = ClusterSpec(hosts=2, link_rate=args.link_rate)
        with EmulatedCluster(spec) as cluster:
            bps, _ = measure(cluster, src=2, dst=1, seconds=args.seconds)
        limit = (
            f"link {format_rate(spec.rate_bits)}; TCP payload tops out near 95 % of it at MTU 1500"
            if spec.rate_bits
            else "no rate limit: bounded by this machine's CPU"
        )
        print(f"h2 -> h1: {bps / 1e6:.1f} Mbit/s TCP payload over {args.seconds:g} s ({limit})")
        return 0
    except (ClusterError, ValueError) as e:
        print(f"lab.emulation.probe: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    os.environ.setdefault("HWLOC_COMPONENTS", "-gl")
    raise SystemExit(main())
