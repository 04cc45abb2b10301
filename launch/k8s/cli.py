"""``python -m launch k8s``: the parser generated from :class:`K8sSpec`'s fields, the job's objects
in the order to apply them, and the manifest with its header."""

from __future__ import annotations

import argparse
import shlex
import sys

from .. import specflags
from ..exitcodes import EXIT_OK, EXIT_USAGE
from .mpijob import mpijob
from .pods import mpirun_command, placement, runs_claim, tensorboard
from .spec import K8sSpec
from .trainjob import training_runtime, trainjob
from .yaml import to_yaml


def manifests(spec: K8sSpec) -> list[dict]:
    """Every object of the job, in the order to apply them."""
    spec.validate()
    docs = [runs_claim(spec)] if spec.runs_pvc_size else []
    docs += [training_runtime(spec), trainjob(spec)] if spec.api == "trainjob" else [mpijob(spec)]
    if spec.tensorboard:
        docs += tensorboard(spec)
    return docs


def make_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m launch k8s",
        description="Print the Kubernetes objects that run the trainer: a Kubeflow Trainer TrainJob and its "
        "ClusterTrainingRuntime (trainer.kubeflow.org/v1alpha1), or an mpi-operator MPIJob "
        "(kubeflow.org/v2beta1); arguments after `--` go to the trainer. Apply them with "
        "`kubectl apply -f -` (docs/kubernetes.md).",
        epilog="example: python -m launch k8s --name lenet --workers 2 --image REGISTRY/allreduce-train:cpu "
        "--runs-pvc runs --runs-pvc-size 10Gi --tensorboard -- --epochs 2 | kubectl apply -f -",
    )
    specflags.add_flags(p, K8sSpec)
    p.add_argument("-o", "--output", default="", help="write the manifest to this file instead of stdout")
    return p


def spec_from_args(args: argparse.Namespace) -> K8sSpec:
    """The spec of the parsed flags (ValueError names a bad one); ranks per pod default to --gpus."""
    slots = max(args.gpus, 1) if args.slots_per_worker is None else args.slots_per_worker
    return specflags.spec_from_args(K8sSpec, args, slots_per_worker=slots)


def render(spec: K8sSpec, argv: list[str]) -> str:
    docs = manifests(spec)  # validates the spec (ValueError) before the header below reads it
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
    return to_yaml(docs, header)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = make_parser().parse_args(argv)
    try:
        text = render(spec_from_args(args), argv)
    except ValueError as e:
        print(f"launch k8s: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    if args.output:
        with open(args.output, "w") as fh:
            fh.write(text)
        print(f"wrote {args.output}", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return EXIT_OK
