"""The pieces every job's pods share: the launcher's line and environment, the hostfile and the
ranks' placement, labels, security, resources, volumes and sshd; the runs claim and TensorBoard."""

from __future__ import annotations

from ..mpirun import TRAINER, LaunchSpec, build_command
from .spec import (
    APP,
    APP_DIR,
    GPU_RESOURCE,
    IMAGE_PATH,
    LABEL_COMPONENT,
    LABEL_INSTANCE,
    LABEL_NAME,
    NODE,
    PYTHON,
    RUNS_DIR,
    SSH_PORT,
    TENSORBOARD_PORT,
    USER_ID,
    K8sSpec,
)


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
        mpi_allreduce=spec.mpi_allreduce,
        app_dir=APP_DIR,
    )
    return build_command(launch, environ={"PATH": IMAGE_PATH, **launcher_env(spec)}, is_root=False)


def labels(spec: K8sSpec, component: str, instance: str = "") -> dict[str, str]:
    return {LABEL_NAME: APP, LABEL_INSTANCE: instance or spec.name, LABEL_COMPONENT: component}


def metadata(spec: K8sSpec, name: str, component: str) -> dict:
    meta: dict = {"name": name}
    if spec.namespace:
        meta["namespace"] = spec.namespace
    meta["labels"] = labels(spec, component)
    return meta


def env_list(env: dict[str, str]) -> list[dict[str, str]]:
    return [{"name": k, "value": v} for k, v in env.items()]


def pod_security() -> dict:
    # fsGroup: the runs volume becomes writable by the image's user
    return {"runAsUser": USER_ID, "runAsGroup": USER_ID, "runAsNonRoot": True, "fsGroup": USER_ID}


def rank_resources(spec: K8sSpec) -> dict:
    """A pod that runs ranks: requests = limits (whole cores; one rank per GPU with --gpus)."""
    resources = {"cpu": spec.cpu, "memory": spec.memory}
    if spec.gpus:
        resources[GPU_RESOURCE] = str(spec.gpus)
    return {"requests": dict(resources), "limits": dict(resources)}


def scheduling(spec: K8sSpec) -> dict:
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


def rank_volumes(spec: K8sSpec) -> tuple[list[dict], list[dict]]:
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


def sshd_container(spec: K8sSpec, name: str, env: dict[str, str]) -> dict:
    """A pod's sshd, through which the launcher's mpirun starts the ranks of that pod."""
    return {
        "name": name,
        "image": spec.image,
        "imagePullPolicy": spec.image_pull_policy,
        "workingDir": APP_DIR,  # where orted starts the ranks: runs/ is the volume
        "command": [f"{APP_DIR}/deploy/worker-entrypoint.sh"],
        "env": env_list({"SSHD_PORT": str(SSH_PORT), **env}),
        "ports": [{"name": "ssh", "containerPort": SSH_PORT}],
        # the launcher starts once every worker's sshd accepts connections
        "readinessProbe": {"tcpSocket": {"port": SSH_PORT}, "periodSeconds": 2},
    }


def runs_claim(spec: K8sSpec) -> dict:
    claim: dict = {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": spec.runs_pvc_size}}}
    if spec.storage_class:
        claim["storageClassName"] = spec.storage_class
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": metadata(spec, spec.runs_pvc, "runs"),
        "spec": claim,
    }


def tensorboard(spec: K8sSpec) -> list[dict]:
    """A TensorBoard Deployment reading the runs volume, and a ClusterIP Service in front of it.

    TensorBoard listens on the pod's interfaces (0.0.0.0), the one deliberate exception to the
    project's loopback rule: a Service can reach nothing else. The Service is ClusterIP only;
    reach it with ``kubectl port-forward``, which binds 127.0.0.1 on your machine.
    """
    name = f"{spec.name}-tensorboard"
    selector = labels(spec, "tensorboard")
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
        "metadata": metadata(spec, name, "tensorboard"),
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": selector},
            "template": {
                "metadata": {"labels": selector},
                "spec": {
                    "securityContext": pod_security(),
                    **scheduling(spec),
                    "containers": [container],
                    "volumes": [{"name": "runs", "persistentVolumeClaim": {"claimName": spec.runs_pvc}}],
                },
            },
        },
    }
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": metadata(spec, name, "tensorboard"),
        "spec": {
            "type": "ClusterIP",
            "selector": selector,
            "ports": [{"name": "http", "port": TENSORBOARD_PORT, "targetPort": "http"}],
        },
    }
    return [deployment, service]
