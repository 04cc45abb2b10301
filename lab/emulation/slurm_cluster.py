"""An emulated Slurm cluster on one machine: real slurmctld and slurmd daemons, one node per network namespace.

    python -m lab.emulation.slurm_cluster up --nodes 2 --link-rate 1gbit
    export SLURM_CONF=/tmp/allreduce-train-slurm/slurm.conf      # `up` prints this line
    python -m launch slurm --nodes 2 --submit -- --model lenet5 --epochs 1
    python -m lab.emulation.slurm_cluster status
    python -m lab.emulation.slurm_cluster down

What runs (Debian's slurm-wlm and munge; `make install` installs them)::

    root namespace   munged, slurmctld on <hostname>(10.214.0.254), bridge slbr0 10.214.0.254/24
      |-- veth sl-n1 (egress tbf = n1's download) == "slnet0" 10.214.0.1/24 in netns sl-n1: slurmd -N n1
      |-- veth sl-n2 ...                          == "slnet0" 10.214.0.2/24 in netns sl-n2: slurmd -N n2
      ...

Each node is a network namespace with its own address, its own hostname (a UTS namespace) and a
link rate-limited in both directions as with ``--emulate-hosts`` (lab/emulation/netns.py); jobs run by
a node's slurmd are inside its namespace, so Open MPI, Horovod and Slurm itself see separate
hosts whose traffic crosses the emulated links. Facts that shaped this (slurm-wlm 22.05):

- slurmd is started with ``nsenter --net`` and ``unshare --uts``, not ``ip netns exec``: the
  latter remounts /sys, and slurmd then exits with "Unable to initialize cgroup plugin";
- every node has its own spool, pid, log and TmpFS directory (``%n`` in slurm.conf), created
  first: PMIx (``srun --mpi=pmix``) fails on a shared /tmp;
- one munged (its own key and socket, ``AuthInfo=socket=...``) serves every node;
- a requeued job may start again once its credential expired: ``cred_expire=15`` instead of 120 s;
- ``batch_sched_delay=0`` lets a job start within a second of sbatch.

All state (configuration, munge key, spool, logs, PIDs) lives under /tmp/allreduce-train-slurm;
``down`` stops the daemons by their recorded PIDs, ends whatever still runs inside the node
namespaces, removes the namespaces and the bridge, and deletes that directory.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shlex
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from launch.slurm import EMULATED_STATE_DIR

from . import netns

STATE_DIR = EMULATED_STATE_DIR  # where launch/slurm.py looks for the emulated cluster's slurm.conf
NS_PREFIX = "sl-"
BRIDGE = "slbr0"
NODE_IFACE = "slnet0"
SUBNET = "10.214.0"  # /24; distinct from lab.emulation.netns's 10.213.0
CONTROLLER_ADDR = f"{SUBNET}.254"
CONTROLLER_PORT = 6917  # not Slurm's default 6817, so that a real Slurm on this machine is not disturbed
SLURMD_PORT = 6918  # shared by every node: each has its own network namespace
PARTITION = "debug"
MAX_NODES = 64
DAEMONS = ("slurmctld", "slurmd", "munged", "sinfo", "scontrol")
CRED_EXPIRE = 15  # seconds
START_TIMEOUT = 60.0  # seconds for every node to register with the controller


class SlurmClusterError(RuntimeError):
    """The emulated Slurm cluster cannot be started or stopped; the message says what to do."""


@dataclass(frozen=True)
class SlurmClusterSpec:
    """What to build; pure data, so configuration and commands can be tested without daemons."""

    nodes: int = 2
    link_rate: str = "1gbit"
    cpus: int = 0  # CPUs each node offers (default: this machine's)
    state_dir: str = str(STATE_DIR)
    controller_host: str = ""  # default: this machine's short hostname
    first_job_id: int = 0  # default: from the clock, so that job ids (runs/slurm-<id>) differ between clusters

    def __post_init__(self):
        if not 1 <= self.nodes <= MAX_NODES:
            raise ValueError(f"--nodes must be between 1 and {MAX_NODES} (got {self.nodes})")
        netns.parse_rate(self.link_rate)
        if not self.cpus:
            object.__setattr__(self, "cpus", os.cpu_count() or 1)
        if not self.first_job_id:
            object.__setattr__(self, "first_job_id", 1000 + int(time.time()) % 60_000_000)
        if not self.controller_host:
            object.__setattr__(self, "controller_host", socket.gethostname().split(".")[0])

    def node(self, i: int) -> str:
        """Node ``i`` (1-based) as Slurm names it; also its hostname."""
        return f"n{i}"

    @property
    def node_names(self) -> list[str]:
        return [self.node(i) for i in range(1, self.nodes + 1)]

    def netns(self, i: int) -> str:
        return f"{NS_PREFIX}{self.node(i)}"

    def address(self, i: int) -> str:
        return f"{SUBNET}.{i}"

    @property
    def dir(self) -> Path:
        return Path(self.state_dir)

    @property
    def conf(self) -> Path:
        return self.dir / "slurm.conf"

    @property
    def munge_socket(self) -> Path:
        return self.dir / "munge" / "munge.socket"

    def node_range(self) -> str:
        return "n1" if self.nodes == 1 else f"n[1-{self.nodes}]"

    def slurm_conf(self) -> str:
        """slurm.conf for this cluster; paths with ``%n`` become one per node."""
        d = self.dir
        lines = [
            "# Written by `python -m lab.emulation.slurm_cluster up`; removed by `down`.",
            "ClusterName=allreduce-train",
            f"FirstJobId={self.first_job_id}",
            f"SlurmctldHost={self.controller_host}({CONTROLLER_ADDR})",
            f"SlurmctldPort={CONTROLLER_PORT}",
            f"SlurmdPort={SLURMD_PORT}",
            "SlurmUser=root",
            "SlurmdUser=root",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            # cred_expire: how long a requeued job waits before it may start again (Slurm's default: 120 s)
            f"AuthInfo=socket={self.munge_socket},cred_expire={CRED_EXPIRE}",
            f"StateSaveLocation={d}/ctld",
            f"SlurmctldPidFile={d}/run/slurmctld.pid",
            f"SlurmctldLogFile={d}/log/slurmctld.log",
            f"SlurmdSpoolDir={d}/spool/%n",
            f"SlurmdPidFile={d}/run/slurmd-%n.pid",
            f"SlurmdLogFile={d}/log/slurmd-%n.log",
            f"TmpFS={d}/tmp/%n",
            # No cgroups inside a network namespace on a shared /sys: processes are tracked by parentage.
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            "SchedulerType=sched/backfill",
            "SchedulerParameters=batch_sched_delay=0",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_CPU",
            "MpiDefault=none",
            "ReturnToService=2",
            "SlurmdParameters=config_overrides",  # every node declares this machine's CPUs, whatever slurmd detects
            "MailProg=/bin/true",
            "SlurmctldTimeout=30",
            "SlurmdTimeout=30",
            "InactiveLimit=0",
            "KillWait=5",
            "MinJobAge=300",
        ]
        lines += [
            f"NodeName={self.node(i)} NodeAddr={self.address(i)} CPUs={self.cpus} State=UNKNOWN"
            for i in range(1, self.nodes + 1)
        ]
        lines.append(f"PartitionName={PARTITION} Nodes={self.node_range()} Default=YES MaxTime=INFINITE State=UP")
        return "\n".join(lines) + "\n"

    def network_commands(self) -> list[list[str]]:
        """The ip/tc commands that build the nodes' network, in order."""
        cmds = [
            ["ip", "link", "add", BRIDGE, "type", "bridge"],
            ["ip", "addr", "add", f"{CONTROLLER_ADDR}/24", "dev", BRIDGE],
            ["ip", "link", "set", BRIDGE, "up"],
        ]
        rate = netns.parse_rate(self.link_rate)
        for i in range(1, self.nodes + 1):
            ns = port = self.netns(i)  # the root side of the veth carries the namespace's name
            cmds += [
                ["ip", "netns", "add", ns],
                ["ip", "link", "add", port, "type", "veth", "peer", "name", NODE_IFACE, "netns", ns],
                ["ip", "link", "set", port, "master", BRIDGE],
                ["ip", "link", "set", port, "up"],
                ["ip", "-n", ns, "addr", "add", f"{self.address(i)}/24", "dev", NODE_IFACE],
                ["ip", "-n", ns, "link", "set", NODE_IFACE, "up"],
                ["ip", "-n", ns, "link", "set", "lo", "up"],
            ]
            if rate:
                cmds += [
                    ["tc", "-n", ns, "qdisc", "add", "dev", NODE_IFACE, "root", *netns.tbf(rate)],  # upload
                    ["tc", "qdisc", "add", "dev", port, "root", *netns.tbf(rate)],
                ]  # download
        return cmds

    def slurmd_command(self, i: int) -> list[str]:
        """Start node ``i``'s slurmd in its namespace under its own hostname (each ``exec``s: the PID is slurmd's)."""
        name = self.node(i)
        return [
            "nsenter",
            f"--net=/run/netns/{self.netns(i)}",
            "unshare",
            "--uts",
            "--",
            "sh",
            "-c",
            'hostname "$0" && exec "$@"',
            name,
            "slurmd",
            "-D",
            "-N",
            name,
            "-f",
            str(self.conf),
        ]

    def env(self) -> dict[str, str]:
        """What clients (sbatch, squeue, ...) need to find this cluster."""
        return {"SLURM_CONF": str(self.conf)}


# ------------------------------------------------------------------ running it


def _run(cmd: list[str], check: bool = True, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    try:
        proc = subprocess.run(
            cmd, capture_output=True, text=True, timeout=netns.CMD_TIMEOUT, env={**os.environ, **(env or {})}
        )
    except subprocess.TimeoutExpired as e:
        raise SlurmClusterError(f"`{shlex.join(cmd)}` did not finish within {netns.CMD_TIMEOUT}s") from e
    if check and proc.returncode != 0:
        raise SlurmClusterError(f"`{shlex.join(cmd)}` failed: {proc.stderr.strip() or f'exit {proc.returncode}'}")
    return proc


def unavailable_reason() -> str | None:
    """Why the emulated cluster cannot run here (``None`` when it can): missing packages or privileges."""
    for tool in DAEMONS:
        if shutil.which(tool) is None:
            return (
                f"`{tool}` not found: install Slurm and munge "
                "(apt-get install --no-install-recommends slurmctld slurmd slurm-client munge, or make install)"
            )
    if shutil.which("nsenter") is None:
        return "`nsenter` not found: install util-linux"
    return netns.unavailable_reason()


def state_file(state_dir: Path = STATE_DIR) -> Path:
    return state_dir / "cluster.json"


def read_state(state_dir: Path = STATE_DIR) -> dict | None:
    """What ``up`` recorded (spec and daemon PIDs), or ``None`` when no cluster was started."""
    try:
        return json.loads(state_file(state_dir).read_text())
    except (OSError, ValueError):
        return None


def _alive(pid: int, name: str) -> bool:
    """Whether ``pid`` is still the daemon ``name`` we started (not a reused PID, not a zombie).

    A slurmd is briefly nsenter, unshare and sh before each ``exec``s the next."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    comm, state = stat[stat.index("(") + 1 : stat.rindex(")")], stat[stat.rindex(")") + 2]
    return state not in "ZX" and comm in (name[:15], "nsenter", "unshare", "sh")


def _start(cmd: list[str], log: Path, env: dict[str, str]) -> int:
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, **env},
            start_new_session=True,
        )  # outlives `up`
    return proc.pid


def _link_names() -> set[str]:
    out = _run(["ip", "-o", "link", "show"], check=False).stdout
    return {ln.split(":")[1].strip().split("@")[0] for ln in out.splitlines() if ln.count(":") >= 2}


def node_namespaces() -> list[str]:
    out = _run(["ip", "netns", "list"], check=False).stdout
    return sorted(n for n in (ln.split()[0] for ln in out.splitlines() if ln.strip()) if n.startswith(NS_PREFIX))


def leftovers(state_dir: Path = STATE_DIR) -> list[str]:
    """Anything of an emulated Slurm cluster on this machine: state, namespaces, bridge."""
    found = [str(state_dir)] if state_dir.exists() else []
    found += node_namespaces()
    if BRIDGE in _link_names():
        found.append(BRIDGE)
    return found


def up(spec: SlurmClusterSpec, log=print) -> dict:
    """Start the cluster and wait until every node is idle; on any failure remove what was started."""
    reason = unavailable_reason()
    if reason:
        raise SlurmClusterError(reason)
    old = leftovers(spec.dir)
    if old:
        raise SlurmClusterError(
            f"an emulated Slurm cluster (or its leftovers) exists: {', '.join(old)}; "
            f"stop it with: {sys.executable} -m lab.emulation.slurm_cluster down"
        )
    state: dict = {"spec": asdict(spec), "pids": {}}
    try:
        _up(spec, state, log)
    except BaseException:
        down(spec.dir, log=lambda _msg: None, state=state)
        raise
    return state


def _up(spec: SlurmClusterSpec, state: dict, log) -> None:
    d = spec.dir
    for sub in (
        "munge",
        "ctld",
        "run",
        "log",
        *(f"spool/{n}" for n in spec.node_names),
        *(f"tmp/{n}" for n in spec.node_names),
    ):
        (d / sub).mkdir(parents=True, exist_ok=True)
    (d / "munge").chmod(0o755)  # munged requires others to be able to reach its socket
    key = d / "munge" / "munge.key"
    key.write_bytes(secrets.token_bytes(1024))
    key.chmod(0o400)
    spec.conf.write_text(spec.slurm_conf())

    def record():
        state_file(d).write_text(json.dumps(state, indent=1) + "\n")

    record()
    state["pids"]["munged"] = _start(
        [
            "munged",
            "--foreground",
            "--force",
            f"--key-file={key}",
            f"--socket={spec.munge_socket}",
            f"--pid-file={d}/run/munged.pid",
            f"--log-file={d}/log/munged.log",
            f"--seed-file={d}/munge/munged.seed",
        ],
        d / "log" / "munged.out",
        {},
    )
    record()
    _wait_for(lambda: spec.munge_socket.exists(), 10, "munged did not create its socket", d / "log" / "munged.out")
    for cmd in spec.network_commands():
        _run(cmd)
    state["network"] = True
    record()
    env = spec.env()
    state["pids"]["slurmctld"] = _start(
        ["slurmctld", "-D", "-i", "-f", str(spec.conf)], d / "log" / "slurmctld.out", env
    )
    record()
    for i in range(1, spec.nodes + 1):
        state["pids"][f"slurmd-{spec.node(i)}"] = _start(
            spec.slurmd_command(i), d / "log" / f"slurmd-{spec.node(i)}.out", env
        )
        record()

    def all_idle() -> bool:
        for name, pid in state["pids"].items():
            if not _alive(pid, name.split("-")[0]):
                raise SlurmClusterError(f"{name} exited during start-up: {_last_error(d / 'log', name)}")
        out = _run(["sinfo", "-h", "-N", "-o", "%N %t"], check=False, env=env).stdout.split()
        states = dict(zip(out[::2], out[1::2], strict=False))
        return all(states.get(n) == "idle" for n in spec.node_names)

    _wait_for(all_idle, START_TIMEOUT, f"the nodes did not become idle within {START_TIMEOUT:g}s", d / "log")
    link = netns.format_rate(netns.parse_rate(spec.link_rate))
    log(
        f"emulated Slurm cluster up: {spec.nodes} node(s) {spec.node_range()} "
        f"({spec.address(1)}..{spec.address(spec.nodes)}), {spec.cpus} CPUs each, partition {PARTITION}, "
        f"each link {link} per direction; controller {spec.controller_host}({CONTROLLER_ADDR}):{CONTROLLER_PORT}"
    )
    log(f"use it with: export SLURM_CONF={spec.conf}")


def _last_error(logs: Path, name: str) -> str:
    """The last line of a daemon's own log or its console output: why it stopped."""
    for path in (logs / f"{name}.log", logs / f"{name}.out"):
        try:
            lines = [ln for ln in path.read_text(errors="replace").splitlines() if ln.strip()]
        except OSError:
            continue
        if lines:
            return lines[-1].strip()
    return f"no output in {logs}"


def _wait_for(cond, timeout: float, what: str, where: Path) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise SlurmClusterError(f"{what}; see {where}")
        time.sleep(0.2)


def down(state_dir: Path = STATE_DIR, log=print, state: dict | None = None) -> list[str]:
    """Stop everything ``up`` started and remove the namespaces, the bridge and the state directory.

    Safe to call at any time (nothing up, half up, daemons already dead); raises only when
    something survives. Returns what was removed, for the log line.
    """
    state = state if state is not None else (read_state(state_dir) or {"pids": {}})
    removed = []
    # Daemons in the root namespace by their recorded PIDs (slurmds go with their namespaces below,
    # together with whatever a job left running there: mpirun, orted, ranks).
    pids = [(name, pid) for name, pid in state.get("pids", {}).items()]
    netns.stop_processes(lambda: [p for n, p in pids if _alive(p, n.split("-")[0])], grace=5.0)
    removed += [name for name, _ in pids]
    names = node_namespaces()
    if names:
        try:  # a job being torn down need not finish its step
            netns.remove(names, grace=2.0, retry=f"{sys.executable} -m lab.emulation.slurm_cluster down")
        except netns.ClusterError as e:
            raise SlurmClusterError(str(e)) from e
        removed += names
    if BRIDGE in _link_names():
        _run(["ip", "link", "delete", BRIDGE])
        removed.append(BRIDGE)
    if state_dir.exists():
        shutil.rmtree(state_dir)
        removed.append(str(state_dir))
    survivors = [(n, p) for n, p in pids if _alive(p, n.split("-")[0])]
    if survivors:
        raise SlurmClusterError(
            f"could not stop {', '.join(f'{n} (pid {p})' for n, p in survivors)}; "
            f"end them with kill -9 and retry: {sys.executable} -m lab.emulation.slurm_cluster down"
        )
    log("emulated Slurm cluster down" + (f": removed {', '.join(removed)}" if removed else " (nothing was running)"))
    return removed


def status(state_dir: Path = STATE_DIR) -> tuple[bool, list[str]]:
    """(up?, lines describing daemons and nodes)."""
    state = read_state(state_dir)
    if state is None:
        rest = leftovers(state_dir)
        return False, ["no emulated Slurm cluster" + (f"; leftovers: {', '.join(rest)} (run down)" if rest else "")]
    spec = SlurmClusterSpec(**state["spec"])
    lines, ok = [], True
    for name, pid in state["pids"].items():
        alive = _alive(pid, name.split("-")[0])
        ok &= alive
        lines.append(f"{name:16s} pid {pid:<8d} {'running' if alive else 'NOT RUNNING'}")
    proc = _run(["sinfo", "-N", "-o", "%N %P %t %c"], check=False, env=spec.env())
    lines += (proc.stdout or proc.stderr).strip().splitlines()
    lines.append(f"export SLURM_CONF={spec.conf}")
    return ok, lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m lab.emulation.slurm_cluster", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    u = sub.add_parser("up", help="start N nodes, slurmctld and munge; wait until the nodes are idle")
    u.add_argument("--nodes", type=int, default=2, help="number of nodes (default: 2)")
    u.add_argument(
        "--link-rate", default="1gbit", help="each node's link rate per direction, e.g. 1gbit, 100mbit, none"
    )
    u.add_argument("--cpus", type=int, default=0, help="CPUs each node offers (default: this machine's)")
    sub.add_parser("down", help="stop the daemons, remove the namespaces, the bridge and all state")
    sub.add_parser("status", help="daemons and nodes")
    args = p.parse_args(argv)
    try:
        if args.cmd == "up":
            up(SlurmClusterSpec(nodes=args.nodes, link_rate=args.link_rate, cpus=args.cpus))
        elif args.cmd == "down":
            down()
        else:
            ok, lines = status()
            print("\n".join(lines))
            return 0 if ok else 1
        return 0
    except (SlurmClusterError, ValueError) as e:
        print(f"lab.emulation.slurm_cluster: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("lab.emulation.slurm_cluster: interrupted; everything started was removed", file=sys.stderr)
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
