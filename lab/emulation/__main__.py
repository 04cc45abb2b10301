"""``python -m lab.emulation``: ``python -m launch`` on N emulated hosts (network namespaces on this machine; root).

    python -m lab.emulation -np 4 --emulate-hosts 4 --link-rate 100mbit -- --model lenet5
    python -m lab.emulation -np 2 --emulate-hosts 2 --max-restarts 1 --min-np 1 -- --model lenet5 --name r

Every flag of ``python -m launch`` works here, and the job runs through the launcher's own code
(launch/mpirun.py ``main``, with this module plugged in as its ``emulation``): N network namespaces
joined by rate-limited links stand in for the hosts, and Open MPI reaches them through an agent that
replaces ssh (netns.py, rsh_netns.sh). Only the transport to the hosts changes: ``--min-np`` is the
launcher's own elastic step (launch/elastic.py), whose probe reaches these hosts through the same
agent (a host whose namespace is gone or whose link is down does not answer, as over ssh).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

from launch import mpirun
from launch.bound import GRACE_PERIOD, run_bounded

from .netns import ClusterError, ClusterSpec, EmulatedCluster, stop_inside, unavailable_reason

EMULATED_TIMEOUT = 3600.0  # seconds; an emulated cluster is never left running unattended


class Emulation:
    """The launcher's plug-in (``launch.mpirun.main(emulation=...)``): the emulated hosts as a transport."""

    default_timeout = EMULATED_TIMEOUT

    @staticmethod
    def add_arguments(p: argparse.ArgumentParser) -> None:
        p.prog = "python -m lab.emulation"
        p.description = __doc__.split("\n\n")[0].split(": ", 1)[1]
        p.epilog = "example: python -m lab.emulation -np 4 --emulate-hosts 4 --link-rate 100mbit -- --model lenet5"
        g = p.add_argument_group("emulated hosts")
        g.add_argument(
            "--emulate-hosts",
            type=int,
            default=0,
            metavar="N",
            required=True,
            help="run on N emulated hosts (network namespaces on this machine, needs root) instead of -H",
        )
        g.add_argument(
            "--link-rate", default="1gbit", help="each host's link rate per direction, e.g. 1gbit, 100mbit, none"
        )

    @staticmethod
    def cluster(args: argparse.Namespace) -> ClusterSpec:
        return ClusterSpec(hosts=args.emulate_hosts, link_rate=args.link_rate)

    unavailable_reason = staticmethod(unavailable_reason)

    @staticmethod
    def run(cluster: ClusterSpec, job: Callable) -> int:
        return run_emulated(cluster, job=job)


def run_emulated(
    cluster: ClusterSpec,
    cmd: list[str] | None = None,
    env: dict[str, str] | None = None,
    timeout: float = EMULATED_TIMEOUT,
    grace: float = GRACE_PERIOD,
    job: Callable | None = None,
) -> int:
    """Build the emulated cluster, run the job in it, and remove the cluster however the job ended.

    ``job(between)``: the launcher's run (its restarts and elastic step included); ``between()`` ends
    what a failed attempt left on the hosts (a daemon and its rank on a cut-off host, which mpirun
    could not reach) before the next one. Without ``job``: ``cmd`` once, within the launcher's bound.
    """
    try:
        with EmulatedCluster(cluster, log=lambda msg: print(msg, flush=True)):
            if job is not None:
                return job(lambda: stop_inside(cluster.namespaces))
            assert cmd is not None and env is not None, "run_emulated: give job, or cmd and env"
            return run_bounded(cmd, env, timeout, grace=grace)
    except ClusterError as e:
        print(f"launch: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("launch: interrupted; emulated hosts removed", file=sys.stderr)
        return 130


def main(argv: list[str] | None = None) -> int:
    return mpirun.main(argv, emulation=Emulation())


if __name__ == "__main__":
    sys.exit(main())
