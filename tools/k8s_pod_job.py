"""The job tools/k8s_pod_check.sh plays, as the operator would set it up (launch.k8s's own model).

    python tools/k8s_pod_job.py WORK LAYOUT [trainer arguments]

writes into WORK: ``hostfile`` (launch.k8s.hostfile: the operator's DNS names in its order),
``hosts`` (each pod's /etc/hosts: every name of the hostfile with its pod's address, as the job's
headless Service answers them in the cluster's DNS, and the pods' short hostnames), ``pods`` (the
launcher's and the worker's hostnames), ``cmd`` (the launcher's mpirun line, one argument a line)
and ``launcher.env`` (launch.k8s.launcher_env plus what the operators set, but the hostfile's path).
LAYOUT mpijob: 1 worker x 2 slots; trainjob: 2 pods x 1 slot (the launcher is a node, listed last).
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from launch import k8s

LAUNCHER_IP, WORKER_IP = "10.250.0.1", "10.250.0.2"  # tools/k8s_pod_check.sh's veth pair


def main(argv: list[str]) -> None:
    work, layout, trainer = Path(argv[0]), argv[1], argv[2:]
    pods, slots = (2, 1) if layout == "trainjob" else (1, 2)
    spec = k8s.K8sSpec(
        api=layout,
        workers=pods,
        slots_per_worker=slots,
        trainer_args=[
            "--dataset",
            "synthetic",
            "--steps",
            "2000",
            "--log-every",
            "5",
            "--no-progress",
            "--checkpoint-every",
            "20",
            *trainer,
        ],
    )
    lines = k8s.hostfile(spec)
    names = [line.split()[0] for line in lines]
    # the pods' hostnames are their pod names (JobSet: <job>-<replicated job>-<i>-<j>; MPIJob: <job>-launcher)
    launcher = f"{spec.name}-launcher-0-0" if layout == "trainjob" else f"{spec.name}-launcher"
    worker = names[0].split(".")[0]
    hosts = {LAUNCHER_IP: [launcher], WORKER_IP: [worker]}
    for name in names:
        hosts[LAUNCHER_IP if name.startswith(launcher + ".") else WORKER_IP].insert(0, name)
    env = {
        **k8s.launcher_env(spec),
        "OMPI_MCA_plm_rsh_args": "-o ConnectionAttempts=10",
        "OMPI_MCA_orte_keep_fqdn_hostnames": "true",
        "OMPI_MCA_orte_set_default_slots": str(slots),
    }
    (work / "hostfile").write_text("".join(f"{line}\n" for line in lines))
    (work / "hosts").write_text("127.0.0.1\tlocalhost\n" + "".join(f"{ip}\t{' '.join(n)}\n" for ip, n in hosts.items()))
    (work / "pods").write_text(f"{launcher}\n{worker}\n")
    (work / "cmd").write_text("".join(f"{a}\n" for a in k8s.mpirun_command(spec)))
    (work / "launcher.env").write_text("".join(f"{k}={v}\n" for k, v in env.items()))


if __name__ == "__main__":
    main(sys.argv[1:])
