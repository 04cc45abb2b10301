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

from ..exitcodes import EXIT_PREEMPTED, NO_RETRY
from .cli import main, make_parser, manifests, render, spec_from_args
from .mpijob import launcher_pod, mpijob, worker_pod
from .pods import (
    SHM_MOUNT,
    SHM_VOLUME,
    hostfile,
    launcher_env,
    mpirun_command,
    placement,
    rank_args,
    runs_claim,
    tensorboard,
)
from .spec import (  # the constants the image and the operators fix, the spec and its parsers
    ANCESTOR_LABEL,
    APIS,
    APP,
    APP_DIR,
    CLEAN_POD_POLICIES,
    DNS_LABEL,
    ENV_NAME,
    FRAMEWORK,
    FRAMEWORK_LABEL,
    GPU_RESOURCE,
    IMAGE_PATH,
    LABEL_COMPONENT,
    LABEL_INSTANCE,
    LABEL_KEY,
    LABEL_NAME,
    LABEL_VALUE,
    MPI_RESERVED_ENV,
    NODE,
    OMPI_ENV_PREFIX,
    PYTHON,
    QUANTITY,
    RUNS_DIR,
    SSH_DIR,
    SSH_PORT,
    TAINT_EFFECTS,
    TENSORBOARD_PORT,
    TRAINER_API,
    USER_ID,
    K8sSpec,
    pairs,
    parse_affinity,
    parse_toleration,
)
from .trainjob import training_runtime, trainjob
from .yaml import to_yaml

__all__ = [
    "ANCESTOR_LABEL",
    "APIS",
    "APP",
    "APP_DIR",
    "CLEAN_POD_POLICIES",
    "DNS_LABEL",
    "ENV_NAME",
    "EXIT_PREEMPTED",
    "FRAMEWORK",
    "FRAMEWORK_LABEL",
    "GPU_RESOURCE",
    "IMAGE_PATH",
    "LABEL_COMPONENT",
    "LABEL_INSTANCE",
    "LABEL_KEY",
    "LABEL_NAME",
    "LABEL_VALUE",
    "MPI_RESERVED_ENV",
    "NODE",
    "NO_RETRY",
    "OMPI_ENV_PREFIX",
    "PYTHON",
    "QUANTITY",
    "RUNS_DIR",
    "SHM_MOUNT",
    "SHM_VOLUME",
    "SSH_DIR",
    "SSH_PORT",
    "TAINT_EFFECTS",
    "TENSORBOARD_PORT",
    "TRAINER_API",
    "USER_ID",
    "K8sSpec",
    "hostfile",
    "launcher_env",
    "launcher_pod",
    "main",
    "make_parser",
    "manifests",
    "mpijob",
    "mpirun_command",
    "pairs",
    "parse_affinity",
    "parse_toleration",
    "placement",
    "rank_args",
    "render",
    "runs_claim",
    "spec_from_args",
    "tensorboard",
    "to_yaml",
    "training_runtime",
    "trainjob",
    "worker_pod",
]
