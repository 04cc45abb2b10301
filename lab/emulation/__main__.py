"""``python -m lab.emulation``: ``python -m launch`` on N emulated hosts (network namespaces on this machine; root).

    python -m lab.emulation -np 4 --emulate-hosts 4 --link-rate 100mbit -- --model lenet5
    python -m lab.emulation -np 2 --emulate-hosts 2 --max-restarts 1 --min-np 1 -- --model lenet5 --name r

Every flag of ``python -m launch`` works here, and the job runs through the launcher's own code
(launch/mpirun.py ``main``, with this module plugged in as its ``emulation``): N network namespaces
joined by rate-limited links stand in for the hosts, and Open MPI reaches them through an agent that
replaces ssh (netns.py, rsh_netns.sh). Only the transport to the hosts changes. ``--min-np`` adds the
elastic step: hosts that were lost get no ranks on the restart.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys

from launch import mpirun
from launch.bound import GRACE_PERIOD, run_bounded
from launch.mpirun import LaunchSpec, supervise

from .netns import ClusterError, ClusterSpec, EmulatedCluster, stop_inside, unavailable_reason, unreachable

EMULATED_TIMEOUT = 3600.0  # seconds; an emulated cluster is never left running unattended


class Emulation:
    """The launcher's plug-in (``launch.mpirun.main(emulation=...)``)."""

    @staticmethod
    def add_arguments(p: argparse.ArgumentParser) -> None:
        p.prog = "python -m lab.emulation"
        p.description = __doc__.split("\n\n")[0].split(": ", 1)[1]
        p.epilog = "example: python -m lab.emulation -np 4 --emulate-hosts 4 --link-rate 100mbit -- --model lenet5"
        g = p.add_argument_group("emulated hosts")
        g.add_argument("--emulate-hosts", type=int, default=0, metavar="N", required=True,
                       help="run on N emulated hosts (network namespaces on this machine, needs root) instead of -H")
        g.add_argument("--link-rate", default="1gbit",
                       help="each host's link rate per direction, e.g. 1gbit, 100mbit, none")
        g.add_argument("--min-np", type=int, default=0, metavar="N",
                       help="with --max-restarts: when hosts are lost, restart on the remaining ones as long as at "
                            "least N ranks fit (elastic shrink; default: never shrink)")

    @staticmethod
    def cluster(args: argparse.Namespace) -> ClusterSpec:
        if args.min_np < 0:
            raise ValueError(f"--min-np must be >= 0 (got {args.min_np})")
        if args.min_np and not args.max_restarts:
            raise ValueError("--min-np shrinks the emulated cluster on restart: give --max-restarts too")
        return ClusterSpec(hosts=args.emulate_hosts, link_rate=args.link_rate)

    unavailable_reason = staticmethod(unavailable_reason)

    @staticmethod
    def run(spec: LaunchSpec, cmd: list[str], env: dict[str, str], args: argparse.Namespace) -> int:
        return run_emulated(spec.cluster, cmd, env, args.timeout or EMULATED_TIMEOUT, spec=spec,
                            max_restarts=args.max_restarts, min_np=args.min_np, grace=args.grace_period)


def run_emulated(cluster: ClusterSpec, cmd: list[str], env: dict[str, str], timeout: float,
                 spec: LaunchSpec | None = None, max_restarts: int = 0, min_np: int = 0,
                 grace: float = GRACE_PERIOD) -> int:
    """Build the emulated cluster, run the job in it, and remove the cluster however the job ended.

    With ``max_restarts``, a failed job is relaunched; hosts that cannot be reached (namespace gone,
    link down) get no ranks, and with ``min_np`` the job shrinks onto the remaining hosts (elastic,
    Horovod-style, through a restart from the checkpoint instead of Gloo's rendezvous).
    """

    def shrink(job: LaunchSpec, rc: int) -> LaunchSpec | None:
        em = job.cluster
        # what mpirun could not end (a daemon and its rank on a cut-off host) goes before the next attempt
        stop_inside(em.namespaces)
        gone = unreachable(em) & set(em.live_hosts)
        if not gone:
            return job
        names = ", ".join(em.hostname(i) for i in sorted(gone))
        live = len(em.live_hosts) - len(gone)
        np = job.np * live // len(em.live_hosts)  # the same ranks per host as before
        if not min_np or live == 0 or np < min_np:
            print(f"launch: host(s) {names} lost; {np} ranks would remain, " +
                  (f"fewer than --min-np {min_np}" if min_np else "and without --min-np the job does not shrink") +
                  "; not restarting", file=sys.stderr, flush=True)
            return None
        print(f"launch: elastic: host(s) {names} lost; continuing on {live} host(s): world size {job.np} -> {np} "
              "(the global batch is workers x --batch-size, and with --scale-lr the LR follows the workers: "
              "the trainer prints both)", file=sys.stderr, flush=True)
        return dataclasses.replace(job, np=np, cluster=dataclasses.replace(em, lost=em.lost | gone))

    try:
        with EmulatedCluster(cluster, log=lambda msg: print(msg, flush=True)):
            if spec is None:
                return run_bounded(cmd, env, timeout, grace=grace)
            return supervise(spec, cmd, env, timeout, max_restarts, shrink, grace)
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
