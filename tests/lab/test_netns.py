"""The emulated multi-host cluster (lab/emulation/netns.py): hosts as network namespaces, rate-limited links.

Tests that build namespaces skip, with the reason, where that is not permitted (not root, no
CAP_NET_ADMIN, no iproute2); every one checks that nothing it created is left behind.
"""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import pytest
import torch

from lab.common import jobs
from lab.emulation import netns, probe
from lab.emulation.__main__ import run_emulated
from launch import LaunchSpec, build_command
from launch.mpirun import RING_RULES

from helpers import QUICK, RANKS, ROOT, check, load_params

TRAFFIC_RE = re.compile(r"(h\d+) (\d+)/(\d+)")


# -- pure: no namespaces needed --------------------------------------------------------------


def test_link_rates_parse_and_bad_ones_are_named():
    assert netns.parse_rate("1gbit") == 10**9
    assert netns.parse_rate("100Mbit") == 10**8
    assert netns.parse_rate("2.5mbit") == 2_500_000
    assert netns.parse_rate("none") == 0
    for bad in ("1gb", "fast", "-1mbit", "10kbit"):
        with pytest.raises(ValueError, match="--link-rate"):
            netns.parse_rate(bad)


def test_ranks_spread_evenly_over_hosts():
    spec = netns.ClusterSpec(hosts=4, prefix="art-1-0")
    assert spec.host_list(4) == "h1:1,h2:1,h3:1,h4:1"
    assert spec.host_list(5) == "h1:2,h2:1,h3:1,h4:1"  # e.g. 4 workers + 1 server
    assert spec.host_list(8) == "h1:2,h2:2,h3:2,h4:2"
    with pytest.raises(ValueError, match="--emulate-hosts"):
        spec.host_list(3)
    with pytest.raises(ValueError, match="--emulate-hosts"):
        netns.ClusterSpec(hosts=0)


def test_emulated_command_runs_mpirun_in_the_head_namespace_over_tcp():
    spec = netns.ClusterSpec(hosts=2, link_rate="100mbit", prefix="art-1-0")
    env = {"PATH": "/bin", "HOROVOD_GLOO_IFACE": "eth0", "HOROVOD_FUSION_THRESHOLD": "1"}
    cmd = build_command(LaunchSpec(np=2, cluster=spec, trainer_args=["--steps", "3"]), environ=env, is_root=True)
    assert cmd[:4] == ["ip", "netns", "exec", "art-1-0-head"]
    assert "ALLREDUCE_TRAIN_NETNS=art-1-0" in cmd and cmd[cmd.index("unshare") :][:2] == ["unshare", "--uts"]
    mpirun = cmd.index("mpirun")
    assert cmd[mpirun + 1] == "--allow-run-as-root" and cmd[cmd.index("-H") + 1] == "h1:1,h2:1"
    mca = {cmd[i + 1]: cmd[i + 2] for i in range(len(cmd) - 2) if cmd[i] == "-mca"}
    assert mca["btl"] == "tcp,self" and "^openib" not in cmd  # never shared memory between "hosts"
    assert mca["plm_rsh_agent"] == str(ROOT / "lab" / "emulation" / "rsh_netns.sh")
    assert mca["btl_tcp_if_include"] == mca["oob_tcp_if_include"] == "10.213.0.0/24"
    assert mca["btl_tcp_links"] == "4"  # one connection per pair halves two-way exchanges (docs/emulated_cluster.md)
    exported = [cmd[i + 1] for i, c in enumerate(cmd) if c == "-x"]
    assert "HOROVOD_GLOO_IFACE=emu0" in exported and "HOROVOD_GLOO_IFACE" not in exported
    assert "HOROVOD_FUSION_THRESHOLD" in exported
    assert cmd[-2:] == ["--steps", "3"]
    tbf = [c for c in spec.setup_commands() if c[0] == "tc"]
    assert {(c[2], c[6]) for c in tbf} == {
        ("art-1-0-h1", "emu0"),
        ("art-1-0-head", "h1"),
        ("art-1-0-h2", "emu0"),
        ("art-1-0-head", "h2"),
    }  # both directions
    assert all(c[c.index("rate") + 1] == "100000000bit" for c in tbf)
    # after an elastic restart the hosts that answered are named: the cluster is then only the transport
    cmd = build_command(LaunchSpec(np=1, hosts="h2:1", cluster=spec), environ={}, is_root=True)
    assert cmd[cmd.index("-H") + 1] == "h2:1" and cmd[:4] == ["ip", "netns", "exec", "art-1-0-head"]
    bad = subprocess.run(
        [sys.executable, "-m", "lab.emulation", "-np", "2", "--emulate-hosts", "2", "-H", "a:1,b:1", "--dry-run", "--"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode == 2 and "give either --emulate-hosts or -H/--hostfile" in bad.stderr, bad.stderr


def test_the_users_mca_overrides_the_emulations_own():
    spec = netns.ClusterSpec(hosts=2, link_rate="100mbit", prefix="art-1-0")
    cmd = build_command(
        LaunchSpec(np=2, cluster=spec, mca=[("btl_tcp_if_include", "10.213.0.0/16")]), environ={}, is_root=True
    )
    given = [cmd[i + 2] for i in range(len(cmd) - 2) if cmd[i] == "-mca" and cmd[i + 1] == "btl_tcp_if_include"]
    assert given == ["10.213.0.0/16"]  # once, the user's: Open MPI would otherwise see both
    launcher = jobs.emulated_launcher("100mbit", mca=[("btl_tcp_links", "4")])
    assert launcher(2, ["--steps", "1"])[-6:] == ["--mca", "btl_tcp_links", "4", "--", "--steps", "1"]


@pytest.mark.parametrize("choice", ["ring", "auto"])
def test_the_grids_emulated_launcher_passes_the_mpi_allreduce_choice_on_to_mpirun(choice):
    argv = jobs.emulated_launcher("1gbit", mpi_allreduce=choice)(3, ["--steps", "1"])
    argv[argv.index("--") : argv.index("--")] = ["--dry-run"]
    mpirun = check(subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=60)).stdout.splitlines()[-1]
    assert "mpirun" in mpirun
    assert (f"-mca coll_tuned_dynamic_rules_filename {RING_RULES}" in mpirun) == (choice == "ring"), mpirun
    with pytest.raises(ValueError, match="mpi_allreduce"):
        jobs.emulated_launcher("1gbit", mpi_allreduce="fast")


def test_dry_run_prints_every_setup_command_and_builds_nothing():
    before = netns.list_namespaces()
    proc = check(
        subprocess.run(
            [
                sys.executable,
                "-m",
                "lab.emulation",
                "-np",
                "2",
                "--emulate-hosts",
                "2",
                "--dry-run",
                "--",
                "--steps",
                "1",
            ],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
        )
    )
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("+ ip netns add art-") and any("tbf rate 1000000000bit" in ln for ln in lines)
    assert "mpirun" in lines[-1] and netns.list_namespaces() == before


def test_bad_emulation_input_is_one_line():
    for args, needle in (
        (["-np", "1", "--emulate-hosts", "2"], "-np 1"),
        (["-np", "2", "--emulate-hosts", "2", "--link-rate", "fast"], "--link-rate"),
        (["-np", "2", "--emulate-hosts", "2", "-H", "a:1,b:1"], "--emulate-hosts"),
    ):
        proc = subprocess.run(
            [sys.executable, "-m", "lab.emulation", *args, "--"], cwd=ROOT, capture_output=True, text=True, timeout=60
        )
        assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1 and needle in proc.stderr, args


# -- with namespaces -------------------------------------------------------------------------


def root_state() -> tuple[str, str]:
    """The root namespace's links and qdiscs: an emulated run must leave them as it found them."""
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True, timeout=30).stdout
    qdiscs = subprocess.run(["tc", "qdisc", "show"], capture_output=True, text=True, timeout=30).stdout
    strip = re.compile(r"\s+(?:link/\S+ \S+ brd \S+|state \S+|qlen \d+)")  # counters and states may change
    return strip.sub("", links), qdiscs


def gone(prefix: str) -> bool:
    return not any(n.startswith(prefix + "-") for n in netns.list_namespaces())


def launch_emulated(np: int, hosts: int, rate: str, args: list[str], timeout: float = 240):
    cmd = [
        sys.executable,
        "-m",
        "lab.emulation",
        "-np",
        str(np),
        "--emulate-hosts",
        str(hosts),
        "--link-rate",
        rate,
        "--",
        *args,
    ]
    return subprocess.run(
        cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout, env={**os.environ, "OMP_NUM_THREADS": "1"}
    )


@pytest.mark.mpi
def test_two_emulated_hosts_train_identically_over_the_links_and_leave_nothing(tmp_path, namespaces_permitted):
    before = root_state()
    steps = 10
    proc = check(
        launch_emulated(
            2,
            2,
            "1gbit",
            QUICK
            + [
                "--steps",
                str(steps),
                "--run-dir",
                str(tmp_path),
                "--name",
                "em",
                "--dump-params",
                str(tmp_path / "em-{rank}.pt"),
            ],
        )
    )
    found = re.search(r"emulated cluster (art-\d+-\d+):", proc.stdout)
    assert found is not None, proc.stdout
    prefix = found.group(1)
    r0, r1 = load_params(tmp_path / "em-0.pt"), load_params(tmp_path / "em-1.pt")
    for k in r0:
        assert torch.equal(r0[k], r1[k]), f"{k} differs between the emulated hosts"
    # Each allreduce of the gradients sends at least one model's worth of bytes per rank (2 ranks:
    # half in reduce-scatter, half in allgather); the kernel counted them on the veth links.
    model_bytes = sum(t.numel() * t.element_size() for t in r0.values())
    traffic = {
        h: (int(tx), int(rx))
        for h, tx, rx in TRAFFIC_RE.findall(
            next(ln for ln in proc.stdout.splitlines() if ln.startswith("link traffic"))
        )
    }
    assert set(traffic) == {"h1", "h2"}
    for host, (tx, rx) in traffic.items():
        assert tx >= steps * model_bytes and rx >= steps * model_bytes, (host, tx, rx, model_bytes)
    # Horovod's ranks talked once through mpi4py before hvd.init() (across hosts; docs/emulated_cluster.md)
    assert json.loads((tmp_path / "em" / "metrics.json").read_text())["horovod_connect_first"] is True
    assert gone(prefix)
    assert root_state() == before


def _run_stand_in(mode: str, capfd, timeout: float = 120) -> tuple[int, list[dict], str]:
    spec = netns.ClusterSpec(hosts=2, link_rate="100mbit")
    env = {**os.environ, "PYTHONPATH": str(RANKS)}
    cmd = build_command(LaunchSpec(np=2, module="netns_rank", trainer_args=[mode], cluster=spec), environ=env)
    rc = run_emulated(spec, cmd, env, timeout)
    out = capfd.readouterr().out
    ranks = [
        m.groupdict()
        for m in re.finditer(
            r"rank (?P<rank>\d+) pid (?P<pid>\d+) host (?P<host>\S+) local_size (?P<local>\d+) "
            r"netns net:\[(?P<ino>\d+)\]",
            out,
        )
    ]
    return rc, ranks, spec.prefix


@pytest.mark.mpi
def test_each_emulated_host_has_its_own_hostname_and_namespace(capfd, namespaces_permitted):
    rc, ranks, prefix = _run_stand_in("report", capfd)
    assert rc == 0 and len(ranks) == 2
    assert sorted(r["host"] for r in ranks) == ["h1", "h2"]  # Open MPI saw two hosts ...
    assert all(r["local"] == "1" for r in ranks)  # ... with one rank each, not two local ranks
    inodes = {int(r["ino"]) for r in ranks}
    assert len(inodes) == 2 and os.stat("/proc/self/ns/net").st_ino not in inodes
    assert gone(prefix) and netns._holders(inodes) == []  # the namespaces themselves are gone


@pytest.mark.mpi
def test_failing_rank_ends_the_job_and_the_cluster_is_removed(capfd, namespaces_permitted):
    t0 = time.monotonic()
    rc, ranks, prefix = _run_stand_in("fail", capfd)
    assert rc != 0 and len(ranks) == 2
    assert time.monotonic() - t0 < 100  # the waiting rank did not sit out its 600 s
    assert gone(prefix) and netns._holders({int(r["ino"]) for r in ranks}) == []


@pytest.mark.mpi
@pytest.mark.parametrize("how", ["ctrl-c", "sigterm", "timeout"])
def test_interrupted_or_overdue_run_removes_the_cluster(tmp_path, namespaces_permitted, how):
    # the signal cases must not race the timeout when a loaded machine starts the job slowly
    timeout = "20" if how == "timeout" else "90"
    cmd = [
        sys.executable,
        "-m",
        "lab.emulation",
        "-np",
        "2",
        "--emulate-hosts",
        "2",
        "--timeout",
        timeout,
        "--",
        *QUICK,
        "--steps",
        "100000",
        "--run-dir",
        str(tmp_path),
    ]
    # As from a terminal: a test suite started in the background (`make test &`, nohup) has SIGINT
    # ignored, and a child would inherit that and never see the Ctrl-C this test sends.
    proc = subprocess.Popen(
        cmd,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    prefix = f"art-{proc.pid}-0"
    try:
        inodes: set[int] = set()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and len(netns._holders(inodes)) < 4:  # orted + rank per host
            inodes = {ino for ino in map(netns._ns_inode, (f"{prefix}-h1", f"{prefix}-h2")) if ino}
            time.sleep(0.5)
        assert len(netns._holders(inodes)) >= 4, "the job never started on the emulated hosts"
        if how != "timeout":
            proc.send_signal(signal.SIGINT if how == "ctrl-c" else signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    # SIGTERM is a preemption: the ranks checkpoint and the job exits 75 (docs/faults.md)
    assert proc.returncode == {"ctrl-c": 130, "sigterm": 75, "timeout": 124}[how], err
    assert gone(prefix) and netns._holders(inodes) == []


def test_leftovers_block_a_new_run_until_cleanup(tmp_path, namespaces_permitted):
    dead = _dead_pid()
    name = f"art-{dead}-0-head"
    subprocess.run(["ip", "netns", "add", name], check=True, timeout=30)
    squatter = subprocess.Popen(["ip", "netns", "exec", name, "sleep", "600"])  # holds the namespace open
    try:
        proc = launch_emulated(2, 2, "1gbit", QUICK + ["--steps", "1", "--run-dir", str(tmp_path)], timeout=60)
        assert proc.returncode == 2 and name in proc.stderr and "lab.emulation.netns cleanup" in proc.stderr, (
            proc.stderr
        )
        assert len(proc.stderr.strip().splitlines()) == 1
        listed = check(
            subprocess.run(
                [sys.executable, "-m", "lab.emulation.netns", "list"],
                cwd=ROOT,
                capture_output=True,
                text=True,
                timeout=60,
            )
        ).stdout
        assert f"{name}\tleftover" in listed
        check(
            subprocess.run(
                [sys.executable, "-m", "lab.emulation.netns", "cleanup"],
                cwd=ROOT,
                capture_output=True,
                text=True,
                timeout=60,
            )
        )
        assert squatter.wait(timeout=30) != 0  # cleanup ended the process inside the leftover
        assert name not in netns.list_namespaces()
    finally:
        if squatter.poll() is None:
            squatter.kill()
            squatter.wait()
        if os.path.exists(f"/run/netns/{name}"):
            subprocess.run(["ip", "netns", "delete", name], timeout=30)


def _dead_pid() -> int:
    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid


def test_link_rate_holds(namespaces_permitted):
    spec = netns.ClusterSpec(hosts=2, link_rate="100mbit")
    with netns.EmulatedCluster(spec, log=lambda _: None) as cluster:
        assert sum("tbf" in q and "rate 100Mbit" in q for q in cluster.qdiscs()) == 4
        tx_before = cluster.link_bytes(2)[1]
        bps, received = probe.measure(cluster, src=2, dst=1, seconds=3)
        sent = cluster.link_bytes(2)[1] - tx_before
    # TCP payload is ~95 % of the wire rate at MTU 1500, well inside the 20 % asked for.
    assert 0.8 * 100e6 <= bps <= 1.2 * 100e6, f"{bps / 1e6:.1f} Mbit/s on a 100 Mbit/s link"
    assert sent >= received > 0  # the stream crossed the veth link (and headers came on top)
    assert gone(spec.prefix)


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None, reason="needs root to drop to nobody")
def test_without_privileges_the_message_is_clear():
    # nobody may not be able to read the checkout (a clone in /root, mode 0700): it runs a copy of the
    # launcher and the lab (standard library only on this path) from a directory of its own, with the
    # interpreter the venv links to
    where = tempfile.mkdtemp(prefix="launch-unprivileged-")
    try:
        for package in ("launch", "lab"):
            shutil.copytree(ROOT / package, os.path.join(where, package))
        os.chmod(where, 0o755)
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        proc = subprocess.run(
            [
                "setpriv",
                "--reuid",
                "65534",
                "--regid",
                "65534",
                "--clear-groups",
                os.path.realpath(sys.executable),
                "-m",
                "lab.emulation",
                "-np",
                "2",
                "--emulate-hosts",
                "2",
                "--",
                "--steps",
                "1",
            ],
            cwd=where,
            capture_output=True,
            text=True,
            timeout=60,
            env=env,
        )
    finally:
        shutil.rmtree(where)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "cannot create network namespaces here" in proc.stderr and "CAP_NET_ADMIN" in proc.stderr
