"""Does an emulated link carry its rate in both directions at once? (docs/emulated_cluster.md)

    .venv/bin/python tools/duplex_probe.py --link-rate 100mbit --seconds 5

Builds two emulated hosts and measures TCP payload rates: h2 -> h1 alone, then h1 -> h2 and h2 -> h1
at the same time (one stream each way, as a parameter server's push and a ring's neighbour exchange
need), then --streams parallel streams one way (as Open MPI's btl_tcp_links would open). Needs root.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from launch.netns import CMD_TIMEOUT, ClusterSpec, EmulatedCluster, unavailable_reason  # noqa: E402


def streams(cluster: EmulatedCluster, pairs: list[tuple[int, int]], seconds: float) -> list[float]:
    """Concurrent TCP streams src -> dst; the payload Mbit/s each receiver measured."""
    spec = cluster.spec
    python = [sys.executable, "-m", "launch.netns"]
    cwd = Path(__file__).resolve().parent.parent
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


def main() -> int:
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
        many = streams(cluster, [(2, 1)] * args.streams, args.seconds)
        print(f"{args.streams} streams  h2 -> h1: " + ", ".join(f"{v:.1f}" for v in many)
              + f" Mbit/s, together {sum(many):.1f}")
    print(f"load average after: {' '.join(open('/proc/loadavg').read().split()[:3])}")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("HWLOC_COMPONENTS", "-gl")
    raise SystemExit(main())
