"""An mpi-operator ``MPIJob`` (``kubeflow.org/v2beta1``, ``--api mpijob``): a launcher pod that runs
only mpirun, and ``--workers`` worker pods that run the ranks."""

from __future__ import annotations

from .pods import (
    SHM_MOUNT,
    SHM_VOLUME,
    _env_list,
    _labels,
    _metadata,
    _placement,
    _pod_security,
    _rank_resources,
    _rank_volumes,
    _sshd_container,
    launcher_env,
    mpirun_command,
)
from .spec import APP_DIR, LAUNCHER_ENTRYPOINT, SSH_DIR, K8sSpec


def launcher_pod(spec: K8sSpec) -> dict:
    container = {
        "name": "launcher",
        "image": spec.image,
        "imagePullPolicy": spec.image_pull_policy,
        "workingDir": APP_DIR,  # mpirun starts the ranks in the same directory: runs/ is the volume
        "command": [LAUNCHER_ENTRYPOINT],
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
