"""Elastic restarts on plain hosts: before a restart, ask which hosts answer and continue on those.

    python -m launch -np 8 -H node1:4,node2:4 --max-restarts 2 --min-np 4 -- --name r --checkpoint-every 100
    python -m launch -np 8 --host-discovery-script ./hosts.sh --max-restarts 2 --min-np 4 -- --name r

Horovod elastic's idea (continue on the hosts that remain, from the last commit) through a restart of
the mpirun job from the last checkpoint (``--resume auto``) instead of Gloo's rendezvous. Before each
restart the hosts are found in one of two ways:

- **the ssh probe** (``-H``/``--hostfile``): every host of the user's list is asked to run ``true``
  through the same agent mpirun starts its daemons with (Open MPI's ``plm_rsh_agent``: ``--mca``,
  ``$OMPI_MCA_plm_rsh_agent``, else ``ssh``), all at once, each bounded by ``--probe-timeout``; ssh runs
  in batch mode (``BatchMode=yes``: a host that would ask for a password or an unknown host key does
  not answer, as it would not for mpirun) with ``ConnectTimeout``. A host that comes back is used again.
- **a discovery script** (``--host-discovery-script``, as ``horovodrun``'s): an executable that prints
  the hosts available now, one ``host:slots`` line each (``host`` alone: 1 slot). It also gives the
  first attempt's hosts.

The job then runs with ``min(-np, slots of the hosts found)`` ranks (``--oversubscribe``: the same
ranks per slot as before); fewer than ``--min-np`` ends it with one line and exit 69 (EX_UNAVAILABLE).
"""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
import signal
import subprocess
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

PROBE_TIMEOUT = 10.0  # seconds for one host to answer the probe (Horovod's ssh check waits 10 s too)
DISCOVERY_TIMEOUT = 60.0  # seconds for the discovery script
# Open MPI's names for the agent (plm_rsh_agent; orte_/pls_ are its deprecated synonyms) and its arguments
AGENT_KEYS = ("plm_rsh_agent", "orte_rsh_agent", "pls_rsh_agent")
AGENT_ARGS_KEY = "plm_rsh_args"
DEFAULT_AGENT = "ssh : rsh"  # Open MPI's default: the first of these found on PATH
# A host name as -H and a hostfile take it; never one that starts with "-" (ssh would read an option)
HOST_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")


class ElasticError(ValueError):
    """Bad elastic input (a flag, a hostfile, a discovery script): the message names it and the fix."""


@dataclass(frozen=True)
class Host:
    name: str
    slots: int = 1


def _host(name: str, slots: str | int, where: str) -> Host:
    if not HOST_RE.match(name):
        raise ElasticError(f"{where}: {name!r} is not a host name (letters, digits, '.', '-', '_')")
    try:
        n = int(slots)
    except ValueError:
        n = 0
    if n < 1:
        raise ElasticError(f"{where}: host {name}: slots must be a positive integer (got {slots!r})")
    return Host(name, n)


def _merge(hosts: list[Host]) -> list[Host]:
    """One entry per host, in first-seen order, slots added (``-H a,a`` is ``a:2`` to Open MPI)."""
    slots: dict[str, int] = {}
    for h in hosts:
        slots[h.name] = slots.get(h.name, 0) + h.slots
    return [Host(name, n) for name, n in slots.items()]


def parse_host_list(text: str, where: str = "-H") -> list[Host]:
    """``node1:4,node2:4`` (``node1`` alone: 1 slot) as mpirun's ``-H`` reads it."""
    hosts = []
    for item in text.split(","):
        name, _, slots = item.strip().partition(":")
        hosts.append(_host(name, slots or 1, where))
    return _merge(hosts)


def read_hostfile(path: str) -> list[Host]:
    """An Open MPI hostfile: ``node1 slots=4`` lines (no ``slots=``: 1), ``#`` comments."""
    hosts = []
    with open(path) as fh:
        for n, line in enumerate(fh, 1):
            words = line.split("#", 1)[0].split()
            if not words:
                continue
            slots = next((w.split("=", 1)[1] for w in words[1:] if w.startswith(("slots=", "slot="))), 1)
            hosts.append(_host(words[0], slots, f"--hostfile {path} line {n}"))
    if not hosts:
        raise ElasticError(f"--hostfile {path}: no hosts in it")
    return _merge(hosts)


def host_arg(hosts: list[Host]) -> str:
    """The ``-H`` value for ``hosts``."""
    return ",".join(f"{h.name}:{h.slots}" for h in hosts)


def discover(script: str, env: dict[str, str] | None = None, timeout: float = DISCOVERY_TIMEOUT) -> list[Host]:
    """Run the user's discovery script (no shell, no arguments) and read its ``host:slots`` lines."""
    where = f"--host-discovery-script {script}"
    try:
        proc = subprocess.run(
            [script], capture_output=True, text=True, timeout=timeout, env=env, start_new_session=True
        )
    except subprocess.TimeoutExpired:
        raise ElasticError(f"{where}: did not finish within {timeout:g} s; make it print the hosts and exit") from None
    except OSError as e:
        raise ElasticError(
            f"{where}: cannot run it ({e.strerror}); give the path of an executable that prints "
            "one host:slots line per host"
        ) from None
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or [""])[-1]
        raise ElasticError(
            f"{where}: exited {proc.returncode}"
            + (f" ({last})" if last else "")
            + "; it must exit 0 after printing one host:slots line per host"
        )
    hosts = []
    for n, line in enumerate(proc.stdout.splitlines(), 1):
        if line.strip():
            name, _, slots = line.strip().partition(":")
            hosts.append(_host(name, slots or 1, f"{where} line {n}"))
    names = [h.name for h in hosts]
    twice = next((n for n in names if names.count(n) > 1), None)
    if twice:
        raise ElasticError(f"{where}: names host {twice} twice; print each host once with its slots")
    return hosts


def rsh_agent(mca: list[tuple[str, str]], environ: dict[str, str]) -> tuple[list[str], list[str]]:
    """The agent mpirun starts its daemons with, as argument words, and ``plm_rsh_args``' words.

    As Open MPI reads them: the last ``-mca`` on the line, else ``$OMPI_MCA_<key>``; the value is a
    ``:``-separated list of alternatives, the first found on PATH is used. An agent found nowhere is
    returned as given (the probe then fails for every host, as mpirun would)."""

    def value(keys: tuple[str, ...]) -> str | None:
        given = [v for k, v in mca if k in keys]
        if given:
            return given[-1]
        return next((environ[f"OMPI_MCA_{k}"] for k in keys if f"OMPI_MCA_{k}" in environ), None)

    choices = [alt.split() for alt in (value(AGENT_KEYS) or DEFAULT_AGENT).split(":") if alt.split()]
    path = environ.get("PATH")
    agent = next((words for words in choices if shutil.which(words[0], path=path)), choices[0] if choices else ["ssh"])
    return agent, (value((AGENT_ARGS_KEY,)) or "").split()


def probe_command(agent: list[str], rsh_args: list[str], host: str, timeout: float) -> list[str]:
    """The command that asks ``host`` to run ``true`` through ``agent`` (ssh: never a prompt)."""
    cmd = [*agent]
    if os.path.basename(agent[0]) == "ssh":
        cmd += ["-o", "BatchMode=yes", "-o", f"ConnectTimeout={max(1, int(timeout))}"]
    return [*cmd, *rsh_args, host, "true"]


def _ask(cmd: list[str], env: dict[str, str] | None, timeout: float) -> str:
    """Run one probe; ``""`` when the host answered, else why not (one line)."""
    try:
        proc = subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            start_new_session=True,
        )
    except OSError as e:
        return f"{cmd[0]}: {e.strerror}"
    try:
        _, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # the agent and whatever it started (its own session)
        except ProcessLookupError:
            pass
        proc.communicate()
        return f"no answer within {timeout:g} s"
    if proc.returncode == 0:
        return ""
    last = (err.strip().splitlines() or [""])[-1].strip()
    return last or f"{os.path.basename(cmd[0])} exited {proc.returncode}"


def probe(
    hosts: list[str],
    command: Callable[[str], list[str]],
    env: dict[str, str] | None = None,
    timeout: float = PROBE_TIMEOUT,
) -> dict[str, str]:
    """Ask every host at once; host -> ``""`` if it answered within ``timeout`` s, else the reason."""
    answers: dict[str, str] = {}
    threads = [
        threading.Thread(target=lambda h=h: answers.__setitem__(h, _ask(command(h), env, timeout)), daemon=True)
        for h in hosts
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return {h: answers[h] for h in hosts}


@dataclass
class Elastic:
    """The elastic step of ``python -m launch --max-restarts N --min-np M``.

    ``hosts``: the user's hosts (-H, --hostfile or an emulated cluster's); ``script``: a discovery
    script instead. ``exec_prefix``: where mpirun runs (an emulated cluster's head), the probe runs there too.
    """

    np: int  # the ranks asked for (-np): never more
    min_np: int
    hosts: list[Host] = dataclasses.field(default_factory=list)
    script: str = ""
    oversubscribe: bool = False
    mca: list[tuple[str, str]] = dataclasses.field(default_factory=list)  # every -mca pair of the mpirun line
    exec_prefix: list[str] = dataclasses.field(default_factory=list)
    probe_timeout: float = PROBE_TIMEOUT
    current: list[Host] = dataclasses.field(default_factory=list)  # the hosts of the attempt that ran last

    def __post_init__(self) -> None:
        self.current = self.current or list(self.hosts)

    def ranks_on(self, hosts: list[Host]) -> int:
        slots = sum(h.slots for h in hosts)
        if self.oversubscribe:  # slots do not bound the ranks: keep the ranks per slot of the user's list
            total = sum(h.slots for h in self.hosts) or slots
            return min(self.np, self.np * slots // total) if self.hosts else self.np
        return min(self.np, slots)

    def find(self, env: dict[str, str]) -> tuple[list[Host], dict[str, str]]:
        """The hosts available now, and host -> why not for those of the list that are not."""
        if self.script:
            return discover(self.script, env), {}
        agent, rsh_args = rsh_agent(self.mca, env)
        answers = probe(
            [h.name for h in self.hosts],
            lambda host: [*self.exec_prefix, *probe_command(agent, rsh_args, host, self.probe_timeout)],
            env,
            self.probe_timeout,
        )
        return [h for h in self.hosts if not answers[h.name]], {h: r for h, r in answers.items() if r}

    def first(self, env: dict[str, str]) -> tuple[list[Host], int]:
        """The first attempt's hosts and ranks, from the discovery script."""
        hosts = self.current = discover(self.script, env)
        return hosts, self.ranks_on(hosts)

    def step(self, env: dict[str, str], world: int, say: Callable[[str], Any]) -> tuple[list[Host], int] | None:
        """Before a restart: the hosts and ranks to continue on; None (after one line) when fewer than
        --min-np ranks' worth of hosts are available. ElasticError: the discovery script failed."""
        hosts, lost = self.find(env)
        np = self.ranks_on(hosts)
        gone = [h.name for h in self.current if h.name not in {x.name for x in hosts}]
        why = "; ".join(f"{h}: {lost[h]}" for h in gone if h in lost)
        lost_text = f"host(s) {', '.join(gone)} lost" + (f" ({why})" if why else "") if gone else "hosts changed"
        if np < self.min_np or not hosts:
            say(
                f"launch: elastic: {lost_text}; {np} rank(s) fit on the hosts that answer "
                f"({host_arg(hosts) or 'none'}), fewer than --min-np {self.min_np}; not restarting"
            )
            return None
        if hosts != self.current or np != world:
            say(
                f"launch: elastic: {lost_text}; continuing on {len(hosts)} host(s) ({host_arg(hosts)}): world size "
                f"{world} -> {np} (the global batch is workers x --batch-size, and with --scale-lr the LR follows "
                "the workers: the trainer prints both)"
            )
        self.current = hosts
        return hosts, np
