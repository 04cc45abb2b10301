import dataclasses
import os
import re
import socket
import subprocess
import sys

import pytest

from launch import LaunchSpec, build_command
from launch.bound import read_exits, why
from launch.mpirun import EXIT_DIR_ENV, RING_RULES, pinned_name, resuming, usable_cores

from helpers import RANKS, ROOT, check, launch


def test_local_command():
    cmd = build_command(LaunchSpec(np=2, trainer_args=["--epochs", "1"]), environ={"PATH": "/bin"}, is_root=False)
    # in the line itself, so that a copied line cannot hang on hwloc's X probe (launch.mpirun.no_gl_probe)
    assert cmd[:5] == ["env", "HWLOC_COMPONENTS=-gl", "mpirun", "-np", "2"]
    assert "--allow-run-as-root" not in cmd and "--oversubscribe" not in cmd
    i = cmd.index("-bind-to")
    assert cmd[i : i + 4] == ["-bind-to", "none", "-map-by", "slot"]
    assert cmd[cmd.index("pml") - 1 : cmd.index("pml") + 2] == ["-mca", "pml", "ob1"]
    assert cmd[cmd.index("btl") + 1] == "^openib"
    assert cmd[-5:] == ["-m", "allreduce_train", "train", "--epochs", "1"]
    assert "-H" not in cmd and "--hostfile" not in cmd


def test_root_hosts_and_forwarded_env():
    env = {"PATH": "/bin", "HOROVOD_FUSION_THRESHOLD": "1", "NCCL_DEBUG": "INFO", "UNRELATED": "x"}
    cmd = build_command(LaunchSpec(np=8, hosts="a:4,b:4", oversubscribe=True), environ=env, is_root=True)
    assert "--allow-run-as-root" in cmd and "--oversubscribe" in cmd
    assert cmd[cmd.index("-H") + 1] == "a:4,b:4"
    exported = [cmd[i + 1] for i, c in enumerate(cmd) if c == "-x"]
    assert exported == ["PATH", "HWLOC_COMPONENTS", "HOROVOD_FUSION_THRESHOLD", "NCCL_DEBUG"]


def test_a_users_hwloc_components_are_kept():
    env = {"PATH": "/bin", "HWLOC_COMPONENTS": "-gl,-opencl"}
    cmd = build_command(LaunchSpec(np=2), environ=env, is_root=False)
    assert cmd[0] == "mpirun" and "HWLOC_COMPONENTS=-gl" not in cmd
    assert "HWLOC_COMPONENTS" in [cmd[i + 1] for i, c in enumerate(cmd) if c == "-x"]


def test_hostfile_and_mca():
    cmd = build_command(
        LaunchSpec(np=4, hostfile="hosts.txt", mca=[("btl_tcp_if_include", "eth0")]), environ={}, is_root=False
    )
    assert cmd[cmd.index("--hostfile") + 1] == "hosts.txt"
    assert cmd[cmd.index("btl_tcp_if_include") - 1 : cmd.index("btl_tcp_if_include") + 2] == [
        "-mca",
        "btl_tcp_if_include",
        "eth0",
    ]


def test_cli_prints_exact_line_and_rejects_bad_input(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "HWLOC_COMPONENTS"}
    ok = subprocess.run(
        [sys.executable, "-m", "launch", "-np", "3", "--dry-run", "--", "--lr", "0.1; rm -rf /"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=env,
    )
    assert ok.returncode == 0
    line = ok.stdout.strip().splitlines()[-1]
    assert (
        line.startswith("+ env HWLOC_COMPONENTS=-gl mpirun") and "'0.1; rm -rf /'" in line
    )  # quoted, never run by a shell
    bad = subprocess.run(
        [sys.executable, "-m", "launch", "-np", "2", "--hostfile", str(tmp_path / "none"), "--"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert bad.returncode == 2 and "hostfile" in bad.stderr and len(bad.stderr.strip().splitlines()) == 1


def test_restart_arguments_and_reasons():
    assert resuming(["--lr", "1", "--resume", "ckpt.pt", "--steps", "9"]) == [
        "--lr",
        "1",
        "--steps",
        "9",
        "--resume",
        "auto",
    ]
    assert resuming(["--resume=x"]) == ["--resume", "auto"]
    assert pinned_name(["--name", "a"]) == ["--name", "a"]
    named = pinned_name(["--lr", "1"])
    assert named[:2] == ["--lr", "1"] and named[2] == "--name" and named[3].startswith("run-")
    assert why(137) == "a rank was killed by SIGKILL" and why(69) == "stalled" and why(75) == "a rank was preempted"


@pytest.mark.mpi
def test_more_ranks_than_cores_on_one_host_run_oversubscribed_with_a_one_line_note():
    """`make train NP=4` on 2 cores: Open MPI alone refuses with a page about slots; horovodrun and
    torchrun users expect the ranks to start. A rank program that needs no trainer shows mpirun took it."""
    n = usable_cores() + 1
    proc = check(launch(n, ["report"], module="netns_rank", env={"PYTHONPATH": str(RANKS)}, timeout=120))
    note = [ln for ln in proc.stderr.splitlines() if ln.startswith("launch:")]
    assert note == [f"launch: {n} ranks on {n - 1} core(s): adding --oversubscribe (the ranks share the cores)"], (
        proc.stderr
    )
    assert "--oversubscribe" in next(ln for ln in proc.stdout.splitlines() if ln.startswith("+ "))
    # not anchored at a line's start: under load two ranks' lines were seen joined in mpirun's output
    assert sorted(int(m) for m in re.findall(r"rank (\d+) pid", proc.stdout)) == list(range(n)), proc.stdout
    given = subprocess.run(
        [sys.executable, "-m", "launch", "-np", str(n), "-H", f"localhost:{n}", "--dry-run", "--"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert "--oversubscribe" not in given.stdout and given.stderr == ""  # slots the user gave are the user's


def test_a_ranks_exit_record_reaches_the_launcher(tmp_path, monkeypatch):
    """The trainer's record_exit and the launcher's read_exits agree on the place and the format (the
    variable's name comes from the one exit-code table, launch/exitcodes.py)."""
    from allreduce_train import errors

    assert errors.EXIT_DIR_ENV == EXIT_DIR_ENV
    monkeypatch.setenv(EXIT_DIR_ENV, str(tmp_path))
    errors.record_exit(3, 69)
    errors.record_exit(0, 0)
    exits = read_exits(str(tmp_path))
    assert {rank: code for rank, (code, _, _) in exits.items()} == {3: 69, 0: 0}
    assert exits[3][1] == socket.gethostname() and sorted(os.listdir(tmp_path)) == ["0", "3"]  # no temporary left
    monkeypatch.setenv(EXIT_DIR_ENV, str(tmp_path / "absent"))  # a host that does not see the directory
    errors.record_exit(1, 1)
    assert not (tmp_path / "absent").exists()


def test_the_trainer_and_every_launcher_read_one_exit_code_table():
    from allreduce_train import errors
    from launch import exitcodes, k8s, mpirun, slurm

    assert (errors.EXIT_PREEMPTED, errors.EXIT_STALLED, errors.EXIT_DIVERGED) == (75, 69, 65)
    assert errors.EXIT_PREEMPTED is exitcodes.EXIT_PREEMPTED and slurm.EXIT_PREEMPTED is exitcodes.EXIT_PREEMPTED
    assert k8s.NO_RETRY is exitcodes.NO_RETRY and mpirun.EXIT_DIR_ENV is exitcodes.EXIT_DIR_ENV
    # what a restart cannot help ends --max-restarts too; what it can is restarted and said in words
    assert set(exitcodes.NO_RETRY) <= mpirun.NOT_RESTARTED
    for code in (errors.EXIT_ERROR, errors.EXIT_STALLED, errors.EXIT_PREEMPTED):
        assert code not in mpirun.NOT_RESTARTED and why(code) != "mpirun failed"


SPECS = {"launch": ("mpirun", "LaunchSpec"), "slurm": ("slurm", "SlurmJob"), "k8s": ("k8s", "K8sSpec")}
# the fields code sets: the interpreter, mpirun, the emulated hosts, the checkout the ranks run from
NOT_FLAGS = {"launch": {"python", "mpirun", "cluster", "app_dir"}, "slurm": {"python"}, "k8s": set()}


def spec_and_parser(launcher):
    import importlib

    module_name, cls_name = SPECS[launcher]
    module = importlib.import_module(f"launch.{module_name}")
    return module, getattr(module, cls_name)


@pytest.mark.parametrize("launcher", list(SPECS))
def test_a_launchers_flags_default_to_its_specs_fields(launcher):
    """An option is written once, as a field of the launcher's spec: its flag's default is the field's
    (SlurmJob.nodes once defaulted to 1 while --nodes said 2), and the spec built from no flags is the
    spec's own default; every field but those code sets is a flag."""
    from launch import k8s, specflags

    module, cls = spec_and_parser(launcher)
    args = module.make_parser().parse_args([])
    built = k8s.spec_from_args(args) if launcher == "k8s" else specflags.spec_from_args(cls, args)
    assert built == cls()  # every field's flag default is the field's (slots_per_worker: --gpus's, 1 without)
    flags = {f.name for f in specflags.flag_fields(cls)}
    assert {f.name for f in dataclasses.fields(cls)} - flags == NOT_FLAGS[launcher]
    if launcher == "slurm":
        assert args.nodes == 2  # what --nodes documents and the Makefile's NODES ?= 2 passes


def test_python_m_launch_parses_every_flag_into_its_spec_field():
    """The parser is generated from LaunchSpec: each flag, under each of its names, lands in its field."""
    from launch import specflags
    from launch.mpirun import LaunchSpec, make_parser

    argv = [
        *("-np", "4", "-H", "a:2,b:2", "--oversubscribe", "--mca", "btl", "tcp,self", "--mca", "x", "y"),
        *("--mpi-allreduce", "auto", "--timeout", "9", "--command", "evaluate", "--module", "m"),
        *("--max-restarts", "2", "--min-np", "1", "--probe-timeout", "3", "--grace-period", "4", "--", "--lr", "1"),
    ]
    spec = specflags.spec_from_args(LaunchSpec, make_parser().parse_args(argv))
    assert spec == LaunchSpec(
        np=4,
        hosts="a:2,b:2",
        oversubscribe=True,
        mca=[("btl", "tcp,self"), ("x", "y")],
        mpi_allreduce="auto",
        timeout=9,
        command="evaluate",
        module="m",
        max_restarts=2,
        min_np=1,
        probe_timeout=3,
        grace_period=4,
        trainer_args=["--lr", "1"],
    )
    long = make_parser().parse_args(["--np", "3", "--hosts", "h:3", "--hostfile", "f", "--script", "s.py"])
    assert (long.np, long.hosts, long.hostfile, long.script) == (3, "h:3", "f", "s.py")
    # the elastic flags keep their own section of the help
    assert "elastic restarts (docs/faults.md):\n  --min-np M" in make_parser().format_help()


@pytest.mark.parametrize("launcher", list(SPECS))
def test_every_launcher_declares_mca_and_the_trainers_arguments_alike(launcher):
    from launch import k8s, specflags
    from launch.mpirun import MCA_HELP

    module, cls = spec_and_parser(launcher)
    parser = module.make_parser()
    (action,) = [a for a in parser._actions if "--mca" in a.option_strings]
    assert (action.nargs, action.metavar, action.default, action.help) == (2, ("KEY", "VALUE"), [], MCA_HELP)
    (rest,) = [a for a in parser._actions if a.dest == "trainer_args"]
    assert (rest.option_strings, rest.help) == ([], "arguments for the trainer, after --")
    args = parser.parse_args(["--mca", "btl", "tcp,self", "--mca", "btl_tcp_if_include", "eth0", "--", "--lr", "1"])
    spec = k8s.spec_from_args(args) if launcher == "k8s" else specflags.spec_from_args(cls, args)
    assert spec.mca == [("btl", "tcp,self"), ("btl_tcp_if_include", "eth0")] and spec.trainer_args == ["--lr", "1"]


def test_the_emulation_flags_that_moved_to_the_lab_say_where_in_one_line():
    for flag in ("--emulate-hosts", "--link-rate"):
        bad = subprocess.run(
            [sys.executable, "-m", "launch", "-np", "2", flag, "1", "--dry-run", "--"],
            cwd=ROOT,
            capture_output=True,
            text=True,
        )
        assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1, bad.stderr
        assert flag in bad.stderr and "python -m lab.emulation" in bad.stderr


def test_min_np_needs_restarts():
    bad = subprocess.run(
        [sys.executable, "-m", "lab.emulation", "-np", "2", "--emulate-hosts", "2", "--min-np", "1", "--dry-run", "--"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert bad.returncode == 2 and "--min-np" in bad.stderr and "--max-restarts" in bad.stderr


def test_multi_host_jobs_load_the_ring_rules_unless_the_user_chose_open_mpis_algorithm(tmp_path):
    def dry(*args):
        out = subprocess.run(
            [sys.executable, "-m", "launch", "-np", "4", *args, "--dry-run", "--", "--lr", "1"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert out.returncode == 0, out.stderr
        return out.stdout.strip().splitlines()[-1].split()

    rules = ["-mca", "coll_tuned_use_dynamic_rules", "1", "-mca", "coll_tuned_dynamic_rules_filename", str(RING_RULES)]

    def has(cmd, part):
        return any(cmd[i : i + len(part)] == part for i in range(len(cmd)))

    hostfile = tmp_path / "hosts"
    hostfile.write_text("a slots=2\nb slots=2\n")
    assert has(dry("-H", "a:2,b:2"), rules) and has(dry("--hostfile", str(hostfile)), rules)
    assert not has(dry(), rules)  # one host: Open MPI's own choice
    assert has(dry("--mpi-allreduce", "ring"), rules)
    assert not has(dry("-H", "a:2,b:2", "--mpi-allreduce", "auto"), rules)
    mine = dry("-H", "a:2,b:2", "--mca", "coll_tuned_allreduce_algorithm", "3")
    assert "coll_tuned_dynamic_rules_filename" not in mine and has(
        mine, ["-mca", "coll_tuned_allreduce_algorithm", "3"]
    )
    assert RING_RULES.is_file()


def test_the_ring_rules_file_is_what_open_mpis_reader_expects():
    """Open MPI 4.x's classic rules format, read the way its reader does (numbers; '#' to the end of a
    line): 1 collective, allreduce (id 2), comm sizes ascending, each with message sizes ascending from 0,
    4 numbers per rule, and nothing left over."""
    words = " ".join(line.split("#")[0] for line in RING_RULES.read_text().splitlines()).split()
    nums = iter(int(w) for w in words)
    assert next(nums) == 1 and next(nums) == 2
    comm_sizes, rules = [], {}
    for _ in range(next(nums)):
        size = next(nums)
        msgs = [[next(nums) for _ in range(4)] for _ in range(next(nums))]
        assert msgs[0][0] == 0 and [m[0] for m in msgs] == sorted(m[0] for m in msgs)
        comm_sizes.append(size)
        rules[size] = msgs
    assert next(nums, None) is None and comm_sizes == sorted(comm_sizes)
    assert rules[1] == [[0, 0, 0, 0]]  # 1-2 ranks: Open MPI's choice for every size
    assert [alg for _, alg, _, _ in rules[3]] == [0, 4]  # 3+ ranks: its choice, then the ring


def summation_order(np: int, *launcher: str) -> dict[str, str]:
    proc = check(
        launch(
            np,
            [],
            module="allreduce_order_rank",
            oversubscribe=True,
            launcher=list(launcher),
            env={"PYTHONPATH": f"{RANKS}:{ROOT}"},
            timeout=120,
        )
    )
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("allreduce_order "))
    return dict(word.split("=") for word in line.split()[1:])


@pytest.mark.mpi
@pytest.mark.parametrize("np", [2, 3, 4])
def test_open_mpi_reads_the_ring_rules_and_uses_the_ring_for_large_messages_on_3_ranks_or_more(np):
    """The bits of a float32 sum tell the order of the additions, so the algorithm (allreduce_order_rank).
    With the rules file a 4 MiB MPI_Allreduce adds like the forced ring on 3 and 4 ranks, where Open MPI's
    own choice adds otherwise; a 4 KiB one, and everything on 2 ranks, like Open MPI's own choice."""
    rules = summation_order(np, "--mpi-allreduce", "ring")
    auto = summation_order(np, "--mpi-allreduce", "auto")
    ring = summation_order(
        np, "--mca", "coll_tuned_use_dynamic_rules", "1", "--mca", "coll_tuned_allreduce_algorithm", "4"
    )
    if np == 2:
        assert rules == auto, (rules, auto)
        return
    assert auto["large"] != ring["large"] and rules["large"] == ring["large"], (rules, auto, ring)
    assert rules["small"] == auto["small"], (rules, auto)
    if np == 4:  # on 3 ranks Open MPI's choice for 4 KiB adds in the ring's order anyway
        assert auto["small"] != ring["small"], (auto, ring)


def test_a_users_mca_key_replaces_the_launchers_default_instead_of_listing_it_twice():
    # Open MPI refuses a parameter given twice ("MCA parameters can only be listed once")
    cmd = build_command(
        LaunchSpec(np=2, hosts="a:1,b:1", mca=[("btl", "tcp,self"), ("pml", "ucx")]), environ={}, is_root=False
    )
    pairs = [(cmd[i + 1], cmd[i + 2]) for i in range(len(cmd) - 2) if cmd[i] == "-mca"]
    assert [p for p in pairs if p[0] in ("btl", "pml")] == [("btl", "tcp,self"), ("pml", "ucx")]


def test_launch_modules_import_only_each_others_public_names():
    """A module of launch/ that another one uses is its interface (k8s/mpijob.py and trainjob.py once
    imported eight underscore helpers from pods.py): no ``from .x import _name`` anywhere in launch/."""
    import ast

    private = []
    for path in sorted((ROOT / "launch").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level:
                private += [f"{path.relative_to(ROOT)}: {a.name}" for a in node.names if a.name.startswith("_")]
    assert private == []
