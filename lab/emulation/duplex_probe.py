"""Does an emulated link carry its rate in both directions at once? (docs/emulated_cluster.md)

    .venv/bin/python -m lab.emulation.duplex_probe --link-rate 100mbit --seconds 5

Builds two emulated hosts and measures TCP payload rates: h2 -> h1 alone, then h1 -> h2 and h2 -> h1
at the same time (one stream each way, as a parameter server's push and a ring's neighbour exchange
need), then one connection carrying both directions at once (as Open MPI's TCP transport does with
one connection per pair of ranks), then --streams parallel streams one way. Needs root.
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

from .netns import CMD_TIMEOUT, ClusterSpec, EmulatedCluster, unavailable_reason


def streams(cluster: EmulatedCluster, pairs: list[tuple[int, int]], seconds: float) -> list[float]:
    """Concurrent TCP streams src -> dst; the payload Mbit/s each receiver measured."""
    spec = cluster.spec
    python = [sys.executable, "-m", "lab.emulation.netns"]
    cwd = Path(__file__).resolve().parents[2]  # the checkout
    sinks, sources = [], []
    try:
        for i, (_src, dst) in enumerate(pairs):
            sinks.append(subprocess.Popen(spec.exec_prefix(dst) + python + ["tcp-sink", str(5301 + i)],
                                          stdout=subprocess.PIPE, text=True, cwd=cwd))
        for i, (src, dst) in enumerate(pairs):
            sources.append(subprocess.Popen(spec.exec_prefix(src) + python + [
                "tcp-source", spec.address(dst), str(5301 + i), str(seconds)], cwd=cwd))
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
    got, t = [0], [None, None]

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
    spec, me = cluster.spec, [sys.executable, str(Path(__file__).resolve())]
    server = subprocess.Popen(spec.exec_prefix(1) + me + ["--serve", "5401", str(seconds)], stdout=subprocess.PIPE,
                              text=True)
    try:
        client = subprocess.run(spec.exec_prefix(2) + me + ["--connect", spec.address(1), "5401", str(seconds)],
                                capture_output=True, text=True, timeout=seconds + CMD_TIMEOUT)
        return [float(server.communicate(timeout=CMD_TIMEOUT)[0]), float(client.stdout)]
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()


def main() -> int:
    if sys.argv[1:2] == ["--serve"]:  # internal: one end of one_connection, inside a namespace
        srv = socket.create_server(("0.0.0.0", int(sys.argv[2])))
        both_ways(srv.accept()[0], float(sys.argv[3]))
        return 0
    if sys.argv[1:2] == ["--connect"]:
        for _ in range(100):
            try:
                conn = socket.create_connection((sys.argv[2], int(sys.argv[3])), timeout=CMD_TIMEOUT)
                break
            except ConnectionRefusedError:
                time.sleep(0.1)
        both_ways(conn, float(sys.argv[4]))
        return 0
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--link-rate", default="100mbit")
    p.add_argument("--seconds", type=float, default=5.0)
    p.add_argument("--streams", type=int, default=2)
    args = p.parse_args()
    reason = unavailable_reason()
    if reason:
        print(f"duplex_probe: error: {reason}", file=sys.stderr)
        return 2
    print(f"load average before: {' '.join(open('/proc/loadavg').read().split()[:3])}")
    with EmulatedCluster(ClusterSpec(hosts=2, link_rate=args.link_rate), log=lambda m: None) as cluster:
        (one,) = streams(cluster, [(2, 1)], args.seconds)
        print(f"one way      h2 -> h1: {one:7.1f} Mbit/s")
        a, b = streams(cluster, [(1, 2), (2, 1)], args.seconds)
        print(f"both ways    h1 -> h2: {a:7.1f} Mbit/s, h2 -> h1: {b:7.1f} Mbit/s at the same time")
        a, b = one_connection(cluster, args.seconds)
        print(f"one connection, both ways: h2 -> h1 {a:7.1f} Mbit/s, h1 -> h2 {b:7.1f} Mbit/s at the same time")
        many = streams(cluster, [(2, 1)] * args.streams, args.seconds)
        print(f"{args.streams} streams  h2 -> h1: " + ", ".join(f"{v:.1f}" for v in many)
              + f" Mbit/s, together {sum(many):.1f}")
    print(f"load average after: {' '.join(open('/proc/loadavg').read().split()[:3])}")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("HWLOC_COMPONENTS", "-gl")
    raise SystemExit(main())
