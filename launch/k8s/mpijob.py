"""An mpi-operator ``MPIJob`` (``kubeflow.org/v2beta1``, ``--api mpijob``): a launcher pod that runs
only mpirun, and ``--workers`` worker pods that run the ranks."""

from __future__ import annotations

from .pods import (
    SHM_MOUNT,
    SHM_VOLUME,
    env_list,
    labels,
    launcher_env,
    metadata,
    mpirun_command,
    pod_security,
    rank_resources,
    rank_volumes,
    scheduling,
    sshd_container,
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
        "env": env_list(launcher_env(spec)),
        "resources": {"requests": {"cpu": "250m", "memory": "256Mi"}, "limits": {"memory": "1Gi"}},
    }
    return {
        "metadata": {"labels": labels(spec, "launcher")},
        "spec": {
            "terminationGracePeriodSeconds": spec.grace_seconds,
            "securityContext": pod_security(),
            **scheduling(spec),
            "containers": [container],
        },
    }


def worker_pod(spec: K8sSpec) -> dict:
    volumes, mounts = rank_volumes(spec)
    container = {
        **sshd_container(spec, "worker", spec.env),
        "resources": rank_resources(spec),
        "volumeMounts": [SHM_MOUNT, *mounts],
    }
    return {
        "metadata": {"labels": labels(spec, "worker")},
        "spec": {
            "terminationGracePeriodSeconds": spec.grace_seconds,
            "securityContext": pod_security(),
            **scheduling(spec),
            "containers": [container],
            "volumes": [SHM_VOLUME, *volumes],
        },
    }


def mpijob(spec: K8sSpec) -> dict:
    return {
        "apiVersion": "kubeflow.org/v2beta1",
        "kind": "MPIJob",
        "metadata": metadata(spec, spec.name, "job"),
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
