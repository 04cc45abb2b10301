"""Everything the launchers print, case by case, to compare two checkouts byte for byte.

    python tools/launch_outputs.py OUT                 # this checkout's outputs into OUT/
    python tools/launch_outputs.py OUT --tree DIR      # another checkout's (e.g. `git worktree add DIR main`)
    diff -r BEFORE AFTER                               # a refactoring of launch/ changes nothing a user sees

Each case runs ``python -m launch ...`` (mpirun's dry-run lines, Slurm scripts, Kubernetes manifests,
every --help and the refusals) or the lab's front ends over the launcher, in a scratch directory with
the same environment and the same fixtures (a hostfile, a script, a host discovery script), and
writes its exit code, stdout and stderr to OUT/<case>.txt; the checkout's path reads ``<tree>``, the
emulated hosts' namespace names ``art-<pid>-``, a run named by the time ``run-<time>``.
Nothing is submitted or started: every case is a dry run, a render, a help text or a refusal.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile

LAUNCH = ["-m", "launch"]
CASES: dict[str, list[str]] = {
    # python -m launch: the mpirun line
    "launch-help": ["--help"],
    "launch-np2": ["-np", "2", "--dry-run", "--", "--model", "lenet5"],
    "launch-hosts": ["-np", "4", "-H", "a:2,b:2", "--dry-run", "--", "--model", "lenet5"],
    "launch-hostfile": ["-np", "4", "--hostfile", "hosts.txt", "--dry-run"],
    "launch-mca": ["-np", "2", "-H", "a:1,b:1", "--mca", "btl", "tcp,self", "--mca", "btl_if", "eth0", "--dry-run"],
    "launch-allreduce-auto": ["-np", "2", "-H", "a:1,b:1", "--mpi-allreduce", "auto", "--dry-run"],
    "launch-allreduce-ring-one-host": ["-np", "2", "--mpi-allreduce", "ring", "--dry-run"],
    "launch-tuned-mca": ["-np", "2", "-H", "a:1,b:1", "--mca", "coll_tuned_use_dynamic_rules", "0", "--dry-run"],
    "launch-script": ["-np", "2", "--script", "train.py", "--dry-run", "--", "--epochs", "1"],
    "launch-module": ["-np", "2", "--module", "mymod", "--dry-run", "--", "x"],
    "launch-command": ["-np", "2", "--command", "evaluate", "--dry-run"],
    "launch-too-many-ranks": ["-np", "64", "--dry-run"],
    "launch-oversubscribe": ["-np", "2", "--oversubscribe", "--dry-run"],
    "launch-restarts": ["-np", "2", "--max-restarts", "2", "--dry-run", "--", "--name", "r"],
    "launch-min-np": [
        "-np",
        "2",
        "--max-restarts",
        "1",
        "--min-np",
        "1",
        "-H",
        "a:1,b:1",
        "--dry-run",
        "--",
        "--name",
        "r",
    ],
    "launch-long-names": ["--np", "3", "--hosts", "a:3", "--timeout", "10", "--grace-period", "5", "--dry-run"],
    "launch-discovery": ["-np", "2", "--host-discovery-script", "./discover.sh", "--dry-run"],
    "launch-refuse-np": ["-np", "0", "--dry-run"],
    "launch-refuse-hosts-and-hostfile": ["-H", "a:1", "--hostfile", "hosts.txt", "--dry-run"],
    "launch-refuse-timeout": ["--timeout", "-1", "--dry-run"],
    "launch-refuse-restarts": ["--max-restarts", "-1", "--dry-run"],
    "launch-refuse-grace": ["--grace-period", "0", "--dry-run"],
    "launch-refuse-script-and-module": ["--script", "train.py", "--module", "m", "--dry-run"],
    "launch-refuse-no-script": ["--script", "missing.py", "--dry-run"],
    "launch-refuse-min-np-above-np": ["-np", "2", "--min-np", "3", "--max-restarts", "1", "-H", "a:2", "--dry-run"],
    "launch-refuse-min-np-without-restarts": ["--min-np", "1", "-H", "a:1", "--dry-run"],
    "launch-refuse-probe-timeout": ["--probe-timeout", "0", "--dry-run"],
    "launch-refuse-discovery-and-hosts": ["--host-discovery-script", "./discover.sh", "-H", "a:1", "--dry-run"],
    "launch-refuse-min-np-without-hosts": ["--min-np", "1", "--max-restarts", "1", "--dry-run"],
    "launch-refuse-moved-flag": ["--emulate-hosts", "2", "--dry-run"],
    "launch-refuse-allreduce-choice": ["--mpi-allreduce", "fast"],
    "launch-refuse-no-hostfile": ["--hostfile", "missing.txt", "--dry-run"],
    "launch-refuse-np-type": ["-np", "x"],
    # python -m launch slurm: the sbatch script
    "slurm-help": ["slurm", "--help"],
    "slurm-default": ["slurm", "--dry-run"],
    "slurm-srun": ["slurm", "--nodes", "4", "--ntasks-per-node", "2", "--srun", "--dry-run", "--", "--model", "lenet5"],
    "slurm-mca": ["slurm", "--mca", "btl", "tcp,self", "--mca", "a", "b", "--dry-run"],
    "slurm-srun-mca": ["slurm", "--srun", "--mca", "btl", "tcp,self", "--dry-run"],
    "slurm-srun-auto": ["slurm", "--srun", "--mpi-allreduce", "auto", "--dry-run"],
    "slurm-auto": ["slurm", "--mpi-allreduce", "auto", "--dry-run"],
    "slurm-tuned-mca": ["slurm", "--mca", "coll_tuned_use_dynamic_rules", "0", "--dry-run"],
    "slurm-every-directive": [
        "slurm",
        "--time",
        "1:00:00",
        "--partition",
        "p",
        "--account",
        "a",
        "--cpus-per-task",
        "2",
        "--gpus-per-node",
        "1",
        "--grace",
        "60",
        "--job-name",
        "j",
        "--output",
        "o-%j.out",
        "--dry-run",
        "--",
        "--name",
        "foo",
    ],
    "slurm-refuse-nodes": ["slurm", "--nodes", "0", "--dry-run"],
    "slurm-refuse-time": ["slurm", "--time", "bad", "--dry-run"],
    "slurm-refuse-partition": ["slurm", "--partition", "a b", "--dry-run"],
    # python -m launch k8s: the manifests
    "k8s-help": ["k8s", "--help"],
    "k8s-default": ["k8s"],
    "k8s-mpijob": [
        "k8s",
        "--api",
        "mpijob",
        "--workers",
        "3",
        "--mca",
        "btl",
        "tcp,self",
        "--env",
        "NCCL_DEBUG=INFO",
        "--",
        "--model",
        "lenet5",
    ],
    "k8s-everything": [
        "k8s",
        "--gpus",
        "2",
        "--image",
        "r/x:gpu",
        "--node-selector",
        "a=b",
        "--toleration",
        "nvidia.com/gpu:NoSchedule",
        "--runs-pvc",
        "runs",
        "--runs-pvc-size",
        "10Gi",
        "--tensorboard",
        "--data-pvc",
        "data",
        "--mpi-allreduce",
        "auto",
    ],
    "k8s-mpijob-one-pod": [
        "k8s",
        "--api",
        "mpijob",
        "--workers",
        "1",
        "--slots-per-worker",
        "4",
        "--no-resume",
        "--namespace",
        "ns",
        "--image-pull-secret",
        "s",
        "--affinity",
        '{"podAntiAffinity": {}}',
    ],
    "k8s-refuse-one-worker": ["k8s", "--workers", "1"],
    "k8s-refuse-reserved-mca": ["k8s", "--mca", "orte_default_hostfile", "x"],
    "k8s-refuse-reserved-env": ["k8s", "--env", "OMPI_MCA_plm_rsh_args=x"],
}
# The lab's front ends over the launcher (python -m MODULE ...)
LAB_CASES: dict[str, list[str]] = {
    "emulation-help": ["-m", "lab.emulation", "--help"],
    "emulation-dry-run": ["-m", "lab.emulation", "-np", "2", "--emulate-hosts", "2", "--dry-run", "--", "--steps", "1"],
    "commbench-netns-help": ["-m", "lab", "commbench-netns", "--help"],
}


def fixtures(where: str) -> None:
    with open(os.path.join(where, "hosts.txt"), "w") as fh:
        fh.write("a slots=2\nb slots=2\n")
    with open(os.path.join(where, "train.py"), "w") as fh:
        fh.write("print('a user script')\n")
    with open(os.path.join(where, "discover.sh"), "w") as fh:
        fh.write("#!/bin/sh\necho a:1\necho b:1\n")
    os.chmod(os.path.join(where, "discover.sh"), 0o755)


def run_all(tree: str, out: str, lab: bool = True) -> int:
    """Every case's output under ``out``; how many cases ran."""
    tree = os.path.abspath(tree)
    os.makedirs(out, exist_ok=True)
    cases = {name: [*LAUNCH, *argv] for name, argv in CASES.items()}
    if lab:
        cases.update(LAB_CASES)
    with tempfile.TemporaryDirectory(prefix="launch-outputs-") as scratch:
        fixtures(scratch)
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": scratch,
            "PYTHONPATH": tree,
            "COLUMNS": "100",  # argparse wraps help at the terminal's width
            "LANG": "C.UTF-8",
        }
        for name, argv in cases.items():
            proc = subprocess.run(
                [sys.executable, *argv], cwd=scratch, env=env, capture_output=True, text=True, timeout=300
            )
            text = (
                f"$ python {' '.join(argv)}\nexit {proc.returncode}\n--- stdout\n{proc.stdout}--- stderr\n{proc.stderr}"
            )
            text = text.replace(tree, "<tree>").replace(scratch, "<scratch>")
            text = re.sub(r"\bart-\d+-", "art-<pid>-", text)  # the emulated hosts' namespaces carry the pid
            text = re.sub(r"\brun-\d{8}-\d{6}\b", "run-<time>", text)  # --max-restarts names the run by the time
            with open(os.path.join(out, f"{name}.txt"), "w") as fh:
                fh.write(text)
    return len(cases)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python tools/launch_outputs.py", description=__doc__.split("\n\n")[0])
    p.add_argument("out", help="directory for one file per case")
    p.add_argument("--tree", default=os.path.dirname(os.path.dirname(os.path.abspath(__file__))), help="checkout")
    p.add_argument("--no-lab", action="store_true", help="only python -m launch's cases (no torch import)")
    args = p.parse_args(argv)
    n = run_all(args.tree, args.out, lab=not args.no_lab)
    print(f"{n} cases written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
