"""The job's spec (:class:`K8sSpec`: every option once, its flag generated from the field), its
checks, and the constants the image and the operators fix."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from ..mpirun import add_mpi_allreduce_arg, mca_option
from ..specflags import option, trainer_args_option

# Fixed by the image (deploy/Dockerfile)
APP_DIR = "/opt/allreduce_train"
LAUNCHER_ENTRYPOINT = f"{APP_DIR}/deploy/launcher-entrypoint.sh"  # the launcher container's command (bounded mpirun)
PYTHON = f"{APP_DIR}/.venv/bin/python"
IMAGE_PATH = f"{APP_DIR}/.venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
RUNS_DIR = f"{APP_DIR}/runs"  # the trainer's default --run-dir "runs", relative to the working directory
USER_ID = 1000  # mpiuser: sshd, mpirun and the ranks never run as root
SSH_DIR = "/home/mpiuser/.ssh"  # where the operator mounts the job's ssh keys (sshAuthMountPath)
SSH_PORT = 2222  # a non-root sshd cannot bind 22
TENSORBOARD_PORT = 6007  # not 6006: X display :6 to hwloc, which hangs mpirun (docs/faults.md)
GPU_RESOURCE = "nvidia.com/gpu"
LABEL_NAME = "app.kubernetes.io/name"
LABEL_INSTANCE = "app.kubernetes.io/instance"
LABEL_COMPONENT = "app.kubernetes.io/component"
APP = "allreduce-train"
TRAINER_API = "trainer.kubeflow.org"
ANCESTOR_LABEL = f"{TRAINER_API}/trainjob-ancestor-step"  # marks the Job that takes the TrainJob's trainer fields
NODE = "node"  # Trainer's name for the trainer container and for the Job of the nodes
APIS = ("trainjob", "mpijob")
# Trainer runtimes say which framework they serve (kubeflow/trainer v2.3.0 manifests/base/runtimes/*.yaml)
FRAMEWORK_LABEL = f"{TRAINER_API}/framework"
FRAMEWORK = "horovod"
# The operators set these in the launcher (Open MPI's hostfile, ssh options, FQDN host names, slots):
# Trainer's webhook refuses them in trainer.env (kubeflow/trainer v2.3.0 pkg/constants/constants.go
# MPIReservedEnvNames, checked in pkg/runtime/framework/plugins/mpi/mpi.go Validate); mpi-operator
# v0.8.0 appends its own after the user's (pkg/controller/mpi_job_controller.go), which wins.
MPI_RESERVED_ENV = (
    "OMPI_MCA_orte_default_hostfile",
    "OMPI_MCA_plm_rsh_args",
    "OMPI_MCA_orte_keep_fqdn_hostnames",
    "OMPI_MCA_orte_set_default_slots",
)
OMPI_ENV_PREFIX = "OMPI_MCA_"

DNS_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")  # RFC 1035, what pod hostnames must be
QUANTITY = re.compile(r"^([0-9]+(\.[0-9]+)?|\.[0-9]+)(m|[KMGTPE]i?|[kMGTPE])?$")
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
LABEL_KEY = re.compile(r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
LABEL_VALUE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$")
CLEAN_POD_POLICIES = ("None", "Running", "All")
TAINT_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")


def parse_affinity(text: str) -> dict:
    """``--affinity JSON`` -> a Kubernetes Affinity object; empty: none."""
    if not text:
        return {}
    try:
        affinity = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"--affinity: not JSON ({e.msg} at character {e.pos})") from None
    if not isinstance(affinity, dict):
        raise ValueError("--affinity: give a JSON object (a Kubernetes Affinity)")
    return affinity


@dataclass
class K8sSpec:
    """One job: the launcher's options plus what Kubernetes needs to place the pods."""

    api: str = option(
        "trainjob",
        "trainjob: Kubeflow Trainer (v2.3) TrainJob + ClusterTrainingRuntime; mpijob: mpi-operator "
        "(v0.8) MPIJob (default: %(default)s)",
        choices=APIS,
    )
    name: str = option("allreduce-train", "job name, also the run name under runs/ (default: %(default)s)")
    namespace: str = option("", "namespace of every namespaced object (default: kubectl's current one)")
    runtime: str = option(  # the ClusterTrainingRuntime the TrainJob names
        "allreduce-train",
        "name of the ClusterTrainingRuntime rendered with the TrainJob; one per image (default: %(default)s)",
    )
    image: str = option("allreduce-train:cpu", "image built from deploy/Dockerfile (default: %(default)s)")
    image_pull_policy: str = option("IfNotPresent", choices=("IfNotPresent", "Always", "Never"))
    image_pull_secrets: list[str] = option(
        [],
        "Secret with the registry's credentials, for every pod (repeatable)",
        flag="--image-pull-secret",
        action="append",
        metavar="SECRET",
    )
    workers: int = option(  # pods that run ranks
        2,
        "pods that run ranks: an MPIJob's workers (its launcher runs only mpirun); a TrainJob's "
        "launcher and N-1 nodes, N >= 2 (default: %(default)s)",
    )
    slots_per_worker: int = option(  # the flag's default: --gpus when set, else this (spec_from_args)
        1, "ranks per worker pod (default: --gpus when set, else 1); ranks = workers x slots", flag_default=None
    )
    # per worker: requests = limits, so that ranks get whole cores
    cpu: str = option("2", "CPU per worker pod, request = limit (default: %(default)s)")
    memory: str = option("4Gi", "memory per worker pod, request = limit (default: %(default)s)")
    gpus: int = option(0, f"{GPU_RESOURCE} per worker pod (default: %(default)s; needs the GPU image)")
    node_selector: dict[str, str] = option(  # every pod of the job
        {},
        "run every pod on nodes with this label (repeatable), e.g. nvidia.com/gpu.present=true",
        action="append",
        metavar="LABEL=VALUE",
        parse=lambda items: pairs(items, "--node-selector", "LABEL=VALUE"),
    )
    tolerations: list[dict] = option(
        [],
        "tolerate this taint in every pod (repeatable), e.g. nvidia.com/gpu:NoSchedule",
        flag="--toleration",
        action="append",
        metavar="KEY[=VALUE][:EFFECT]",
        parse=lambda items: [parse_toleration(t) for t in items],
    )
    affinity: dict = option(
        {},
        "the pods' affinity, as JSON (a Kubernetes Affinity object), e.g. '{\"podAntiAffinity\": {...}}'",
        metavar="JSON",
        flag_default="",
        parse=parse_affinity,
    )
    mca: list[tuple[str, str]] = mca_option()
    # the image's launch/openmpi_allreduce_ring.rules; "auto": Open MPI's choice
    mpi_allreduce: str = option(
        "ring", add=lambda p, default: add_mpi_allreduce_arg(p, default, default, "the image's ")
    )
    env: dict[str, str] = option(  # set in every pod; HOROVOD_*/NCCL_* reach the ranks with -x
        {},
        "environment variable for every pod (repeatable); HOROVOD_*/NCCL_* are forwarded to the ranks; "
        "not the operators' own: " + ", ".join(MPI_RESERVED_ENV),
        action="append",
        metavar="NAME=VALUE",
        parse=lambda items: pairs(items, "--env", "NAME=VALUE"),
    )
    trainer_args: list[str] = trainer_args_option()
    runs_pvc: str = option(  # claim mounted at RUNS_DIR in the pods that run ranks (and TensorBoard)
        "",
        "PersistentVolumeClaim for runs/ (logs, checkpoints); without one, runs stay in rank 0's pod",
        metavar="CLAIM",
    )
    runs_pvc_size: str = option("", "also create that claim (ReadWriteMany) with this size, e.g. 10Gi", metavar="SIZE")
    storage_class: str = option("", "storage class of the created claim (default: the cluster's)")
    data_pvc: str = option(  # claim with the dataset, mounted read-only at data_dir
        "",
        "PersistentVolumeClaim holding the dataset, mounted read-only at --data-dir in every pod that "
        "runs ranks; the trainer gets --data-dir",
        metavar="CLAIM",
    )
    data_dir: str = option("/data", "where --data-pvc is mounted (default: %(default)s)")
    tensorboard: bool = option(False, "add a TensorBoard Deployment and ClusterIP Service reading the runs volume")
    grace_seconds: int = option(
        120,
        "terminationGracePeriodSeconds of this job's pods (a TrainJob's runtimePatches): time for one "
        "step + a checkpoint after SIGTERM (default: %(default)s)",
        flag="--grace-period",
        metavar="SECONDS",
    )
    backoff_limit: int = option(
        3,
        "launcher restarts after a failure before the job fails; a TrainJob's preemptions (exit 75, "
        "eviction) do not count, an MPIJob's do; a TrainJob's is its runtime's, shared by every job "
        "naming it (default: %(default)s)",
    )
    clean_pod_policy: str = option("Running", "MPIJob: None, Running or All (default: %(default)s)")
    ttl_seconds: int = option(  # MPIJob: deleted with its pods a day after it finished (logs readable until then)
        86400,
        "MPIJob: runPolicy.ttlSecondsAfterFinished, the job and its pods (and the launcher's log) are "
        "deleted this long after it finished (default: %(default)s, a day)",
        flag="--ttl-after-finished",
        metavar="SECONDS",
    )
    resume: bool = option(  # --name <job> --resume auto: a restarted launcher continues the run
        True, "do not add `--name NAME --resume auto` to the trainer arguments", flag="--no-resume"
    )

    @property
    def np(self) -> int:
        return self.workers * self.slots_per_worker

    def pod_names(self) -> list[str]:
        """The longest pod names the operator will create (pod hostnames must be DNS labels)."""
        if self.api == "mpijob":
            return [f"{self.name}-worker-{self.workers - 1}", f"{self.name}-launcher"]
        # JobSet: <jobset>-<replicated job>-<job index>-<pod index>
        return [f"{self.name}-{NODE}-0-{max(self.workers - 2, 0)}", f"{self.name}-launcher-0-0"]

    def validate(self) -> None:
        """Raise ValueError naming the option to fix (the messages mention the CLI flags)."""
        if self.api not in APIS:
            raise ValueError(f"--api {self.api!r}: choose one of {', '.join(APIS)}")
        if self.workers < 1:
            raise ValueError(f"--workers must be >= 1 (got {self.workers})")
        if self.api == "trainjob" and self.workers < 2:
            raise ValueError(
                "--workers 1 with --api trainjob: Trainer v2.3 starts max(numNodes-1, 1) node pods beside "
                "the launcher, so one more pod would hold a worker's resources idle; use --api mpijob for "
                "one pod, or --workers 2 or more"
            )
        if self.slots_per_worker < 1:
            raise ValueError(f"--slots-per-worker must be >= 1 (got {self.slots_per_worker})")
        if self.gpus < 0:
            raise ValueError(f"--gpus must be >= 0 (got {self.gpus})")
        longest = max(self.pod_names(), key=len)
        if not DNS_LABEL.match(self.name) or len(longest) > 63:
            raise ValueError(
                f"--name {self.name!r}: must be lowercase letters, digits and '-', start with a letter, "
                f"and keep the pod name {longest!r} within 63 characters"
            )
        for flag, value in (
            ("--namespace", self.namespace),
            ("--runtime", self.runtime),
            ("--runs-pvc", self.runs_pvc),
            ("--data-pvc", self.data_pvc),
            *(("--image-pull-secret", s) for s in self.image_pull_secrets),
        ):
            if value and (not DNS_LABEL.match(value) or len(value) > 63):
                raise ValueError(f"{flag} {value!r}: must be a DNS label (lowercase letters, digits, '-')")
        if not self.image or any(c.isspace() for c in self.image):
            raise ValueError(f"--image {self.image!r}: give an image reference without spaces")
        for flag, value in (("--cpu", self.cpu), ("--memory", self.memory), ("--runs-pvc-size", self.runs_pvc_size)):
            if value and not QUANTITY.match(value):
                raise ValueError(f"{flag} {value!r}: not a Kubernetes quantity (e.g. 2, 500m, 4Gi)")
        for name in self.env:
            if not ENV_NAME.match(name):
                raise ValueError(f"--env {name!r}: variable names are letters, digits and '_'")
            if name in MPI_RESERVED_ENV:
                raise ValueError(
                    f"--env {name}: reserved, the operator sets it (Trainer refuses it, mpi-operator "
                    "overrides it); leave it out, or pass other Open MPI parameters with --mca KEY VALUE"
                )
        for key, _ in self.mca:
            if OMPI_ENV_PREFIX + key in MPI_RESERVED_ENV:
                raise ValueError(
                    f"--mca {key}: reserved, the operator sets it for the hostfile it writes "
                    f"({OMPI_ENV_PREFIX}{key}); leave it out"
                )
        for key, value in self.node_selector.items():
            if not LABEL_KEY.match(key) or not LABEL_VALUE.match(value):
                raise ValueError(
                    f"--node-selector {key}={value}: not a label key and value (e.g. nvidia.com/gpu.present=true)"
                )
        if self.runs_pvc_size and not self.runs_pvc:
            raise ValueError("--runs-pvc-size needs --runs-pvc NAME (the claim to create)")
        if self.tensorboard and not self.runs_pvc:
            raise ValueError(
                "--tensorboard needs --runs-pvc: TensorBoard reads the runs the workers write to that volume"
            )
        if not self.data_dir.startswith("/") or self.data_dir.rstrip("/") in ("", RUNS_DIR, APP_DIR, SSH_DIR):
            raise ValueError(
                f"--data-dir {self.data_dir!r}: give an absolute path of its own (not /, the app or runs "
                "directory), e.g. /data"
            )
        if self.grace_seconds < 1:
            raise ValueError(f"--grace-period must be >= 1 second (got {self.grace_seconds})")
        if self.backoff_limit < 0:
            raise ValueError(f"--backoff-limit must be >= 0 (got {self.backoff_limit})")
        if self.clean_pod_policy not in CLEAN_POD_POLICIES:
            raise ValueError(
                f"--clean-pod-policy {self.clean_pod_policy!r}: choose one of {', '.join(CLEAN_POD_POLICIES)}"
            )
        if self.ttl_seconds < 0:
            raise ValueError(f"--ttl-after-finished must be >= 0 seconds (got {self.ttl_seconds})")


def parse_toleration(text: str) -> dict:
    """``KEY[=VALUE]:EFFECT`` or ``KEY[=VALUE]`` (any effect) -> a toleration; no value: operator Exists."""
    taint, _, effect = text.partition(":")
    key, eq, value = taint.partition("=")
    if (
        not key
        or not LABEL_KEY.match(key)
        or (effect and effect not in TAINT_EFFECTS)
        or (eq and not LABEL_VALUE.match(value))
    ):
        raise ValueError(
            f"--toleration {text!r}: write KEY[=VALUE][:EFFECT], EFFECT one of {', '.join(TAINT_EFFECTS)}, "
            "e.g. nvidia.com/gpu:NoSchedule"
        )
    tol = {"key": key, "operator": "Equal", "value": value} if eq else {"key": key, "operator": "Exists"}
    if effect:
        tol["effect"] = effect
    return tol


def pairs(items: list[str], flag: str, example: str) -> dict[str, str]:
    """``NAME=VALUE`` items (a repeated flag) -> a dict; ``flag`` and ``example`` name the fix."""
    out = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep:
            raise ValueError(f"{flag} {item!r}: write {example}")
        out[name] = value
    return out
