"""The launcher's elastic step without MPI (launch/elastic.py): the host lists, the agent mpirun would use,
the bounded ssh probe (a stand-in agent, and the real ssh client on loopback), the discovery script, and
``python -m launch --max-restarts --min-np`` around a stand-in mpirun that fails its first attempt."""

import os
import shlex
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from launch import elastic
from launch.elastic import ElasticError, Host

ROOT = Path(__file__).resolve().parents[2]  # launch/ is standard library only: so is this test


def executable(path, text: str):
    path.write_text(text)
    path.chmod(0o755)
    return path


# ------------------------------------------------------------------ host lists


def test_host_lists_read_as_open_mpi_reads_them(tmp_path):
    assert elastic.parse_host_list("n1:4,n2:2,n1") == [Host("n1", 5), Host("n2", 2)]
    hostfile = tmp_path / "hosts"
    hostfile.write_text("# the rack\nn1 slots=4 max_slots=8\n\nn2   # one slot\n10.0.0.3 slots=2\n")
    assert elastic.read_hostfile(str(hostfile)) == [Host("n1", 4), Host("n2", 1), Host("10.0.0.3", 2)]
    assert elastic.host_arg(elastic.read_hostfile(str(hostfile))) == "n1:4,n2:1,10.0.0.3:2"


@pytest.mark.parametrize("bad", ["-oProxyCommand=touch /tmp/x:1", "n1:0", "n1:two", "a b:1", ""])
def test_a_host_that_is_not_a_name_or_slots_that_are_not_a_count_are_refused(bad):
    with pytest.raises(ElasticError, match="-H"):
        elastic.parse_host_list(bad)


# ------------------------------------------------------------------ the agent and the probe


def test_the_probe_uses_the_agent_mpirun_would_use():
    env = {"PATH": os.environ["PATH"]}
    assert elastic.rsh_agent([], env) == (["ssh"], [])  # Open MPI's "ssh : rsh", ssh found first
    env["OMPI_MCA_plm_rsh_agent"] = "/opt/bin/myssh -q"
    env["OMPI_MCA_plm_rsh_args"] = "-p 2222"
    assert elastic.rsh_agent([], env) == (["/opt/bin/myssh", "-q"], ["-p", "2222"])
    # the command line's -mca wins over the environment, the last one over earlier ones
    mca = [("plm_rsh_agent", "rsh"), ("btl", "tcp,self"), ("plm_rsh_agent", "nosuchagent : ssh -x")]
    assert elastic.rsh_agent(mca, env)[0] == ["ssh", "-x"]


def test_ssh_probes_in_batch_mode_with_a_connect_timeout_and_other_agents_as_given():
    assert elastic.probe_command(["/usr/bin/ssh", "-x"], ["-p", "22"], "n1", 7.5) == [
        "/usr/bin/ssh",
        "-x",
        "-o",
        "BatchMode=yes",
        "-o",
        "ConnectTimeout=7",
        "-p",
        "22",
        "n1",
        "true",
    ]
    assert elastic.probe_command(["/x/rsh_netns.sh"], [], "h2", 10) == ["/x/rsh_netns.sh", "h2", "true"]


def test_the_probe_asks_every_host_at_once_and_gives_up_on_one_that_hangs(tmp_path):
    pids = tmp_path / "pids"
    agent = executable(
        tmp_path / "agent",
        f"""#!/bin/sh
echo $$ >> {pids}
case $1 in
    up) exec "$2" ;;
    refused) echo "ssh: connect to host $1 port 22: Connection refused" >&2; exit 255 ;;
    hangs) exec sleep 600 ;;
esac
""",
    )
    answers = elastic.probe(
        ["up", "refused", "hangs"], lambda h: elastic.probe_command([str(agent)], [], h, 1), timeout=1
    )
    assert answers == {
        "up": "",
        "refused": "ssh: connect to host refused port 22: Connection refused",
        "hangs": "no answer within 1 s",
    }
    left = [p for p in pids.read_text().split() if os.path.exists(f"/proc/{p}")]
    assert left == [], "the agent that did not answer is still running"


def test_the_real_ssh_client_probes_in_batch_mode_a_port_that_refuses():
    with socket.socket() as s:  # a loopback port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = elastic.probe_command(["ssh"], ["-p", str(port)], "127.0.0.1", 5)
    reason = elastic.probe(["127.0.0.1"], lambda h: cmd, timeout=20)["127.0.0.1"]
    assert "Connection refused" in reason, reason


def test_the_real_ssh_client_gives_up_on_a_host_that_accepts_and_never_answers():
    listener = socket.create_server(("127.0.0.1", 0))
    held = []
    threading.Thread(target=lambda: held.append(listener.accept()), daemon=True).start()
    try:
        port = listener.getsockname()[1]
        cmd = elastic.probe_command(["ssh"], ["-p", str(port)], "127.0.0.1", 1)
        reason = elastic.probe(["127.0.0.1"], lambda h: cmd, timeout=3)["127.0.0.1"]
    finally:
        listener.close()
    assert reason, "a host that never speaks ssh answered the probe"


def test_the_ranks_are_those_that_fit_on_the_hosts_found_never_more_than_np():
    hosts = [Host("a", 2), Host("b", 2), Host("c", 4)]
    fixed = elastic.Elastic(np=6, min_np=2, hosts=hosts)
    assert (fixed.ranks_on(hosts), fixed.ranks_on(hosts[:2]), fixed.ranks_on(hosts[2:])) == (6, 4, 4)
    # --oversubscribe: slots do not bound the ranks, the same ranks per slot as on the user's list do
    over = elastic.Elastic(np=16, min_np=2, hosts=hosts, oversubscribe=True)
    assert (over.ranks_on(hosts), over.ranks_on(hosts[:2]), over.ranks_on(hosts[2:])) == (16, 8, 8)


# ------------------------------------------------------------------ the discovery script


def test_the_discovery_script_gives_host_slots_lines(tmp_path):
    script = executable(tmp_path / "hosts.sh", "#!/bin/sh\necho n1:2\necho\necho n2\n")
    assert elastic.discover(str(script)) == [Host("n1", 2), Host("n2", 1)]


@pytest.mark.parametrize(
    "body, said",
    [
        ("#!/bin/sh\necho 'no inventory' >&2\nexit 3\n", "exited 3 (no inventory)"),
        ("#!/bin/sh\necho n1:x\n", "line 1"),
        ("#!/bin/sh\necho n1:1\necho n1:2\n", "names host n1 twice"),
        (None, "cannot run it"),
    ],
)
def test_a_bad_discovery_script_is_one_line_and_exit_2(tmp_path, body, said):
    script = tmp_path / "hosts.sh"
    if body is None:
        script.write_text("#!/bin/sh\necho n1:1\n")  # not executable
    else:
        executable(script, body)
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "launch",
            "-np",
            "2",
            "--host-discovery-script",
            str(script),
            "--max-restarts",
            "1",
            "--dry-run",
            "--",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert "--host-discovery-script" in out.stderr and said in out.stderr, out.stderr


def test_the_discovery_script_names_the_first_attempts_hosts(tmp_path):
    script = executable(tmp_path / "hosts.sh", "#!/bin/sh\necho n1:2\necho n2:2\n")
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "launch",
            "-np",
            "3",
            "--host-discovery-script",
            str(script),
            "--max-restarts",
            "1",
            "--dry-run",
            "--",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    line = out.stdout.strip().splitlines()[-1].split()
    assert line[line.index("-np") + 1] == "3" and line[line.index("-H") + 1] == "n1:2,n2:2"


@pytest.mark.parametrize(
    "flags, said",
    [
        (["--min-np", "1"], "--max-restarts"),
        (["--min-np", "3", "--max-restarts", "1", "-H", "a:2"], "--min-np"),
        (["--min-np", "1", "--max-restarts", "1"], "-H, --hostfile or --host-discovery-script"),
        (["--host-discovery-script", "/bin/true", "-H", "a:2"], "leave out -H"),
        (["--probe-timeout", "0"], "--probe-timeout"),
    ],
)
def test_elastic_flags_that_do_not_go_together_are_one_line(flags, said):
    out = subprocess.run(
        [sys.executable, "-m", "launch", "-np", "2", *flags, "--dry-run", "--"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1 and said in out.stderr, out.stderr


# ------------------------------------------------------------------ the launcher's restarts, with a stand-in mpirun


@pytest.fixture
def stand_ins(tmp_path):
    """A PATH with an mpirun that records its arguments and fails its first call (exit 69, as after a
    stall), and an agent for which hosts named up* answer and every other refuses."""
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    executable(
        bin_ / "mpirun",
        f"""#!/bin/sh
n=$(ls {tmp_path} | grep -c '^call') ; echo "$@" > {tmp_path}/call$n
[ "$n" -gt 0 ]  || exit 69
""",
    )
    agent = executable(
        bin_ / "agent",
        "#!/bin/sh\ncase $1 in up*) exit 0 ;; esac\n"
        'echo "ssh: connect to host $1 port 22: No route to host" >&2; exit 255\n',
    )
    env = {**os.environ, "PATH": f"{bin_}:{os.environ['PATH']}", "OMPI_MCA_plm_rsh_agent": str(agent)}
    return tmp_path, env


def calls(tmp_path) -> list[list[str]]:
    return [(tmp_path / f"call{i}").read_text().split() for i in range(len(list(tmp_path.glob("call*"))))]


def test_a_restart_continues_on_the_hosts_that_answer_with_the_ranks_that_fit(stand_ins):
    tmp_path, env = stand_ins
    hostfile = tmp_path / "hosts"
    hostfile.write_text("up1 slots=2\ndown2 slots=2\nup3 slots=1\n")
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "launch",
            "-np",
            "4",
            "--hostfile",
            str(hostfile),
            "--max-restarts",
            "2",
            "--min-np",
            "2",
            "--",
            "--name",
            "el",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert out.returncode == 0, out.stderr
    first, second = calls(tmp_path)
    assert first[first.index("--hostfile") + 1] == str(hostfile) and "--resume" not in first
    assert second[second.index("-np") + 1] == "3" and second[second.index("-H") + 1] == "up1:2,up3:1"
    assert "--hostfile" not in second and second[-2:] == ["--resume", "auto"]
    assert (
        "launch: elastic: host(s) down2 lost (down2: ssh: connect to host down2 port 22: No route to host); "
        "continuing on 2 host(s) (up1:2,up3:1): world size 4 -> 3"
    ) in out.stderr, out.stderr
    printed = [shlex.split(ln[2:]) for ln in out.stdout.splitlines() if ln.startswith("+ ")]
    assert [p[p.index("mpirun") + 1 :] for p in printed] == [first, second]  # each attempt's exact line


def test_fewer_than_min_np_ranks_worth_of_hosts_ends_the_job_with_one_line_and_exit_69(stand_ins):
    tmp_path, env = stand_ins
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "launch",
            "-np",
            "4",
            "-H",
            "up1:1,down2:2,down3:1",
            "--max-restarts",
            "2",
            "--min-np",
            "2",
            "--",
            "--name",
            "el",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert out.returncode == 69 and len(calls(tmp_path)) == 1, out.stderr
    said = [ln for ln in out.stderr.splitlines() if "elastic" in ln]
    assert len(said) == 1 and "1 rank(s) fit on the hosts that answer (up1:1), fewer than --min-np 2" in said[0]


def test_the_discovery_script_is_asked_again_before_a_restart(stand_ins):
    tmp_path, env = stand_ins
    script = executable(
        tmp_path / "hosts.sh", f"#!/bin/sh\n[ -e {tmp_path}/call0 ] && echo n3:2 || echo n1:2\necho n2:2\n"
    )
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "launch",
            "-np",
            "4",
            "--host-discovery-script",
            str(script),
            "--max-restarts",
            "1",
            "--",
            "--name",
            "el",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert out.returncode == 0, out.stderr
    first, second = calls(tmp_path)
    assert first[first.index("-H") + 1] == "n1:2,n2:2" and second[second.index("-H") + 1] == "n3:2,n2:2"
    assert "host(s) n1 lost; continuing on 2 host(s) (n3:2,n2:2): world size 4 -> 4" in out.stderr, out.stderr


def test_without_min_np_a_restart_goes_to_the_same_hosts_unprobed(stand_ins):
    tmp_path, env = stand_ins
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "launch",
            "-np",
            "2",
            "-H",
            "down1:1,down2:1",
            "--max-restarts",
            "1",
            "--",
            "--name",
            "el",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert out.returncode == 0 and "elastic" not in out.stderr, out.stderr
    first, second = calls(tmp_path)
    assert first[first.index("-H") + 1] == second[second.index("-H") + 1] == "down1:1,down2:1"
