"""Render the Kubernetes objects that run the trainer: a Kubeflow Trainer ``TrainJob`` with the
``ClusterTrainingRuntime`` it names (``trainer.kubeflow.org/v1alpha1``, ``--api trainjob``, the default), or
an mpi-operator ``MPIJob`` (``kubeflow.org/v2beta1``, ``--api mpijob``).

    python -m launch k8s --name lenet --workers 2 --image registry.example/allreduce-train:cpu -- --epochs 2
    python -m launch k8s --api mpijob --workers 4 --gpus 1 --runs-pvc runs --tensorboard -- --model resnet18 > job.yaml
    kubectl apply -f job.yaml

The manifest goes to stdout (or ``--output``). This module is the only place the manifests are
written (docs/kubernetes.md says why there is no helm chart). The launcher runs exactly the line
that ``python -m launch`` would run for the same ranks (:func:`launch.mpirun.build_command`),
printed at the top of the manifest; the operator writes the hostfile and points Open MPI at it, so
the line names no hosts. Pods that run ranks run sshd (the launcher's mpirun reaches them through
it) as the image's non-root user. The trainer gets ``--expect-hosts N`` (N pods run ranks): a job
whose ranks all landed on fewer pods stops at start with one line instead of finishing "Complete".

The two APIs place the ranks alike: ``--workers N`` pods run ranks, ``--slots-per-worker`` in each,
and no pod holds a rank's resources without running ranks. An MPIJob has N worker pods and a small
launcher pod that runs only mpirun. A TrainJob's launcher is one of the N pods (``runLauncherAsNode``:
Trainer gives ``resourcesPerNode`` to the launcher and to the nodes alike) beside N-1 node pods;
Trainer always starts at least one node pod (``max(numNodes-1, 1)``), so a TrainJob needs N >= 2
(``--workers 1``: one line says to use ``--api mpijob``). The operator writes the hostfile in the
order :func:`hostfile` gives (Trainer: the node pods first, the launcher last, as DNS names);
mpirun's ``-map-by slot`` fills the pods in Open MPI's order, which puts mpirun's own pod first
when the hostfile lists it: :func:`placement` says which ranks run where, and the manifest's
header prints it. In a TrainJob rank 0 runs in the launcher pod, in an MPIJob in the first worker.

What every job naming a ClusterTrainingRuntime shares is in the runtime (the image of the node
pods, the pull policy, the Jobs' backoffLimit: Trainer v2.3's runtimePatches cannot change them);
what is the job's own goes into the TrainJob (the launcher's line, counts, resources, environment,
the pods' terminationGracePeriodSeconds, placement and volumes through ``runtimePatches``).

Preemption: Kubernetes sends SIGTERM to every container of a pod it evicts and SIGKILL after
``terminationGracePeriodSeconds``. The entrypoints in deploy/ turn SIGTERM into the trainer's
"checkpoint and exit 75" signal (SIGUSR1: to mpirun in the launcher, which Open MPI forwards to
every rank; to the ranks directly in a worker), and ``--resume auto`` continues the run when the
launcher is restarted. The grace period must cover one step plus writing a checkpoint.

Like the rest of ``launch``, this module uses the standard library only; YAML is written by the
small emitter below (strings that are not plainly safe are written as JSON strings, which YAML
reads as double-quoted scalars).
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field

from .exitcodes import EXIT_PREEMPTED, NO_RETRY
from .mpirun import TRAINER, LaunchSpec, add_mpi_allreduce_arg, build_command, ring_rules

# Fixed by the image (deploy/Dockerfile)
APP_DIR = "/opt/allreduce_train"
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


@dataclass
class K8sSpec:
    """One job: the launcher's options plus what Kubernetes needs to place the pods."""

    api: str = "trainjob"
    name: str = "allreduce-train"
    namespace: str = ""
    runtime: str = "allreduce-train"  # the ClusterTrainingRuntime the TrainJob names
    image: str = "allreduce-train:cpu"
    image_pull_policy: str = "IfNotPresent"
    image_pull_secrets: list[str] = field(default_factory=list)
    workers: int = 2  # pods that run ranks
    slots_per_worker: int = 1
    cpu: str = "2"  # per worker: requests = limits, so that ranks get whole cores
    memory: str = "4Gi"
    gpus: int = 0  # per worker
    node_selector: dict[str, str] = field(default_factory=dict)  # every pod of the job
    tolerations: list[dict] = field(default_factory=list)
    affinity: dict = field(default_factory=dict)
    mca: list[tuple[str, str]] = field(default_factory=list)
    mpi_allreduce: str = "ring"  # the image's launch/openmpi_allreduce_ring.rules; "auto": Open MPI's choice
    env: dict[str, str] = field(default_factory=dict)  # set in every pod; HOROVOD_*/NCCL_* reach the ranks with -x
    trainer_args: list[str] = field(default_factory=list)
    resume: bool = True  # --name <job> --resume auto: a restarted launcher continues the run
    runs_pvc: str = ""  # claim mounted at RUNS_DIR in the pods that run ranks (and TensorBoard)
    runs_pvc_size: str = ""  # also render that claim (ReadWriteMany) with this size
    storage_class: str = ""
    data_pvc: str = ""  # claim with the dataset, mounted read-only at data_dir
    data_dir: str = "/data"
    tensorboard: bool = False
    grace_seconds: int = 120
    backoff_limit: int = 3
    clean_pod_policy: str = "Running"
    ttl_seconds: int = 86400  # MPIJob: deleted with its pods a day after it finished (logs readable until then)

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


def launcher_env(spec: K8sSpec) -> dict[str, str]:
    """The launcher container's environment: what mpirun forwards to the ranks is chosen from it."""
    # HWLOC_COMPONENTS: see launch.mpirun.no_gl_probe; set here so the pod never probes X displays.
    # ALLREDUCE_TRAIN_GRACE_PERIOD: deploy/launcher-entrypoint.sh's bound (launch/run.py) ends mpirun
    # before the pod's own grace period does, so the job's exit code is the one the restart rules read.
    return {"HWLOC_COMPONENTS": "-gl", "ALLREDUCE_TRAIN_GRACE_PERIOD": str(max(1, spec.grace_seconds - 10)), **spec.env}


def rank_args(spec: K8sSpec) -> list[str]:
    # A fixed run name, so that a restarted launcher finds the run (and its checkpoint) again; the
    # pods that run ranks as the placement to check; the data volume's path. The user's own
    # arguments come after and win.
    head = ["--name", spec.name, "--resume", "auto"] if spec.resume else []
    head += ["--expect-hosts", str(spec.workers)]
    if spec.data_pvc:
        head += ["--data-dir", spec.data_dir]
    return [*head, *spec.trainer_args]


def hostfile(spec: K8sSpec) -> list[str]:
    """The hostfile the operator writes for this job, in its order (the launcher reads it through
    OMPI_MCA_orte_default_hostfile, which the operator sets).

    Trainer v2.3.0 (pkg/runtime/framework/plugins/mpi/mpi.go buildHostFileConfigMap) lists the pods
    of the runtime's replicatedJobs in their order, "node" then "launcher" here as in upstream's
    runtimes, each pod as ``<trainjob>-<replicated job>-<job index>-<pod index>.<trainjob>``
    (plugins/jobset/jobset.go IdentifyPodNetwork) with ``slots=numProcPerNode``. mpi-operator v0.8.0
    (pkg/controller/mpi_job_controller.go newConfigMap) lists the workers as
    ``<mpijob>-worker-<i>.<mpijob>.<namespace>.svc slots=slotsPerWorker``; its launcher runs no ranks.
    """
    slots = spec.slots_per_worker
    if spec.api == "mpijob":
        namespace = spec.namespace or "default"
        return [f"{spec.name}-worker-{i}.{spec.name}.{namespace}.svc slots={slots}" for i in range(spec.workers)]
    nodes = [f"{spec.name}-{NODE}-0-{i}.{spec.name} slots={slots}" for i in range(spec.workers - 1)]
    return [*nodes, f"{spec.name}-launcher-0-0.{spec.name} slots={slots}"]


def placement(spec: K8sSpec) -> list[tuple[str, range]]:
    """Which ranks run on which host: mpirun's ``-map-by slot`` (launch.mpirun.build_command) fills
    the hosts, each up to its slots (-np is the sum of the slots), in Open MPI's order: the node
    mpirun runs on first when the hostfile lists it (Open MPI 4.1
    orte/mca/rmaps/base/rmaps_base_support_fns.c, orte_rmaps_base_get_target_nodes: "if the hnp was
    allocated, include it"; a hostfile name is mpirun's own when it resolves to one of the pod's
    addresses), then the others in the hostfile's order. A TrainJob's launcher is listed last and
    still gets rank 0 (tools/k8s_pod_check.sh LAYOUT=trainjob shows it)."""
    hosts = [line.split(" slots=") for line in hostfile(spec)]
    own = [h for h in hosts if h[0].startswith(f"{spec.name}-launcher")]
    out, first = [], 0
    for host, slots in own + [h for h in hosts if h not in own]:
        out.append((host, range(first, first + int(slots))))
        first += int(slots)
    return out


def mpirun_command(spec: K8sSpec) -> list[str]:
    """The launcher's command: ``python -m launch``'s line for the same ranks, as the image's user."""
    launch = LaunchSpec(
        np=spec.np,
        mca=list(spec.mca),
        module=TRAINER,
        trainer_args=rank_args(spec),
        python=PYTHON,
        allreduce_rules=ring_rules(spec.mpi_allreduce, APP_DIR),
    )
    return build_command(launch, environ={"PATH": IMAGE_PATH, **launcher_env(spec)}, is_root=False)


def _labels(spec: K8sSpec, component: str, instance: str = "") -> dict[str, str]:
    return {LABEL_NAME: APP, LABEL_INSTANCE: instance or spec.name, LABEL_COMPONENT: component}


def _metadata(spec: K8sSpec, name: str, component: str) -> dict:
    meta: dict = {"name": name}
    if spec.namespace:
        meta["namespace"] = spec.namespace
    meta["labels"] = _labels(spec, component)
    return meta


def _env_list(env: dict[str, str]) -> list[dict[str, str]]:
    return [{"name": k, "value": v} for k, v in env.items()]


def _pod_security() -> dict:
    # fsGroup: the runs volume becomes writable by the image's user
    return {"runAsUser": USER_ID, "runAsGroup": USER_ID, "runAsNonRoot": True, "fsGroup": USER_ID}


def _rank_resources(spec: K8sSpec) -> dict:
    """A pod that runs ranks: requests = limits (whole cores; one rank per GPU with --gpus)."""
    resources = {"cpu": spec.cpu, "memory": spec.memory}
    if spec.gpus:
        resources[GPU_RESOURCE] = str(spec.gpus)
    return {"requests": dict(resources), "limits": dict(resources)}


def _placement(spec: K8sSpec) -> dict:
    """Where every pod of the job may run and how its image is pulled."""
    out: dict = {}
    if spec.image_pull_secrets:
        out["imagePullSecrets"] = [{"name": s} for s in spec.image_pull_secrets]
    if spec.node_selector:
        out["nodeSelector"] = dict(spec.node_selector)
    if spec.tolerations:
        out["tolerations"] = [dict(t) for t in spec.tolerations]
    if spec.affinity:
        out["affinity"] = spec.affinity
    return out


def _rank_volumes(spec: K8sSpec) -> tuple[list[dict], list[dict]]:
    """Volumes and mounts of a pod that runs ranks, besides /dev/shm: the runs and the data volume."""
    volumes: list[dict] = []
    mounts: list[dict] = []
    if spec.runs_pvc:
        volumes.append({"name": "runs", "persistentVolumeClaim": {"claimName": spec.runs_pvc}})
        mounts.append({"name": "runs", "mountPath": RUNS_DIR})
    if spec.data_pvc:
        volumes.append({"name": "data", "persistentVolumeClaim": {"claimName": spec.data_pvc, "readOnly": True}})
        mounts.append({"name": "data", "mountPath": spec.data_dir, "readOnly": True})
    return volumes, mounts


SHM_VOLUME = {"name": "dshm", "emptyDir": {"medium": "Memory"}}  # Open MPI's shared memory between slots of a pod
SHM_MOUNT = {"name": "dshm", "mountPath": "/dev/shm"}


def _sshd_container(spec: K8sSpec, name: str, env: dict[str, str]) -> dict:
    """A pod's sshd, through which the launcher's mpirun starts the ranks of that pod."""
    return {
        "name": name,
        "image": spec.image,
        "imagePullPolicy": spec.image_pull_policy,
        "workingDir": APP_DIR,  # where orted starts the ranks: runs/ is the volume
        "command": [f"{APP_DIR}/deploy/worker-entrypoint.sh"],
        "env": _env_list({"SSHD_PORT": str(SSH_PORT), **env}),
        "ports": [{"name": "ssh", "containerPort": SSH_PORT}],
        # the launcher starts once every worker's sshd accepts connections
        "readinessProbe": {"tcpSocket": {"port": SSH_PORT}, "periodSeconds": 2},
    }


# -- MPIJob (mpi-operator) -------------------------------------------------------------------


def launcher_pod(spec: K8sSpec) -> dict:
    container = {
        "name": "launcher",
        "image": spec.image,
        "imagePullPolicy": spec.image_pull_policy,
        "workingDir": APP_DIR,  # mpirun starts the ranks in the same directory: runs/ is the volume
        "command": [f"{APP_DIR}/deploy/launcher-entrypoint.sh"],
        "args": mpirun_command(spec),
        "env": _env_list(launcher_env(spec)),
        "resources": {"requests": {"cpu": "250m", "memory": "256Mi"}, "limits": {"memory": "1Gi"}},
    }
    return {
        "metadata": {"labels": _labels(spec, "launcher")},
        "spec": {
            "terminationGracePeriodSeconds": spec.grace_seconds,
            "securityContext": _pod_security(),
            **_placement(spec),
            "containers": [container],
        },
    }


def worker_pod(spec: K8sSpec) -> dict:
    volumes, mounts = _rank_volumes(spec)
    container = {
        **_sshd_container(spec, "worker", spec.env),
        "resources": _rank_resources(spec),
        "volumeMounts": [SHM_MOUNT, *mounts],
    }
    return {
        "metadata": {"labels": _labels(spec, "worker")},
        "spec": {
            "terminationGracePeriodSeconds": spec.grace_seconds,
            "securityContext": _pod_security(),
            **_placement(spec),
            "containers": [container],
            "volumes": [SHM_VOLUME, *volumes],
        },
    }


def mpijob(spec: K8sSpec) -> dict:
    return {
        "apiVersion": "kubeflow.org/v2beta1",
        "kind": "MPIJob",
        "metadata": _metadata(spec, spec.name, "job"),
        "spec": {
            "slotsPerWorker": spec.slots_per_worker,
            "runPolicy": {
                "cleanPodPolicy": spec.clean_pod_policy,
                "backoffLimit": spec.backoff_limit,
                "ttlSecondsAfterFinished": spec.ttl_seconds,
            },
            "mpiImplementation": "OpenMPI",
            "launcherCreationPolicy": "WaitForWorkersReady",
            "sshAuthMountPath": SSH_DIR,
            "mpiReplicaSpecs": {
                # OnFailure: a launcher that exits 75 (preempted) is restarted and resumes, up to backoffLimit
                "Launcher": {"replicas": 1, "restartPolicy": "OnFailure", "template": launcher_pod(spec)},
                "Worker": {"replicas": spec.workers, "restartPolicy": "OnFailure", "template": worker_pod(spec)},
            },
        },
    }


# -- TrainJob + ClusterTrainingRuntime (Kubeflow Trainer) --------------------------------------


def _restart_policy(spec: K8sSpec, container: str, no_retry: bool) -> dict:
    """A Job's restarts: a preempted pod (exit 75, or evicted) is replaced without counting against
    backoffLimit; bad input and divergence fail the job at once (``no_retry``); anything else is
    retried up to backoffLimit times. podFailurePolicy needs restartPolicy Never."""
    rules = [
        {"action": "Ignore", "onExitCodes": {"containerName": container, "operator": "In", "values": [EXIT_PREEMPTED]}},
        {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]},
    ]
    if no_retry:
        rules.insert(
            1,
            {
                "action": "FailJob",
                "onExitCodes": {"containerName": container, "operator": "In", "values": list(NO_RETRY)},
            },
        )
    return {"backoffLimit": spec.backoff_limit, "podFailurePolicy": {"rules": rules}}


def training_runtime(spec: K8sSpec) -> dict:
    """The ClusterTrainingRuntime: Open MPI started by Trainer's MPI plugin (ssh keys, hostfile), a
    launcher that is also a node, nodes that run sshd. It holds only what every job naming it
    shares (the node pods' image and pull policy, the Jobs' backoffLimit and failure rules: Trainer
    v2.3's runtimePatches cannot set them); what differs from job to job is in the TrainJob (the
    trainer's command, counts, resources, environment, and through runtimePatches the pods'
    terminationGracePeriodSeconds, placement, volumes and labels)."""
    node_pod = {
        "spec": {
            "restartPolicy": "Never",
            "securityContext": _pod_security(),
            "containers": [{**_sshd_container(spec, NODE, {}), "volumeMounts": [SHM_MOUNT]}],
            "volumes": [SHM_VOLUME],
        },
    }
    launcher_pod = {
        "spec": {
            "restartPolicy": "Never",
            "securityContext": _pod_security(),
            "containers": [
                {
                    "name": NODE,  # Trainer gives the TrainJob's image, command, args, env, resources to this container
                    "image": spec.image,
                    "imagePullPolicy": spec.image_pull_policy,
                    "workingDir": APP_DIR,  # mpirun starts the ranks in the same directory: runs/ is the volume
                    "command": [f"{APP_DIR}/deploy/launcher-entrypoint.sh"],
                    "volumeMounts": [SHM_MOUNT],
                }
            ],
            "volumes": [SHM_VOLUME],
        },
    }
    labels = {**_labels(spec, "runtime", instance=spec.runtime), FRAMEWORK_LABEL: FRAMEWORK}
    meta = {"name": spec.runtime, "labels": labels}
    return {
        "apiVersion": f"{TRAINER_API}/v1alpha1",
        "kind": "ClusterTrainingRuntime",
        "metadata": meta,
        "spec": {
            "mlPolicy": {
                "numNodes": 1,
                "mpi": {
                    "numProcPerNode": 1,
                    "mpiImplementation": "OpenMPI",
                    "sshAuthMountPath": SSH_DIR,
                    "runLauncherAsNode": True,
                },
            },
            "template": {
                "spec": {
                    "network": {"publishNotReadyAddresses": True},  # hostnames resolve before sshd is ready
                    "successPolicy": {"operator": "All", "targetReplicatedJobs": ["launcher"]},
                    "replicatedJobs": [
                        {
                            "name": NODE,
                            "template": {"spec": {**_restart_policy(spec, NODE, no_retry=False), "template": node_pod}},
                        },
                        {
                            "name": "launcher",
                            "dependsOn": [{"name": NODE, "status": "Ready"}],
                            "template": {
                                "metadata": {"labels": {ANCESTOR_LABEL: "trainer"}},
                                "spec": {**_restart_policy(spec, NODE, no_retry=True), "template": launcher_pod},
                            },
                        },
                    ],
                },
            },
        },
    }


def trainjob(spec: K8sSpec) -> dict:
    """The TrainJob: the launcher's line and the pods' counts and resources in ``trainer``; the
    placement, volumes and labels of this job's pods as a patch of the shared runtime."""
    volumes, mounts = _rank_volumes(spec)
    # the grace period is the job's: its launcher's bound (ALLREDUCE_TRAIN_GRACE_PERIOD) is derived from it
    pod_patch = {"terminationGracePeriodSeconds": spec.grace_seconds, **_placement(spec)}
    if volumes:
        pod_patch["volumes"] = volumes
        pod_patch["containers"] = [{"name": NODE, "volumeMounts": mounts}]
    # the job's own pod labels, as an MPIJob's pods have them: `kubectl logs -l` works alike for both
    components = {NODE: "worker", "launcher": "launcher"}
    return {
        "apiVersion": f"{TRAINER_API}/v1alpha1",
        "kind": "TrainJob",
        "metadata": _metadata(spec, spec.name, "job"),
        "spec": {
            "runtimeRef": {"name": spec.runtime, "kind": "ClusterTrainingRuntime", "apiGroup": TRAINER_API},
            "trainer": {
                "image": spec.image,
                "command": [f"{APP_DIR}/deploy/launcher-entrypoint.sh"],
                "args": mpirun_command(spec),
                "env": _env_list(launcher_env(spec)),  # the launcher's and the nodes' "node" containers
                "numNodes": spec.workers,
                "numProcPerNode": spec.slots_per_worker,
                "resourcesPerNode": _rank_resources(spec),
            },
            "runtimePatches": [
                {
                    "manager": f"{APP}/launch-k8s",  # who owns the patch (Kueue, for one, adds its own)
                    "trainingRuntimeSpec": {
                        "template": {
                            "spec": {
                                "replicatedJobs": [
                                    {
                                        "name": rjob,
                                        "template": {
                                            "spec": {
                                                "template": {
                                                    "metadata": {"labels": _labels(spec, component)},
                                                    "spec": pod_patch,
                                                }
                                            }
                                        },
                                    }
                                    for rjob, component in components.items()
                                ]
                            }
                        }
                    },
                }
            ],
        },
    }


# -- both -----------------------------------------------------------------------------------


def runs_claim(spec: K8sSpec) -> dict:
    claim: dict = {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": spec.runs_pvc_size}}}
    if spec.storage_class:
        claim["storageClassName"] = spec.storage_class
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": _metadata(spec, spec.runs_pvc, "runs"),
        "spec": claim,
    }


def tensorboard(spec: K8sSpec) -> list[dict]:
    """A TensorBoard Deployment reading the runs volume, and a ClusterIP Service in front of it.

    TensorBoard listens on the pod's interfaces (0.0.0.0), the one deliberate exception to the
    project's loopback rule: a Service can reach nothing else. The Service is ClusterIP only;
    reach it with ``kubectl port-forward``, which binds 127.0.0.1 on your machine.
    """
    name = f"{spec.name}-tensorboard"
    labels = _labels(spec, "tensorboard")
    container = {
        "name": "tensorboard",
        "image": spec.image,
        "imagePullPolicy": spec.image_pull_policy,
        "command": [
            f"{APP_DIR}/.venv/bin/tensorboard",
            "--logdir",
            RUNS_DIR,
            "--host",
            "0.0.0.0",
            "--port",
            str(TENSORBOARD_PORT),
        ],
        "ports": [{"name": "http", "containerPort": TENSORBOARD_PORT}],
        "resources": {"requests": {"cpu": "100m", "memory": "512Mi"}, "limits": {"memory": "2Gi"}},
        "volumeMounts": [{"name": "runs", "mountPath": RUNS_DIR, "readOnly": True}],
    }
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _metadata(spec, name, "tensorboard"),
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "securityContext": _pod_security(),
                    **_placement(spec),
                    "containers": [container],
                    "volumes": [{"name": "runs", "persistentVolumeClaim": {"claimName": spec.runs_pvc}}],
                },
            },
        },
    }
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _metadata(spec, name, "tensorboard"),
        "spec": {
            "type": "ClusterIP",
            "selector": labels,
            "ports": [{"name": "http", "port": TENSORBOARD_PORT, "targetPort": "http"}],
        },
    }
    return [deployment, service]


def manifests(spec: K8sSpec) -> list[dict]:
    """Every object of the job, in the order to apply them."""
    spec.validate()
    docs = [runs_claim(spec)] if spec.runs_pvc_size else []
    docs += [training_runtime(spec), trainjob(spec)] if spec.api == "trainjob" else [mpijob(spec)]
    if spec.tensorboard:
        docs += tensorboard(spec)
    return docs


# -- YAML -----------------------------------------------------------------------------------

# safe unquoted and never read as a number, bool or null: an optional "-"/"--" (flags), then a letter,
# "_" or "/" first; ":" only inside (a ": " or a final ":" would start a mapping)
PLAIN = re.compile(r"^-{0,2}[A-Za-z_/]([A-Za-z0-9_./:-]*[A-Za-z0-9_./-])?$")
YAML_WORDS = {"y", "n", "yes", "no", "on", "off", "true", "false", "null", "~"}


def _scalar(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if not isinstance(value, str):
        raise TypeError(f"cannot write {type(value).__name__} as YAML")
    if PLAIN.match(value) and value.lower() not in YAML_WORDS:
        return value
    return json.dumps(value)  # a JSON string is a valid double-quoted YAML scalar


def _emit(value: dict | list, indent: int, out: list[str]) -> None:
    pad = " " * indent
    if isinstance(value, dict):
        for key, item in value.items():
            if isinstance(item, (dict, list)) and item:
                out.append(f"{pad}{_scalar(key)}:")
                _emit(item, indent + 2 if isinstance(item, dict) else indent, out)
            else:
                out.append(f"{pad}{_scalar(key)}: {_inline(item)}")
    else:
        for item in value:
            if isinstance(item, (dict, list)) and item:
                sub: list[str] = []
                _emit(item, indent + 2, sub)
                out.append(f"{pad}- {sub[0][indent + 2 :]}")
                out += sub[1:]
            else:
                out.append(f"{pad}- {_inline(item)}")


def _inline(value: object) -> str:
    if isinstance(value, dict):
        return "{}"
    if isinstance(value, list):
        return "[]"
    return _scalar(value)


def to_yaml(docs: list[dict], header: Sequence[str] = ()) -> str:
    """YAML documents separated by ``---``, each ``header`` line first as a comment."""
    out = [f"# {line}" for line in header]
    for doc in docs:
        out.append("---")
        _emit(doc, 0, out)
    return "\n".join(out) + "\n"


# -- CLI ------------------------------------------------------------------------------------


def make_parser() -> argparse.ArgumentParser:
    d = K8sSpec()
    p = argparse.ArgumentParser(
        prog="python -m launch k8s",
        description="Print the Kubernetes objects that run the trainer: a Kubeflow Trainer TrainJob and its "
        "ClusterTrainingRuntime (trainer.kubeflow.org/v1alpha1), or an mpi-operator MPIJob "
        "(kubeflow.org/v2beta1); arguments after `--` go to the trainer. Apply them with "
        "`kubectl apply -f -` (docs/kubernetes.md).",
        epilog="example: python -m launch k8s --name lenet --workers 2 --image REGISTRY/allreduce-train:cpu "
        "--runs-pvc runs --runs-pvc-size 10Gi --tensorboard -- --epochs 2 | kubectl apply -f -",
    )
    p.add_argument(
        "--api",
        default=d.api,
        choices=APIS,
        help="trainjob: Kubeflow Trainer (v2.3) TrainJob + ClusterTrainingRuntime; mpijob: mpi-operator "
        f"(v0.8) MPIJob (default: {d.api})",
    )
    p.add_argument("--name", default=d.name, help=f"job name, also the run name under runs/ (default: {d.name})")
    p.add_argument(
        "--namespace", default="", help="namespace of every namespaced object (default: kubectl's current one)"
    )
    p.add_argument(
        "--runtime",
        default=d.runtime,
        help=f"name of the ClusterTrainingRuntime rendered with the TrainJob; one per image (default: {d.runtime})",
    )
    p.add_argument("--image", default=d.image, help=f"image built from deploy/Dockerfile (default: {d.image})")
    p.add_argument("--image-pull-policy", default=d.image_pull_policy, choices=("IfNotPresent", "Always", "Never"))
    p.add_argument(
        "--image-pull-secret",
        action="append",
        default=[],
        metavar="SECRET",
        help="Secret with the registry's credentials, for every pod (repeatable)",
    )
    p.add_argument(
        "--workers",
        type=int,
        default=d.workers,
        help="pods that run ranks: an MPIJob's workers (its launcher runs only mpirun); a TrainJob's "
        f"launcher and N-1 nodes, N >= 2 (default: {d.workers})",
    )
    p.add_argument(
        "--slots-per-worker",
        type=int,
        default=None,
        help="ranks per worker pod (default: --gpus when set, else 1); ranks = workers x slots",
    )
    p.add_argument("--cpu", default=d.cpu, help=f"CPU per worker pod, request = limit (default: {d.cpu})")
    p.add_argument("--memory", default=d.memory, help=f"memory per worker pod, request = limit (default: {d.memory})")
    p.add_argument(
        "--gpus", type=int, default=0, help=f"{GPU_RESOURCE} per worker pod (default: 0; needs the GPU image)"
    )
    p.add_argument(
        "--node-selector",
        action="append",
        default=[],
        metavar="LABEL=VALUE",
        help="run every pod on nodes with this label (repeatable), e.g. nvidia.com/gpu.present=true",
    )
    p.add_argument(
        "--toleration",
        action="append",
        default=[],
        metavar="KEY[=VALUE][:EFFECT]",
        help="tolerate this taint in every pod (repeatable), e.g. nvidia.com/gpu:NoSchedule",
    )
    p.add_argument(
        "--affinity",
        default="",
        metavar="JSON",
        help="the pods' affinity, as JSON (a Kubernetes Affinity object), e.g. '{\"podAntiAffinity\": {...}}'",
    )
    p.add_argument(
        "--mca",
        nargs=2,
        action="append",
        default=[],
        metavar=("KEY", "VALUE"),
        help="extra Open MPI parameter, e.g. --mca btl_tcp_if_include eth0 (repeatable)",
    )
    add_mpi_allreduce_arg(p, d.mpi_allreduce, d.mpi_allreduce, where="the image's ")
    p.add_argument(
        "--env",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="environment variable for every pod (repeatable); HOROVOD_*/NCCL_* are forwarded to the ranks; "
        "not the operators' own: " + ", ".join(MPI_RESERVED_ENV),
    )
    p.add_argument(
        "--runs-pvc",
        default="",
        metavar="CLAIM",
        help="PersistentVolumeClaim for runs/ (logs, checkpoints); without one, runs stay in rank 0's pod",
    )
    p.add_argument(
        "--runs-pvc-size",
        default="",
        metavar="SIZE",
        help="also create that claim (ReadWriteMany) with this size, e.g. 10Gi",
    )
    p.add_argument("--storage-class", default="", help="storage class of the created claim (default: the cluster's)")
    p.add_argument(
        "--data-pvc",
        default="",
        metavar="CLAIM",
        help="PersistentVolumeClaim holding the dataset, mounted read-only at --data-dir in every pod that "
        "runs ranks; the trainer gets --data-dir",
    )
    p.add_argument("--data-dir", default=d.data_dir, help=f"where --data-pvc is mounted (default: {d.data_dir})")
    p.add_argument(
        "--tensorboard",
        action="store_true",
        help="add a TensorBoard Deployment and ClusterIP Service reading the runs volume",
    )
    p.add_argument(
        "--grace-period",
        type=int,
        default=d.grace_seconds,
        metavar="SECONDS",
        help="terminationGracePeriodSeconds of this job's pods (a TrainJob's runtimePatches): time for one "
        f"step + a checkpoint after SIGTERM (default: {d.grace_seconds})",
    )
    p.add_argument(
        "--backoff-limit",
        type=int,
        default=d.backoff_limit,
        help="launcher restarts after a failure before the job fails; a TrainJob's preemptions (exit 75, "
        "eviction) do not count, an MPIJob's do; a TrainJob's is its runtime's, shared by every job "
        f"naming it (default: {d.backoff_limit})",
    )
    p.add_argument(
        "--clean-pod-policy", default=d.clean_pod_policy, help="MPIJob: None, Running or All (default: Running)"
    )
    p.add_argument(
        "--ttl-after-finished",
        type=int,
        default=d.ttl_seconds,
        metavar="SECONDS",
        help="MPIJob: runPolicy.ttlSecondsAfterFinished, the job and its pods (and the launcher's log) are "
        f"deleted this long after it finished (default: {d.ttl_seconds}, a day)",
    )
    p.add_argument(
        "--no-resume", action="store_true", help="do not add `--name NAME --resume auto` to the trainer arguments"
    )
    p.add_argument("-o", "--output", default="", help="write the manifest to this file instead of stdout")
    p.add_argument("trainer_args", nargs=argparse.REMAINDER, help="arguments for the trainer, after --")
    return p


def _pairs(items: list[str], flag: str, example: str) -> dict[str, str]:
    out = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep:
            raise ValueError(f"{flag} {item!r}: write {example}")
        out[name] = value
    return out


def spec_from_args(args: argparse.Namespace) -> K8sSpec:
    affinity = {}
    if args.affinity:
        try:
            affinity = json.loads(args.affinity)
        except json.JSONDecodeError as e:
            raise ValueError(f"--affinity: not JSON ({e.msg} at character {e.pos})") from None
        if not isinstance(affinity, dict):
            raise ValueError("--affinity: give a JSON object (a Kubernetes Affinity)")
    trainer = args.trainer_args[1:] if args.trainer_args[:1] == ["--"] else args.trainer_args
    return K8sSpec(
        api=args.api,
        name=args.name,
        namespace=args.namespace,
        runtime=args.runtime,
        image=args.image,
        image_pull_policy=args.image_pull_policy,
        image_pull_secrets=args.image_pull_secret,
        workers=args.workers,
        slots_per_worker=max(args.gpus, 1) if args.slots_per_worker is None else args.slots_per_worker,
        cpu=args.cpu,
        memory=args.memory,
        gpus=args.gpus,
        node_selector=_pairs(args.node_selector, "--node-selector", "LABEL=VALUE"),
        tolerations=[parse_toleration(t) for t in args.toleration],
        affinity=affinity,
        mca=[tuple(kv) for kv in args.mca],
        mpi_allreduce=args.mpi_allreduce,
        env=_pairs(args.env, "--env", "NAME=VALUE"),
        trainer_args=trainer,
        resume=not args.no_resume,
        runs_pvc=args.runs_pvc,
        runs_pvc_size=args.runs_pvc_size,
        storage_class=args.storage_class,
        data_pvc=args.data_pvc,
        data_dir=args.data_dir,
        tensorboard=args.tensorboard,
        grace_seconds=args.grace_period,
        backoff_limit=args.backoff_limit,
        clean_pod_policy=args.clean_pod_policy,
        ttl_seconds=args.ttl_after_finished,
    )


def render(spec: K8sSpec, argv: list[str]) -> str:
    spec.validate()
    header = [
        "Rendered by: python -m launch k8s " + shlex.join(argv),
        f"The launcher runs ({spec.np} ranks: {spec.workers} pods x {spec.slots_per_worker} per pod):",
        "+ " + shlex.join(mpirun_command(spec)),
        "Ranks by host (mpirun -map-by slot; Open MPI maps the launcher's own pod first):",
    ]
    for host, ranks in placement(spec):
        where = " (the launcher: mpirun and ranks)" if host.startswith(f"{spec.name}-launcher-") else ""
        header.append(
            f"  {host}: rank{'s' if len(ranks) > 1 else ''} "
            f"{ranks[0] if len(ranks) == 1 else f'{ranks[0]}-{ranks[-1]}'}{where}"
        )
    return to_yaml(manifests(spec), header)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = make_parser().parse_args(argv)
    try:
        text = render(spec_from_args(args), argv)
    except ValueError as e:
        print(f"launch k8s: error: {e}", file=sys.stderr)
        return 2
    if args.output:
        with open(args.output, "w") as fh:
            fh.write(text)
        print(f"wrote {args.output}", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0
