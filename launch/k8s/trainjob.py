"""A Kubeflow Trainer ``TrainJob`` and the ``ClusterTrainingRuntime`` it names
(``trainer.kubeflow.org/v1alpha1``, ``--api trainjob``): the launcher is one of the nodes."""

from __future__ import annotations

from ..exitcodes import EXIT_PREEMPTED, NO_RETRY
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
from .spec import (
    ANCESTOR_LABEL,
    APP,
    APP_DIR,
    FRAMEWORK,
    FRAMEWORK_LABEL,
    LAUNCHER_ENTRYPOINT,
    NODE,
    SSH_DIR,
    TRAINER_API,
    K8sSpec,
)


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
            "securityContext": pod_security(),
            "containers": [{**sshd_container(spec, NODE, {}), "volumeMounts": [SHM_MOUNT]}],
            "volumes": [SHM_VOLUME],
        },
    }
    launcher_pod = {
        "spec": {
            "restartPolicy": "Never",
            "securityContext": pod_security(),
            "containers": [
                {
                    "name": NODE,  # Trainer gives the TrainJob's image, command, args, env, resources to this container
                    "image": spec.image,
                    "imagePullPolicy": spec.image_pull_policy,
                    "workingDir": APP_DIR,  # mpirun starts the ranks in the same directory: runs/ is the volume
                    "command": [LAUNCHER_ENTRYPOINT],
                    "volumeMounts": [SHM_MOUNT],
                }
            ],
            "volumes": [SHM_VOLUME],
        },
    }
    runtime_labels = {**labels(spec, "runtime", instance=spec.runtime), FRAMEWORK_LABEL: FRAMEWORK}
    meta = {"name": spec.runtime, "labels": runtime_labels}
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
    volumes, mounts = rank_volumes(spec)
    # the grace period is the job's: its launcher's bound (ALLREDUCE_TRAIN_GRACE_PERIOD) is derived from it
    pod_patch = {"terminationGracePeriodSeconds": spec.grace_seconds, **scheduling(spec)}
    if volumes:
        pod_patch["volumes"] = volumes
        pod_patch["containers"] = [{"name": NODE, "volumeMounts": mounts}]
    # the job's own pod labels, as an MPIJob's pods have them: `kubectl logs -l` works alike for both
    components = {NODE: "worker", "launcher": "launcher"}
    return {
        "apiVersion": f"{TRAINER_API}/v1alpha1",
        "kind": "TrainJob",
        "metadata": metadata(spec, spec.name, "job"),
        "spec": {
            "runtimeRef": {"name": spec.runtime, "kind": "ClusterTrainingRuntime", "apiGroup": TRAINER_API},
            "trainer": {
                "image": spec.image,
                "command": [LAUNCHER_ENTRYPOINT],
                "args": mpirun_command(spec),
                "env": env_list(launcher_env(spec)),  # the launcher's and the nodes' "node" containers
                "numNodes": spec.workers,
                "numProcPerNode": spec.slots_per_worker,
                "resourcesPerNode": rank_resources(spec),
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
                                                    "metadata": {"labels": labels(spec, component)},
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
