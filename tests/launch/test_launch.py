import os
import subprocess
import sys

from launch import LaunchSpec, build_command
from launch.mpirun import pinned_name, resuming, why

from helpers import ROOT


def test_local_command():
    cmd = build_command(LaunchSpec(np=2, trainer_args=["--epochs", "1"]), environ={"PATH": "/bin"}, is_root=False)
    # in the line itself, so that a copied line cannot hang on hwloc's X probe (launch.mpirun.no_gl_probe)
    assert cmd[:5] == ["env", "HWLOC_COMPONENTS=-gl", "mpirun", "-np", "2"]
    assert "--allow-run-as-root" not in cmd and "--oversubscribe" not in cmd
    i = cmd.index("-bind-to")
    assert cmd[i:i + 4] == ["-bind-to", "none", "-map-by", "slot"]
    assert ["-mca", "pml", "ob1"] == cmd[cmd.index("pml") - 1:cmd.index("pml") + 2]
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
    cmd = build_command(LaunchSpec(np=4, hostfile="hosts.txt", mca=[("btl_tcp_if_include", "eth0")]),
                        environ={}, is_root=False)
    assert cmd[cmd.index("--hostfile") + 1] == "hosts.txt"
    assert ["-mca", "btl_tcp_if_include", "eth0"] == cmd[cmd.index("btl_tcp_if_include") - 1:cmd.index("btl_tcp_if_include") + 2]


def test_cli_prints_exact_line_and_rejects_bad_input(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "HWLOC_COMPONENTS"}
    ok = subprocess.run([sys.executable, "-m", "launch", "-np", "3", "--dry-run", "--", "--lr", "0.1; rm -rf /"],
                        cwd=ROOT, capture_output=True, text=True, env=env)
    assert ok.returncode == 0
    line = ok.stdout.strip().splitlines()[-1]
    assert line.startswith("+ env HWLOC_COMPONENTS=-gl mpirun") and "'0.1; rm -rf /'" in line  # quoted, never run by a shell
    bad = subprocess.run([sys.executable, "-m", "launch", "-np", "2", "--hostfile", str(tmp_path / "none"), "--"],
                         cwd=ROOT, capture_output=True, text=True)
    assert bad.returncode == 2 and "hostfile" in bad.stderr and len(bad.stderr.strip().splitlines()) == 1


def test_restart_arguments_and_reasons():
    assert resuming(["--lr", "1", "--resume", "ckpt.pt", "--steps", "9"]) == ["--lr", "1", "--steps", "9", "--resume", "auto"]
    assert resuming(["--resume=x"]) == ["--resume", "auto"]
    assert pinned_name(["--name", "a"]) == ["--name", "a"]
    named = pinned_name(["--lr", "1"])
    assert named[:2] == ["--lr", "1"] and named[2] == "--name" and named[3].startswith("run-")
    assert why(137) == "a rank was killed by SIGKILL" and why(69) == "stalled" and why(75) == "a rank was preempted"


def test_min_np_needs_an_emulated_cluster_and_restarts():
    bad = subprocess.run([sys.executable, "-m", "launch", "-np", "2", "--min-np", "1", "--dry-run", "--"],
                         cwd=ROOT, capture_output=True, text=True)
    assert bad.returncode == 2 and "--min-np" in bad.stderr
