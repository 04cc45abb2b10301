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

Like the rest of ``launch``, this package uses the standard library only. Its modules: spec.py (the
options, once: :class:`K8sSpec`, whose fields generate the flags), pods.py (what every job's pods
share), mpijob.py, trainjob.py, yaml.py (the emitter: strings that are not plainly safe are written as
JSON strings, which YAML reads as double-quoted scalars) and cli.py (``python -m launch k8s``).
"""

# What tools/k8s_pod_job.py, the tests and docs/kubernetes.md use; the rest lives in the modules above.
from ..exitcodes import NO_RETRY
from .cli import main, make_parser, spec_from_args
from .pods import hostfile, launcher_env, mpirun_command, placement
from .spec import (  # the constants the image and the operators fix, and the spec
    ANCESTOR_LABEL,
    APP_DIR,
    DNS_LABEL,
    FRAMEWORK,
    GPU_RESOURCE,
    LABEL_INSTANCE,
    MPI_RESERVED_ENV,
    PYTHON,
    RUNS_DIR,
    SSH_DIR,
    SSH_PORT,
    USER_ID,
    K8sSpec,
)
from .yaml import to_yaml

__all__ = [
    "ANCESTOR_LABEL",
    "APP_DIR",
    "DNS_LABEL",
    "FRAMEWORK",
    "GPU_RESOURCE",
    "LABEL_INSTANCE",
    "MPI_RESERVED_ENV",
    "NO_RETRY",
    "PYTHON",
    "RUNS_DIR",
    "SSH_DIR",
    "SSH_PORT",
    "USER_ID",
    "K8sSpec",
    "hostfile",
    "launcher_env",
    "main",
    "make_parser",
    "mpirun_command",
    "placement",
    "spec_from_args",
    "to_yaml",
]
