"""An emulated multi-host cluster on one machine: network namespaces joined by rate-limited links.

    python -m lab.emulation -np 4 --emulate-hosts 4 --link-rate 100mbit -- --model lenet5
    python -m lab.emulation.netns list | cleanup                 # leftovers of runs that died
    python -m lab.emulation.probe bench --link-rate 100mbit      # measure one emulated link (probe.py)

On one machine every rank talks through shared memory, so a parameter server's saturated links
cannot show. Here each emulated host is a network namespace with one link (a veth pair) to a
switch (a Linux bridge); both directions of every link are rate-limited with a ``tbf`` qdisc, as
on a full-duplex switch port. ``netem`` is not available on the kernels this was built on, so
links add no latency beyond the kernel's own (microseconds); only bandwidth is emulated.

Layout; everything lives inside namespaces this run creates, the root namespace is not touched::

    <prefix>-head   br0 10.213.0.254/24, mpirun runs here (hostname "head")
      |-- veth "h1" (egress tbf = h1's download) == "emu0" 10.213.0.1/24 in <prefix>-h1 (egress tbf = upload)
      |-- veth "h2" ...                          == "emu0" 10.213.0.2/24 in <prefix>-h2
      ...

mpirun reaches the hosts through Open MPI's ``plm_rsh_agent`` set to ``rsh_netns.sh``, which runs
the remote command with ``ip netns exec`` instead of ssh, so the real multi-host path (``-H``,
one ``orted`` per host, the TCP transport) is what runs. Namespaces share the machine's hostname
and /dev/shm, which would make Open MPI treat every rank as local and use shared memory; each host
therefore gets its own UTS namespace (its own hostname) and MPI is held to ``btl tcp,self``.

The prefix is ``art-<pid>-<n>`` (pid of the creating process): a namespace whose creator is dead
is a leftover, and a new cluster refuses to start until ``python -m lab.emulation.netns cleanup`` ran.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

NAME_PREFIX = "art-"
NAME_RE = re.compile(r"^art-(\d+)-\d+-(head|h\d+)$")
SUBNET = "10.213.0"  # /24, private, and only ever configured inside our own namespaces
HEAD_ADDR = f"{SUBNET}.254"
HOST_IFACE = "emu0"  # distinct from any real interface: a rank that ended up outside its namespace fails loudly
AGENT = Path(__file__).resolve().parent / "rsh_netns.sh"
AGENT_ENV = "ALLREDUCE_TRAIN_NETNS"  # tells the agent which cluster's namespaces "h1", "h2", ... are
MAX_HOSTS = 200
CMD_TIMEOUT = 30  # seconds for any one ip/tc command
_RATE_RE = re.compile(r"^(\d+(?:\.\d+)?)\s*([kmg]?)bit$", re.IGNORECASE)
_seq = itertools.count()


class ClusterError(RuntimeError):
    """The emulated cluster cannot be created or removed; the message says what to do."""


def parse_rate(rate: str) -> int:
    """``"1gbit"`` / ``"100mbit"`` / ``"500kbit"`` -> bits per second; ``"none"`` -> 0 (unlimited)."""
    if rate.strip().lower() in ("none", "0", "unlimited"):
        return 0
    m = _RATE_RE.match(rate.strip())
    if not m:
        raise ValueError(f"--link-rate {rate!r}: expected a rate like 1gbit, 100mbit, 500kbit, or none")
    bits = float(m.group(1)) * {"": 1, "k": 1e3, "m": 1e6, "g": 1e9}[m.group(2).lower()]
    if bits < 1e5:
        raise ValueError(f"--link-rate {rate!r}: below 100kbit the job's own control traffic would time out")
    return int(bits)


def format_rate(bits: int) -> str:
    if bits == 0:
        return "unlimited"
    for unit, scale in (("gbit", 1e9), ("mbit", 1e6), ("kbit", 1e3)):
        if bits >= scale:
            return f"{bits / scale:g}{unit}"
    return f"{bits}bit"


def tbf(rate_bits: int) -> list[str]:
    """The ``tc`` qdisc arguments that limit one direction of a link to ``rate_bits``."""
    # The bucket must hold a 64 KiB GSO segment and about 1 ms at the rate, or the rate is not
    # reached; a 20 ms queue is a switch-port-sized buffer.
    burst = max(64 * 1024, rate_bits // 8 // 1000)
    return ["tbf", "rate", f"{rate_bits}bit", "burst", str(burst), "latency", "20ms"]


@dataclass(frozen=True)
class ClusterSpec:
    """What to build; pure data (no side effects), so launch commands can be built and tested from it."""

    hosts: int = 2
    link_rate: str = "1gbit"
    prefix: str = ""  # default: art-<pid>-<n>

    def __post_init__(self):
        if not 1 <= self.hosts <= MAX_HOSTS:
            raise ValueError(f"--emulate-hosts must be between 1 and {MAX_HOSTS} (got {self.hosts})")
        parse_rate(self.link_rate)
        if not self.prefix:
            object.__setattr__(self, "prefix", f"{NAME_PREFIX}{os.getpid()}-{next(_seq)}")
        if not NAME_RE.match(f"{self.prefix}-head"):
            raise ValueError(f"cluster prefix {self.prefix!r} must look like art-<pid>-<n>")
        if any(c in str(AGENT) for c in " :"):  # Open MPI splits plm_rsh_agent at spaces and colons
            raise ValueError(
                f"--emulate-hosts: the checkout path {AGENT.parents[2]} contains a space or ':', "
                "which Open MPI's plm_rsh_agent cannot take; move the checkout"
            )

    @property
    def rate_bits(self) -> int:
        return parse_rate(self.link_rate)

    @property
    def head(self) -> str:
        return f"{self.prefix}-head"

    def hostname(self, i: int) -> str:
        """Host ``i`` (1-based) as mpirun's ``-H`` names it."""
        return f"h{i}"

    def netns(self, i: int) -> str:
        return f"{self.prefix}-{self.hostname(i)}"

    def address(self, i: int) -> str:
        return f"{SUBNET}.{i}"

    @property
    def namespaces(self) -> list[str]:
        return [self.head] + [self.netns(i) for i in range(1, self.hosts + 1)]

    def host_list(self, np: int) -> str:
        """``-H`` for ``np`` ranks spread evenly, the first hosts taking one extra when it does not divide."""
        if np < self.hosts:
            raise ValueError(f"-np {np} is fewer than --emulate-hosts {self.hosts}: every emulated host needs a rank")
        q, r = divmod(np, self.hosts)
        return ",".join(f"{self.hostname(i)}:{q + (1 if i <= r else 0)}" for i in range(1, self.hosts + 1))

    def setup_commands(self) -> list[list[str]]:
        """The ip/tc commands that build the cluster, in order."""
        head = self.head
        cmds = [["ip", "netns", "add", ns] for ns in self.namespaces]
        cmds += [
            ["ip", "-n", head, "link", "add", "br0", "type", "bridge"],
            ["ip", "-n", head, "addr", "add", f"{HEAD_ADDR}/24", "dev", "br0"],
            ["ip", "-n", head, "link", "set", "br0", "up"],
            ["ip", "-n", head, "link", "set", "lo", "up"],
        ]
        for i in range(1, self.hosts + 1):
            ns, port = self.netns(i), self.hostname(i)
            cmds += [
                ["ip", "-n", head, "link", "add", port, "type", "veth", "peer", "name", HOST_IFACE, "netns", ns],
                ["ip", "-n", head, "link", "set", port, "master", "br0"],
                ["ip", "-n", head, "link", "set", port, "up"],
                ["ip", "-n", ns, "addr", "add", f"{self.address(i)}/24", "dev", HOST_IFACE],
                ["ip", "-n", ns, "link", "set", HOST_IFACE, "up"],
                ["ip", "-n", ns, "link", "set", "lo", "up"],
            ]
            if self.rate_bits:
                cmds += [
                    ["tc", "-n", ns, "qdisc", "add", "dev", HOST_IFACE, "root", *self._tbf()],  # upload
                    ["tc", "-n", head, "qdisc", "add", "dev", port, "root", *self._tbf()],
                ]  # download
        return cmds

    def _tbf(self) -> list[str]:
        return tbf(self.rate_bits)

    def exec_prefix(self, host: int | None = None) -> list[str]:
        """Run a command in the head (``None``) or host ``host``'s namespace under its own hostname."""
        ns, name = (self.head, "head") if host is None else (self.netns(host), self.hostname(host))
        # `unshare --uts` gives the process tree its own hostname: Open MPI and Horovod tell hosts
        # apart by hostname, and every namespace would otherwise report the machine's.
        return [
            "ip",
            "netns",
            "exec",
            ns,
            "env",
            f"{AGENT_ENV}={self.prefix}",
            "unshare",
            "--uts",
            "--",
            "sh",
            "-c",
            'hostname "$0" && exec "$@"',
            name,
        ]

    def mca(self) -> list[tuple[str, str]]:
        """Open MPI parameters: hosts via the namespace agent, traffic on TCP over the emulated links."""
        net = f"{SUBNET}.0/24"
        return [
            ("plm_rsh_agent", str(AGENT)),
            ("plm_rsh_no_tree_spawn", "1"),  # every orted is started by mpirun, through the agent
            ("btl", "tcp,self"),  # never shared memory: /dev/shm is common to all namespaces
            ("btl_tcp_if_include", net),
            ("oob_tcp_if_include", net),
            # One TCP connection per pair of ranks halves an exchange that sends both ways at once
            # (ring, colocated PS: 2.1x the link-rate bound at 100 Mbit/s, while two plain TCP
            # streams fill both directions); four per pair come within 10 % (docs/emulated_cluster.md).
            ("btl_tcp_links", "4"),
        ]

    def env(self) -> dict[str, str]:
        """Interface selection for libraries that open their own sockets (Gloo, NCCL)."""
        return {"HOROVOD_GLOO_IFACE": HOST_IFACE, "GLOO_SOCKET_IFNAME": HOST_IFACE, "NCCL_SOCKET_IFNAME": HOST_IFACE}

    def describe(self) -> str:
        return (
            f"emulated cluster {self.prefix}: {self.hosts} hosts h1..h{self.hosts} "
            f"({self.address(1)}..{self.address(self.hosts)}) on one switch, each link "
            f"{format_rate(self.rate_bits)} per direction, no added latency"
        )


def _run(cmd: list[str], check: bool = True) -> subprocess.CompletedProcess:
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=CMD_TIMEOUT)
    except subprocess.TimeoutExpired as e:
        raise ClusterError(f"`{shlex.join(cmd)}` did not finish within {CMD_TIMEOUT}s") from e
    if check and proc.returncode != 0:
        raise ClusterError(f"`{shlex.join(cmd)}` failed: {proc.stderr.strip() or f'exit {proc.returncode}'}")
    return proc


def list_namespaces() -> list[str]:
    """Every namespace this tool created (by name), whoever created it."""
    if shutil.which("ip") is None:
        return []
    out = _run(["ip", "netns", "list"], check=False).stdout
    return sorted(n for n in (ln.split()[0] for ln in out.splitlines() if ln.strip()) if NAME_RE.match(n))


def _pid_alive(pid: int) -> bool:
    return os.path.exists(f"/proc/{pid}")


def leftovers() -> list[str]:
    """Namespaces of runs whose creating process is gone."""
    return [n for n in list_namespaces() if (m := NAME_RE.match(n)) and not _pid_alive(int(m.group(1)))]


def cleanup_command() -> str:
    return f"{shlex.quote(sys.executable)} -m lab.emulation.netns cleanup"


def unavailable_reason() -> str | None:
    """Why namespaces cannot be used here (``None`` when they can): missing tools or privileges."""
    for tool, pkg in (("ip", "iproute2"), ("tc", "iproute2"), ("unshare", "util-linux")):
        if shutil.which(tool) is None:
            return f"`{tool}` not found: install {pkg} (apt-get install {pkg})"
    probe = ClusterSpec(hosts=1, link_rate="1gbit")
    try:
        for cmd in probe.setup_commands()[:1] + [
            ["ip", "-n", probe.head, "link", "add", "br0", "type", "bridge"],
            ["tc", "-n", probe.head, "qdisc", "add", "dev", "lo", "root", *probe._tbf()],
            ["ip", "netns", "exec", probe.head, "unshare", "--uts", "--", "hostname", "probe"],
        ]:
            _run(cmd)
    except ClusterError as e:
        return (
            f"cannot create network namespaces here (needs root, or CAP_NET_ADMIN and CAP_SYS_ADMIN; "
            f"the tbf qdisc; unshare --uts): {e}"
        )
    finally:
        if probe.head in list_namespaces():
            _run(["ip", "netns", "delete", probe.head], check=False)
    return None


def _ns_inode(name: str) -> int | None:
    try:
        return os.stat(f"/run/netns/{name}").st_ino
    except OSError:
        return None


def _holders(inodes: set[int]) -> list[int]:
    """Pids of processes that are still inside one of these network namespaces."""
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                link = os.readlink(f"/proc/{entry}/ns/net")
            except OSError:
                continue
            m = re.match(r"net:\[(\d+)\]", link)
            if m and int(m.group(1)) in inodes:
                pids.append(int(entry))
    return pids


def stop_processes(live: Callable[[], list[int]], grace: float) -> list[int]:
    """SIGTERM what ``live()`` returns, wait up to ``grace`` s for it to go, then the same with SIGKILL.

    ``live`` is asked again while waiting, so it decides what still counts (a namespace's holders,
    a recorded daemon that is still itself). Returns the PIDs that survived both signals.
    """
    pids = live()
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + grace
        while pids and time.monotonic() < deadline:
            time.sleep(0.1)
            pids = live()
        if not pids:
            break
    return pids


def stop_inside(names: list[str], grace: float = 5.0) -> list[int]:
    """End every process inside these namespaces (TERM, then KILL), keeping the namespaces: what a job
    that mpirun could not end left on its hosts. Returns the PIDs that survived."""
    inodes = {ino for ino in map(_ns_inode, names) if ino is not None}
    return stop_processes(lambda: _holders(inodes), grace)


def remove(names: list[str], grace: float = 5.0, retry: str | None = None) -> None:
    """Stop every process inside these namespaces (TERM, then KILL) and delete them.

    On failure the error line ends with ``retry`` (default: this module's cleanup command).

    A network namespace, with its veths and qdiscs, lives as long as a process is inside it, so
    deleting the name is not enough: whatever mpirun left behind (a daemonised ``orted``, a rank
    stuck in a collective) is ended first. Only processes inside our own namespaces are signalled.
    """
    inodes = {ino for ino in map(_ns_inode, names) if ino is not None}
    stop_inside(names, grace)
    errors = []
    for name in names:
        if os.path.exists(f"/run/netns/{name}"):
            proc = _run(["ip", "netns", "delete", name], check=False)
            if proc.returncode != 0:
                errors.append(f"{name}: {proc.stderr.strip()}")
    still = _holders(inodes)
    if errors or still:
        raise ClusterError(
            f"could not remove emulated hosts ({'; '.join(errors) or f'pids {still} survive SIGKILL'}); "
            f"retry with: {retry or cleanup_command()}"
        )


class EmulatedCluster:
    """Creates the cluster on enter and removes it on exit, whatever ended the block.

    SIGTERM and SIGHUP are turned into exceptions while the cluster exists, so that a killed
    launcher still removes its namespaces; Ctrl-C (KeyboardInterrupt) already unwinds. During the
    teardown all three are ignored, so that a second signal cannot leave namespaces behind.
    """

    def __init__(self, spec: ClusterSpec, log=print):
        self.spec = spec
        self.log = log
        self._old_handlers: dict[int, Any] = {}  # what signal.signal returned: a handler, SIG_DFL or None

    def create(self) -> EmulatedCluster:
        old = leftovers()
        if old:
            raise ClusterError(
                f"leftovers of an earlier emulated run exist ({', '.join(old)}); remove them with: {cleanup_command()}"
            )
        clash = [n for n in self.spec.namespaces if os.path.exists(f"/run/netns/{n}")]
        if clash:
            raise ClusterError(f"namespace {clash[0]} already exists; choose another prefix")
        try:
            for cmd in self.spec.setup_commands():
                _run(cmd)
        except BaseException:
            self.destroy()
            raise
        self.log(self.spec.describe())
        return self

    def destroy(self) -> None:
        remove([n for n in self.spec.namespaces if os.path.exists(f"/run/netns/{n}")])

    def __enter__(self) -> EmulatedCluster:
        if _is_main_thread():
            for sig in (signal.SIGTERM, signal.SIGHUP):
                self._old_handlers[sig] = signal.signal(sig, _raise_exit)
        try:
            return self.create()
        except BaseException:
            self._restore()
            raise

    def __exit__(self, *exc) -> None:
        if _is_main_thread():  # a second Ctrl-C or a TERM must not cut the teardown short
            for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
                old = signal.signal(sig, signal.SIG_IGN)
                self._old_handlers.setdefault(sig, old)
        try:
            try:
                self.log(self.traffic_line())
            except ClusterError:
                pass  # the cluster broke; removing it is what matters now
            self.destroy()
        finally:
            self._restore()

    def _restore(self) -> None:
        for sig, handler in self._old_handlers.items():
            signal.signal(sig, handler)
        self._old_handlers.clear()

    def link_bytes(self, host: int) -> tuple[int, int]:
        """(received, sent) bytes on host ``host``'s link, from the kernel's interface counters."""
        out = _run(["ip", "-n", self.spec.netns(host), "-j", "-s", "link", "show", "dev", HOST_IFACE]).stdout
        stats = json.loads(out)[0]["stats64"]
        return stats["rx"]["bytes"], stats["tx"]["bytes"]

    def traffic_line(self) -> str:
        """Bytes each host sent/received over its link so far (kernel counters), one line."""
        parts = []
        for i in range(1, self.spec.hosts + 1):
            if not os.path.exists(f"/run/netns/{self.spec.netns(i)}"):
                continue  # a host removed while the job ran (tests/launch/test_elastic.py)
            rx, tx = self.link_bytes(i)
            parts.append(f"{self.spec.hostname(i)} {tx}/{rx}")
        return "link traffic (bytes sent/received): " + ", ".join(parts)

    def qdiscs(self) -> list[str]:
        """Every qdisc on the cluster's links, as ``tc`` prints it."""
        lines = []
        for i in range(1, self.spec.hosts + 1):
            for ns, dev in ((self.spec.netns(i), HOST_IFACE), (self.spec.head, self.spec.hostname(i))):
                lines += _run(["tc", "-n", ns, "qdisc", "show", "dev", dev]).stdout.strip().splitlines()
        return lines


def _is_main_thread() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()


def _raise_exit(signum, _frame):
    raise SystemExit(128 + signum)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m lab.emulation.netns", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("list", help="namespaces of emulated clusters, with their state")
    c = sub.add_parser("cleanup", help="remove emulated hosts whose creating process is gone")
    c.add_argument("--all", action="store_true", help="also those of runs still alive (stops them)")
    sub.add_parser("bench", help="moved: python -m lab.emulation.probe bench", add_help=False).add_argument(
        "rest", nargs=argparse.REMAINDER
    )
    args = p.parse_args(argv)

    if args.cmd == "bench":
        print(
            "lab.emulation.netns: error: the link measurement moved: python -m lab.emulation.probe bench (same flags)",
            file=sys.stderr,
        )
        return 2
    if args.cmd == "list":
        dead = set(leftovers())
        for name in list_namespaces():
            print(f"{name}\t{'leftover (creator gone)' if name in dead else 'in use'}")
        return 0
    try:
        names = list_namespaces() if args.all else leftovers()
        remove(names)
        print(f"removed {len(names)} namespace(s)" + (f": {', '.join(names)}" if names else ""))
        return 0
    except (ClusterError, ValueError) as e:
        print(f"lab.emulation.netns: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
