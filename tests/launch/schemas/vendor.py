"""Write a CRD's openAPIV3Schema, descriptions left out, as JSON next to this file.

    git -C TRAINER show v2.3.0:manifests/base/crds/trainer.kubeflow.org_trainjobs.yaml | python vendor.py trainjob
    git -C TRAINER show v2.3.0:manifests/base/crds/trainer.kubeflow.org_clustertrainingruntimes.yaml \
        | python vendor.py clustertrainingruntime
    git -C MPI_OPERATOR show v0.8.0:manifests/base/kubeflow.org_mpijobs.yaml | python vendor.py mpijob

The descriptions are 90 % of each CRD and no part of validation; everything else is kept as released.
"""

import json
import sys
from pathlib import Path

import yaml


def strip(node):
    if isinstance(node, dict):
        return {k: strip(v) for k, v in node.items() if k != "description"}
    if isinstance(node, list):
        return [strip(v) for v in node]
    return node


def main() -> None:
    crd = yaml.safe_load(sys.stdin)
    (version,) = [v for v in crd["spec"]["versions"] if v.get("served", True)]
    schema = {
        "group": crd["spec"]["group"],
        "version": version["name"],
        "kind": crd["spec"]["names"]["kind"],
        "openAPIV3Schema": strip(version["schema"]["openAPIV3Schema"]),
    }
    out = Path(__file__).with_name(f"{sys.argv[1]}.json")
    out.write_text(json.dumps(schema, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
