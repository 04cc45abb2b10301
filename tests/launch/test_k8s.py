"""Kubernetes: `python -m launch k8s` renders a TrainJob + ClusterTrainingRuntime (Kubeflow Trainer)
or an MPIJob (mpi-operator) that Kubernetes would accept.

There is no cluster here. What is checked: the manifests parse as YAML; every custom resource
passes its CRD's openAPIV3Schema as released (vendored in tests/launch/schemas/: Kubeflow Trainer
v2.3.0, mpi-operator v0.8.0), with a field the schema does not name counted as an error (as
`kubectl apply --validate=strict` would), plus what the operators' webhooks refuse; every pod
template, Job spec, Deployment, Service and claim survives a round trip through the `kubernetes`
client's models (unknown or misspelt fields, wrong types and missing required fields fail); the
launcher runs the same mpirun line as `python -m launch`; the entrypoints turn SIGTERM into the
trainer's SIGUSR1 for real processes.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import jsonschema
import pytest
import yaml
from kubernetes.client import models
from pydantic import ValidationError

from launch import LaunchSpec, build_command, k8s
from launch.mpirun import RING_RULES

ROOT = Path(__file__).resolve().parents[2]
SCHEMAS = Path(__file__).with_name("schemas")


def render(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "launch", "k8s", *argv], cwd=ROOT, capture_output=True, text=True, timeout=60
    )


def rendered(*argv: str) -> list[dict]:
    out = render(*argv)
    assert out.returncode == 0, out.stderr
    return docs_of(out.stdout)


def docs_of(text: str) -> list[dict]:
    return [d for d in yaml.safe_load_all(text) if d is not None]


def by_kind(docs: list[dict], kind: str) -> dict:
    (doc,) = [d for d in docs if d["kind"] == kind]
    return doc


def launcher_container(job: dict) -> dict:
    if job["kind"] == "TrainJob":
        return job["spec"]["trainer"]  # what Trainer puts into the launcher's "node" container
    return job["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"][0]


# -- the CRDs' schemas -------------------------------------------------------------------------


def crd_schema(name: str) -> dict:
    return json.loads((SCHEMAS / f"{name}.json").read_text())


def unknown_fields(obj, schema: dict, path: str = "") -> list[str]:
    """Fields of ``obj`` that ``schema`` (a structural OpenAPI v3 schema) does not name. The API
    server drops them silently (or refuses them with --validate=strict): either way a typo."""
    if schema.get("x-kubernetes-preserve-unknown-fields") or not isinstance(obj, (dict, list)):
        return []
    if isinstance(obj, list):
        items = schema.get("items", {})
        return [e for i, item in enumerate(obj) for e in unknown_fields(item, items, f"{path}[{i}]")]
    props, extra = schema.get("properties"), schema.get("additionalProperties")
    out = []
    for key, value in obj.items():
        if props is not None and key in props:
            out += unknown_fields(value, props[key], f"{path}.{key}")
        elif isinstance(extra, dict):
            out += unknown_fields(value, extra, f"{path}.{key}")
        elif extra is not True:
            out.append(f"{path}.{key}")
    return out


def check_crd(obj: dict, name: str) -> None:
    """``obj`` is valid for the vendored CRD ``name``: types, enums, patterns, bounds, required
    fields (jsonschema) and no field the schema lacks."""
    crd = crd_schema(name)
    assert obj["apiVersion"] == f"{crd['group']}/{crd['version']}" and obj["kind"] == crd["kind"]
    errors = [
        f"{'.'.join(map(str, e.absolute_path))}: {e.message}"
        for e in jsonschema.Draft7Validator(crd["openAPIV3Schema"]).iter_errors(obj)
    ]
    assert not errors, errors
    # the root's metadata is the API server's (the CRDs say only "object"): the client's model checks it
    assert unknown_fields({k: v for k, v in obj.items() if k != "metadata"}, crd["openAPIV3Schema"]) == []
    check_model(obj["metadata"], "V1ObjectMeta")


@pytest.mark.heavy
def test_the_schema_check_catches_unknown_fields_wrong_types_and_enums():
    job = by_kind(rendered("--api", "mpijob"), "MPIJob")
    check_crd(job, "mpijob")
    misspelt = json.loads(json.dumps(job))
    misspelt["spec"]["slotPerWorker"] = 1
    with pytest.raises(AssertionError, match=r"\.spec\.slotPerWorker"):
        check_crd(misspelt, "mpijob")
    deep = json.loads(json.dumps(job))
    deep["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]["readinesProbe"] = {}
    with pytest.raises(AssertionError, match="readinesProbe"):
        check_crd(deep, "mpijob")
    wrong = json.loads(json.dumps(job))
    wrong["spec"]["runPolicy"]["backoffLimit"] = "3"
    with pytest.raises(AssertionError, match="backoffLimit: '3' is not of type 'integer'"):
        check_crd(wrong, "mpijob")
    runtime, train = rendered("--api", "trainjob")
    train["spec"]["trainer"]["numNodes"] = "2"
    with pytest.raises(AssertionError, match="numNodes"):
        check_crd(train, "trainjob")
    runtime["spec"]["mlPolicy"]["mpi"]["mpiImplementation"] = "MPICH"
    with pytest.raises(AssertionError, match="MPICH"):
        check_crd(runtime, "clustertrainingruntime")


# -- mpi-operator's MPIJob v2beta1 -------------------------------------------------------------


def check_mpijob(job: dict) -> None:
    """The CRD's schema, then what mpi-operator's validation (pkg/apis/kubeflow/validation) adds."""
    check_crd(job, "mpijob")
    spec = job["spec"]
    assert spec["mpiImplementation"] == "OpenMPI" and spec["sshAuthMountPath"] == k8s.SSH_DIR
    assert spec["runPolicy"]["cleanPodPolicy"] in ("None", "Running", "All")
    replicas = spec["mpiReplicaSpecs"]
    assert set(replicas) == {"Launcher", "Worker"}
    for rs in replicas.values():
        assert rs["restartPolicy"] in ("Never", "OnFailure")  # what validation.go accepts
        check_model(rs["template"], "V1PodTemplateSpec")
    assert replicas["Launcher"]["replicas"] == 1
    last = f"{job['metadata']['name']}-worker-{replicas['Worker']['replicas'] - 1}"
    assert k8s.DNS_LABEL.match(last) and len(last) <= 63  # mpi-operator's name check


# -- Kubeflow Trainer's TrainJob + ClusterTrainingRuntime v1alpha1 -----------------------------

# kubeflow/trainer v2.3.0 pkg/constants/constants.go: MPIReservedEnvNames (OpenMPIEnvHostFileLocation,
# OpenMPIEnvKeyRSHArgs, OpenMPIEnvKeepFQDNHostNames, OpenMPIEnvDefaultSlots), refused in trainer.env by
# pkg/runtime/framework/plugins/mpi/mpi.go Validate
MPI_RESERVED_ENV = {
    "OMPI_MCA_orte_default_hostfile",
    "OMPI_MCA_plm_rsh_args",
    "OMPI_MCA_orte_keep_fqdn_hostnames",
    "OMPI_MCA_orte_set_default_slots",
}


def check_trainjob(runtime: dict, job: dict) -> None:
    """The CRDs' schemas, then what Trainer's webhooks and plugins (v2.3.0: plugins/mpi, plugins/jobset,
    jobset/builder.go) need of an MPI runtime and a job that names it."""
    check_crd(runtime, "clustertrainingruntime")
    check_crd(job, "trainjob")
    assert job["spec"]["runtimeRef"] == {
        "name": runtime["metadata"]["name"],
        "kind": "ClusterTrainingRuntime",
        "apiGroup": "trainer.kubeflow.org",
    }
    mpi = runtime["spec"]["mlPolicy"]["mpi"]
    assert mpi["mpiImplementation"] == "OpenMPI" and mpi["sshAuthMountPath"] == k8s.SSH_DIR
    rjobs = {r["name"]: r for r in runtime["spec"]["template"]["spec"]["replicatedJobs"]}
    # the MPI plugin wants a "launcher" and a "node" Job when the launcher runs as a node of 2+
    assert set(rjobs) == {"launcher", "node"}
    # the TrainJob's trainer (image, command, args) goes to the "node" container of the Job labelled
    # as the trainer's ancestor: the launcher
    assert rjobs["launcher"]["template"]["metadata"]["labels"][k8s.ANCESTOR_LABEL] == "trainer"
    for rjob in rjobs.values():
        check_model(rjob["template"]["spec"], "V1JobSpec")
        pod = rjob["template"]["spec"]["template"]["spec"]
        assert [c["name"] for c in pod["containers"]] == ["node"]
        assert pod["restartPolicy"] == "Never"  # podFailurePolicy needs it
    assert not {e["name"] for e in job["spec"]["trainer"].get("env", [])} & MPI_RESERVED_ENV
    # runtimePatches: only containers the runtime's Job has, and no env for "node" containers
    for patch in job["spec"].get("runtimePatches", []):
        for rjob in patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]:
            pod = rjob["template"]["spec"]["template"].get("spec", {})
            runtime_containers = {
                c["name"] for c in rjobs[rjob["name"]]["template"]["spec"]["template"]["spec"]["containers"]
            }
            assert {c["name"] for c in pod.get("containers", [])} <= runtime_containers
            assert all("env" not in c for c in pod.get("containers", []))
            check_model({"spec": {"containers": [{"name": "x"}], **pod}}, "V1PodTemplateSpec")
    for name in k8s.K8sSpec(name=job["metadata"]["name"], workers=job["spec"]["trainer"]["numNodes"]).pod_names():
        assert k8s.DNS_LABEL.match(name) and len(name) <= 63


def check_model(obj: dict, model: str) -> None:
    """``obj`` is valid for the kubernetes client's (pydantic) model ``model`` and written back
    unchanged: an unknown or misspelt field, a missing required one or a wrong type raises."""
    parsed = getattr(models, model).model_validate(obj)
    assert parsed.model_dump(by_alias=True, exclude_none=True) == obj


def test_the_model_check_catches_unknown_fields_and_missing_names():
    pod = {"spec": {"containers": [{"name": "a", "image": "i"}]}}
    check_model(pod, "V1PodTemplateSpec")
    with pytest.raises(ValidationError, match="comand"):
        check_model({"spec": {"containers": [{"name": "a", "image": "i", "comand": ["x"]}]}}, "V1PodTemplateSpec")
    with pytest.raises(ValidationError, match="name"):
        check_model({"spec": {"containers": [{"image": "i"}]}}, "V1PodTemplateSpec")
    with pytest.raises(ValidationError, match="containerPort"):
        check_model({"spec": {"containers": [{"name": "a", "ports": [{"containerPort": "22"}]}]}}, "V1PodTemplateSpec")


# -- what the operators make of the manifests (their Go code, as read) --------------------------


def trainer_pods(runtime: dict, job: dict) -> list[dict]:
    """The pods Kubeflow Trainer v2.3.0 starts for ``job`` on its MPI ``runtime``, in the runtime's
    order of replicated Jobs, each as {"name", "dns", "resources": gets resourcesPerNode, "node":
    listed in the hostfile}. The rules, each from the file it is read in:
    - pkg/runtime/framework/plugins/mpi/mpi.go EnforceMLPolicy: the "node" Job runs
      max(numNodes-1, 1) pods with runLauncherAsNode, else numNodes;
    - pkg/runtime/core/trainingruntime.go: the trainer's ancestor Job (the launcher) runs the
      runtime's mlPolicy.numNodes pods and gets resourcesPerNode; with runLauncherAsNode the "node"
      Job gets them too (plugins/jobset/builder.go Trainer sets the ancestor's replicas to 1);
    - pkg/runtime/framework/plugins/jobset/jobset.go IdentifyPodNetwork: a pod's name is
      <trainjob>-<replicated job>-<job index>-<pod index>, its DNS name that .<subdomain> (the
      TrainJob's name unless the runtime's network names one);
    - pkg/runtime/framework/plugins/mpi/mpi.go isNode: the launcher (with runLauncherAsNode) and
      the "node" Job's pods are the hostfile's hosts."""
    spec = runtime["spec"]
    as_node = spec["mlPolicy"]["mpi"].get("runLauncherAsNode", False)
    num_nodes = job["spec"]["trainer"].get("numNodes", spec["mlPolicy"].get("numNodes", 1))
    name = job["metadata"]["name"]
    subdomain = spec["template"]["spec"].get("network", {}).get("subdomain", name)
    pods = []
    for rjob in spec["template"]["spec"]["replicatedJobs"]:
        trainer = rjob["template"].get("metadata", {}).get("labels", {}).get(k8s.ANCESTOR_LABEL) == "trainer"
        if rjob["name"] == "node":
            count = max(num_nodes - 1, 1) if as_node else num_nodes
        elif trainer:
            count = spec["mlPolicy"].get("numNodes", 1)
        else:
            count = rjob["template"]["spec"].get("parallelism", 1)
        replicas = 1 if trainer else rjob.get("replicas", 1)
        for r in range(replicas):
            for i in range(count):
                pod = f"{name}-{rjob['name']}-{r}-{i}"
                pods.append(
                    {
                        "name": pod,
                        "dns": f"{pod}.{subdomain}",
                        "resources": trainer or (as_node and rjob["name"] == "node"),
                        "node": rjob["name"] == "node" or (as_node and rjob["name"] == "launcher"),
                    }
                )
    return pods


def trainer_hostfile(runtime: dict, job: dict) -> list[str]:
    """Trainer v2.3.0's hostfile (pkg/runtime/framework/plugins/mpi/mpi.go buildHostFileConfigMap):
    each host pod's DNS name in order, slots = numProcPerNode (the TrainJob's, else the runtime's)."""
    slots = job["spec"]["trainer"].get("numProcPerNode", runtime["spec"]["mlPolicy"]["mpi"].get("numProcPerNode", 1))
    return [f"{p['dns']} slots={slots}" for p in trainer_pods(runtime, job) if p["node"]]


def mpi_operator_hostfile(job: dict) -> list[str]:
    """mpi-operator v0.8.0's hostfile (pkg/controller/mpi_job_controller.go newConfigMap): the
    launcher first only with runLauncherAsWorker, then each worker as
    <mpijob>-worker-<i>.<mpijob>.<namespace>.svc, slots = slotsPerWorker."""
    spec, name = job["spec"], job["metadata"]["name"]
    namespace = job["metadata"].get("namespace", "default")
    slots = spec.get("slotsPerWorker", 1)
    hosts = [f"{name}-launcher"] if spec.get("runLauncherAsWorker") else []
    hosts += [f"{name}-worker-{i}" for i in range(spec["mpiReplicaSpecs"]["Worker"]["replicas"])]
    return [f"{h}.{name}.{namespace}.svc slots={slots}" for h in hosts]


def np_of(args: list[str]) -> int:
    return int(args[args.index("-np") + 1])


@pytest.mark.parametrize("workers, slots", [(2, 1), (3, 2), (5, 1)])
def test_trainjob_every_pod_trainer_starts_runs_ranks_in_the_hostfiles_node_first_order(workers, slots):
    runtime, job = rendered("--name", "lm", "--workers", str(workers), "--slots-per-worker", str(slots))
    pods = trainer_pods(runtime, job)
    assert len(pods) == workers and all(p["resources"] and p["node"] for p in pods)  # no idle pod
    hosts = trainer_hostfile(runtime, job)
    spec = k8s.K8sSpec(name="lm", workers=workers, slots_per_worker=slots)
    assert k8s.hostfile(spec) == hosts  # the order the launch module (and the pod check) assumes
    assert hosts[0].startswith("lm-node-0-0.lm ") and hosts[-1] == f"lm-launcher-0-0.lm slots={slots}"
    args = job["spec"]["trainer"]["args"]
    assert np_of(args) == workers * slots and args[args.index("-map-by") + 1] == "slot"
    # -map-by slot from mpirun's own node (Open MPI 4.1 orte/mca/rmaps/base/rmaps_base_support_fns.c
    # orte_rmaps_base_get_target_nodes: the HNP's node first when allocated), then the hostfile's order:
    # rank 0 in the launcher pod although it is listed last (tools/k8s_pod_check.sh LAYOUT=trainjob ran it)
    assert k8s.placement(spec) == [("lm-launcher-0-0.lm", range(0, slots))] + [
        (f"lm-node-0-{i}.lm", range((i + 1) * slots, (i + 2) * slots)) for i in range(workers - 1)
    ]
    assert args[args.index("--expect-hosts") + 1] == str(workers)


def test_trainjob_with_one_worker_is_refused_because_trainer_would_start_an_idle_pod():
    out = render("--workers", "1")
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1
    assert "--workers 1" in out.stderr and "--api mpijob" in out.stderr
    # why: numNodes 1 still gives a node pod beside the launcher, both with resourcesPerNode,
    # and -np = one pod's slots leaves one of them without a rank
    runtime, job = rendered("--workers", "2")
    job["spec"]["trainer"]["numNodes"] = 1
    assert sum(p["resources"] for p in trainer_pods(runtime, job)) == 2
    mpi = by_kind(rendered("--api", "mpijob", "--workers", "1"), "MPIJob")
    assert mpi["spec"]["mpiReplicaSpecs"]["Worker"]["replicas"] == 1


@pytest.mark.parametrize("workers, slots", [(1, 1), (3, 2)])
def test_mpijob_workers_are_the_hostfile_and_the_launcher_runs_only_mpirun(workers, slots):
    job = by_kind(
        rendered(
            "--api",
            "mpijob",
            "--name",
            "lm",
            "--namespace",
            "ml",
            "--workers",
            str(workers),
            "--slots-per-worker",
            str(slots),
        ),
        "MPIJob",
    )
    assert "runLauncherAsWorker" not in job["spec"]
    hosts = mpi_operator_hostfile(job)
    assert (
        k8s.hostfile(k8s.K8sSpec(api="mpijob", name="lm", namespace="ml", workers=workers, slots_per_worker=slots))
        == hosts
    )
    assert len(hosts) == workers and np_of(launcher_container(job)["args"]) == workers * slots
    # the launcher holds no worker's resources: a small request of its own, no GPU
    launcher = job["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"][0]
    worker = job["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]
    assert launcher["resources"]["requests"]["cpu"] == "250m" != worker["resources"]["requests"]["cpu"]


@pytest.mark.parametrize("api", ["trainjob", "mpijob"])
@pytest.mark.parametrize("name", sorted(MPI_RESERVED_ENV))
def test_the_operators_reserved_env_names_are_refused_with_one_line(api, name):
    assert set(k8s.MPI_RESERVED_ENV) == MPI_RESERVED_ENV
    out = render("--api", api, "--env", f"{name}=x")
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2 and out.stdout == "" and len(lines) == 1 and f"--env {name}" in lines[0], out.stderr
    key = name.removeprefix("OMPI_MCA_")
    out = render("--api", api, "--mca", key, "x")
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1 and f"--mca {key}" in out.stderr


def test_per_job_values_are_in_the_trainjob_and_jobs_share_one_runtime():
    # Trainer v2.3.0 pkg/apis/trainer/v1alpha1/trainjob_types.go PodSpecPatch: terminationGracePeriodSeconds
    # is patchable per TrainJob (merged in pkg/runtime/core/trainingruntime.go mergeRuntimePatches)
    short = rendered("--name", "a", "--grace-period", "60", "--", "--epochs", "1")
    long = rendered("--name", "b", "--grace-period", "600", "--", "--model", "resnet18")
    assert short[0] == long[0]  # the same ClusterTrainingRuntime: applying one job does not change the other's
    for (runtime, job), grace in ((short, 60), (long, 600)):
        check_trainjob(runtime, job)
        rjobs = job["spec"]["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]
        patched = {r["name"]: r["template"]["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] for r in rjobs}
        assert patched == {"node": grace, "launcher": grace}
        env = {e["name"]: e["value"] for e in job["spec"]["trainer"]["env"]}
        assert int(env["ALLREDUCE_TRAIN_GRACE_PERIOD"]) < grace  # the launcher's bound ends before the pod's SIGKILL
    assert short[0]["metadata"]["labels"]["trainer.kubeflow.org/framework"] == k8s.FRAMEWORK


def test_mpijob_is_deleted_a_while_after_it_finished():
    job = by_kind(rendered("--api", "mpijob"), "MPIJob")
    assert job["spec"]["runPolicy"]["ttlSecondsAfterFinished"] == 86400
    job = by_kind(rendered("--api", "mpijob", "--ttl-after-finished", "600"), "MPIJob")
    check_mpijob(job)
    assert job["spec"]["runPolicy"]["ttlSecondsAfterFinished"] == 600


# -- python -m launch k8s ----------------------------------------------------------------------

JOB_OPTIONS = [
    "--name",
    "lenet",
    "--workers",
    "3",
    "--slots-per-worker",
    "2",
    "--runs-pvc",
    "runs",
    "--runs-pvc-size",
    "5Gi",
    "--tensorboard",
    "--",
    "--epochs",
    "2",
]


def rank_pods(docs: list[dict]) -> list[dict]:
    """The pod specs that run ranks: an MPIJob's workers; a TrainJob's nodes and launcher, with
    the TrainJob's runtimePatches laid over the runtime's pods (volumes and mounts appended)."""
    if any(d["kind"] == "MPIJob" for d in docs):
        return [by_kind(docs, "MPIJob")["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["spec"]]
    runtime, job = by_kind(docs, "ClusterTrainingRuntime"), by_kind(docs, "TrainJob")
    patches = {
        r["name"]: r["template"]["spec"]["template"].get("spec", {})
        for p in job["spec"].get("runtimePatches", [])
        for r in p["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]
    }
    pods = []
    for rjob in runtime["spec"]["template"]["spec"]["replicatedJobs"]:
        pod = json.loads(json.dumps(rjob["template"]["spec"]["template"]["spec"]))
        patch = patches.get(rjob["name"], {})
        for key, value in patch.items():
            if key == "volumes":
                pod["volumes"] = pod.get("volumes", []) + value
            elif key == "containers":
                for c in value:
                    (target,) = [t for t in pod["containers"] if t["name"] == c["name"]]
                    target["volumeMounts"] = target.get("volumeMounts", []) + c.get("volumeMounts", [])
            else:
                pod[key] = value
        pods.append(pod)
    return pods


def test_rendered_mpijob_parses_and_passes_the_schema_checks():
    docs = rendered("--api", "mpijob", *JOB_OPTIONS)
    assert [d["kind"] for d in docs] == ["PersistentVolumeClaim", "MPIJob", "Deployment", "Service"]
    job = by_kind(docs, "MPIJob")
    check_mpijob(job)
    assert job["spec"]["slotsPerWorker"] == 2 and job["spec"]["mpiReplicaSpecs"]["Worker"]["replicas"] == 3
    check_model(by_kind(docs, "PersistentVolumeClaim"), "V1PersistentVolumeClaim")
    check_model(by_kind(docs, "Deployment"), "V1Deployment")
    check_model(by_kind(docs, "Service"), "V1Service")


def test_rendered_trainjob_passes_trainers_schemas_and_runs_the_mpijobs_ranks():
    docs = rendered("--api", "trainjob", *JOB_OPTIONS)
    assert [d["kind"] for d in docs] == [
        "PersistentVolumeClaim",
        "ClusterTrainingRuntime",
        "TrainJob",
        "Deployment",
        "Service",
    ]
    runtime, job = by_kind(docs, "ClusterTrainingRuntime"), by_kind(docs, "TrainJob")
    check_trainjob(runtime, job)
    trainer = job["spec"]["trainer"]
    assert trainer["numNodes"] == 3 and trainer["numProcPerNode"] == 2
    # the same ranks as the MPIJob's: the same mpirun line, the same resources per pod that runs ranks
    mpi_docs = rendered("--api", "mpijob", *JOB_OPTIONS)
    mpi = by_kind(mpi_docs, "MPIJob")
    assert trainer["args"] == launcher_container(mpi)["args"]
    assert trainer["args"][trainer["args"].index("--expect-hosts") + 1] == "3"  # the 3 pods that run ranks
    assert trainer["resourcesPerNode"] == rank_pods(mpi_docs)[0]["containers"][0]["resources"]
    for pod in rank_pods(docs):  # the launcher is a node too: both write to the runs volume
        assert {"name": "runs", "mountPath": k8s.RUNS_DIR} in pod["containers"][0]["volumeMounts"]
    assert by_kind(docs, "Deployment") == by_kind(mpi_docs, "Deployment")
    # the pods carry the MPIJob's pods' labels (the runtime is shared: the TrainJob patches them in)
    labels = {
        r["name"]: r["template"]["spec"]["template"]["metadata"]["labels"]
        for r in job["spec"]["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]
    }
    for rjob, role in (("launcher", "Launcher"), ("node", "Worker")):
        assert labels[rjob] == mpi["spec"]["mpiReplicaSpecs"][role]["template"]["metadata"]["labels"]


def test_launcher_runs_the_mpirun_line_of_python_m_launch():
    out = render(
        "--workers",
        "2",
        "--slots-per-worker",
        "2",
        "--mca",
        "btl_tcp_if_include",
        "eth0",
        "--env",
        "HOROVOD_CYCLE_TIME=0.25",
        "--",
        "--model",
        "lenet5",
        "--lr",
        "0.1; rm -rf /",
    )
    assert out.returncode == 0, out.stderr
    job = by_kind(docs_of(out.stdout), "TrainJob")
    args = launcher_container(job)["args"]
    # independently: the launcher module's own line for 4 ranks in the image's environment (its checkout)
    image_rules = f"{k8s.APP_DIR}/launch/{RING_RULES.name}"
    trainer_args = [
        "--name",
        "allreduce-train",
        "--resume",
        "auto",
        "--expect-hosts",
        "2",
        "--model",
        "lenet5",
        "--lr",
        "0.1; rm -rf /",
    ]
    expected = build_command(
        LaunchSpec(
            np=4,
            mca=[("btl_tcp_if_include", "eth0")],
            python=k8s.PYTHON,
            mpi_allreduce="ring",
            app_dir=k8s.APP_DIR,
            trainer_args=trainer_args,
        ),
        environ={"PATH": "/usr/bin", "HWLOC_COMPONENTS": "-gl", "HOROVOD_CYCLE_TIME": "0.25"},
        is_root=False,
    )
    assert args == expected
    assert "--allow-run-as-root" not in args  # the image's user is mpiuser
    # the line printed at the top of the manifest is the one in it
    assert "# + " + shlex.join(args) in out.stdout.splitlines()
    # and the CLI's dry run prints the same flags for the same ranks
    env = {"PATH": os.environ["PATH"], "HWLOC_COMPONENTS": "-gl", "HOROVOD_CYCLE_TIME": "0.25"}
    dry = subprocess.run(
        [
            sys.executable,
            "-m",
            "launch",
            "-np",
            "4",
            "--mca",
            "btl_tcp_if_include",
            "eth0",
            "--mpi-allreduce",
            "ring",
            "--dry-run",
            "--",
            *trainer_args,
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )  # cwd puts launch on sys.path
    line = shlex.split(dry.stdout.strip().splitlines()[-1][2:])
    # less what only this machine's run adds: root, and more ranks than its cores (the pods' hostfile has the slots)
    line = [
        {sys.executable: k8s.PYTHON, str(RING_RULES): image_rules}.get(a, a)
        for a in line
        if a not in ("--allow-run-as-root", "--oversubscribe")
    ]
    assert line == args
    auto = render("--mpi-allreduce", "auto", "--", "--model", "lenet5")
    assert auto.returncode == 0 and "coll_tuned" not in auto.stdout, auto.stderr
    # the variables mpirun forwards with -x are set in the launcher container
    names = {e["name"] for e in launcher_container(job)["env"]}
    assert {args[i + 1] for i, a in enumerate(args) if a == "-x"} - {"PATH"} <= names


def test_output_file_holds_what_stdout_would(tmp_path):
    argv = ["--workers", "3", "--", "--epochs", "1"]
    printed = render(*argv).stdout
    out = render("-o", str(tmp_path / "job.yaml"), *argv)
    assert out.returncode == 0 and out.stdout == ""
    assert (tmp_path / "job.yaml").read_text() == printed.replace(
        "--workers 3", f"-o {tmp_path / 'job.yaml'} --workers 3", 1
    )


def test_gpus_set_the_resource_and_one_rank_per_gpu():
    for api in ("mpijob", "trainjob"):
        docs = rendered("--api", api, "--workers", "2", "--gpus", "4", "--image", "r.example/allreduce-train:gpu")
        if api == "mpijob":
            job = by_kind(docs, "MPIJob")
            check_mpijob(job)
            assert job["spec"]["slotsPerWorker"] == 4
        else:
            job = by_kind(docs, "TrainJob")
            check_trainjob(by_kind(docs, "ClusterTrainingRuntime"), job)
            assert job["spec"]["trainer"]["numProcPerNode"] == 4
            assert job["spec"]["trainer"]["resourcesPerNode"]["limits"][k8s.GPU_RESOURCE] == "4"
        for pod in rank_pods(docs)[:1] if api == "mpijob" else []:
            assert pod["containers"][0]["resources"]["limits"][k8s.GPU_RESOURCE] == "4"
        args = launcher_container(job)["args"]
        assert args[args.index("-np") + 1] == "8"


def test_mpijob_preemption_grace_period_and_restart_are_wired():
    job = by_kind(
        rendered("--api", "mpijob", "--grace-period", "300", "--backoff-limit", "5", "--", "--epochs", "1"), "MPIJob"
    )
    for role in ("Launcher", "Worker"):
        rs = job["spec"]["mpiReplicaSpecs"][role]
        assert rs["template"]["spec"]["terminationGracePeriodSeconds"] == 300
        assert rs["restartPolicy"] == "OnFailure"
    assert job["spec"]["runPolicy"]["backoffLimit"] == 5
    launcher = launcher_container(job)
    assert launcher["command"] == [f"{k8s.APP_DIR}/deploy/launcher-entrypoint.sh"]
    assert launcher["args"][-6:] == ["--resume", "auto", "--expect-hosts", "2", "--epochs", "1"]
    for script in ("launcher-entrypoint.sh", "worker-entrypoint.sh"):
        assert os.access(ROOT / "deploy" / script, os.X_OK)


def test_trainjob_replaces_preempted_pods_without_counting_them_and_stops_on_bad_input():
    runtime, job = rendered("--grace-period", "300", "--backoff-limit", "5", "--", "--epochs", "1")
    check_trainjob(runtime, job)
    rjobs = {r["name"]: r["template"]["spec"] for r in runtime["spec"]["template"]["spec"]["replicatedJobs"]}
    grace = {
        r["name"]: r["template"]["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
        for r in job["spec"]["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]
    }
    assert grace == {"node": 300, "launcher": 300}  # the job's own, in its runtimePatches
    for name, spec in rjobs.items():
        assert spec["backoffLimit"] == 5 and "terminationGracePeriodSeconds" not in spec["template"]["spec"]
        rules = spec["podFailurePolicy"]["rules"]
        # exit 75 (the trainer after SIGUSR1; a worker entrypoint after SIGTERM) and an eviction: a new pod,
        # not a failure
        assert {"action": "Ignore", "onExitCodes": {"containerName": "node", "operator": "In", "values": [75]}} in rules
        assert {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]} in rules
        fail_job = [r for r in rules if r["action"] == "FailJob"]
        # the launcher carries mpirun's exit code: usage errors and divergence end the job at once
        assert fail_job == (
            [{"action": "FailJob", "onExitCodes": {"containerName": "node", "operator": "In", "values": [2, 65]}}]
            if name == "launcher"
            else []
        )
    (command,) = [c["command"] for c in rjobs["node"]["template"]["spec"]["containers"]]
    assert command == [f"{k8s.APP_DIR}/deploy/worker-entrypoint.sh"]
    assert job["spec"]["trainer"]["command"] == [f"{k8s.APP_DIR}/deploy/launcher-entrypoint.sh"]
    assert job["spec"]["trainer"]["args"][-6:] == ["--resume", "auto", "--expect-hosts", "2", "--epochs", "1"]


CLUSTER_OPTIONS = [
    "--image-pull-secret",
    "regcred",
    "--node-selector",
    "nvidia.com/gpu.present=true",
    "--toleration",
    "nvidia.com/gpu:NoSchedule",
    "--toleration",
    "dedicated=ml",
    "--affinity",
    json.dumps(
        {
            "podAntiAffinity": {
                "preferredDuringSchedulingIgnoredDuringExecution": [
                    {
                        "weight": 100,
                        "podAffinityTerm": {
                            "topologyKey": "kubernetes.io/hostname",
                            "labelSelector": {"matchLabels": {k8s.LABEL_INSTANCE: "lm"}},
                        },
                    }
                ]
            }
        }
    ),
    "--data-pvc",
    "ptb",
    "--data-dir",
    "/datasets/ptb",
    "--runs-pvc",
    "runs",
    "--tensorboard",
    "--name",
    "lm",
    "--",
    "--model",
    "ptb-lstm-small",
    "--dataset",
    "ptb",
]


@pytest.mark.parametrize("api", ["trainjob", "mpijob"])
def test_cluster_options_reach_every_pod_and_the_data_volume_is_read_only_at_data_dir(api):
    docs = rendered("--api", api, *CLUSTER_OPTIONS)
    if api == "mpijob":
        job = by_kind(docs, "MPIJob")
        check_mpijob(job)
        pods = [rs["template"]["spec"] for rs in job["spec"]["mpiReplicaSpecs"].values()]
    else:
        job = by_kind(docs, "TrainJob")
        check_trainjob(by_kind(docs, "ClusterTrainingRuntime"), job)
        pods = rank_pods(docs)
    pods.append(by_kind(docs, "Deployment")["spec"]["template"]["spec"])
    for pod in pods:
        assert pod["imagePullSecrets"] == [{"name": "regcred"}]
        assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
        assert pod["tolerations"] == [
            {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
            {"key": "dedicated", "operator": "Equal", "value": "ml"},
        ]
        assert pod["affinity"]["podAntiAffinity"]
        check_model({"spec": pod}, "V1PodTemplateSpec")
    for pod in rank_pods(docs):
        assert {"name": "data", "persistentVolumeClaim": {"claimName": "ptb", "readOnly": True}} in pod["volumes"]
        assert {"name": "data", "mountPath": "/datasets/ptb", "readOnly": True} in pod["containers"][0]["volumeMounts"]
    args = launcher_container(job)["args"]
    assert args[args.index("--data-dir") + 1] == "/datasets/ptb"
    assert args.index("--data-dir") < args.index("--dataset")  # the user's own arguments come last and win


def test_tensorboard_listens_on_the_pod_and_the_service_stays_in_the_cluster():
    docs = rendered("--runs-pvc", "runs", "--tensorboard")
    deployment, service = by_kind(docs, "Deployment"), by_kind(docs, "Service")
    cmd = deployment["spec"]["template"]["spec"]["containers"][0]["command"]
    assert cmd[cmd.index("--host") + 1] == "0.0.0.0" and cmd[cmd.index("--logdir") + 1] == k8s.RUNS_DIR
    assert service["spec"]["type"] == "ClusterIP"
    assert service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]
    assert deployment["spec"]["template"]["metadata"]["labels"] == service["spec"]["selector"]
    mount = deployment["spec"]["template"]["spec"]["containers"][0]["volumeMounts"][0]
    assert mount["readOnly"] and mount["mountPath"] == k8s.RUNS_DIR


@pytest.mark.parametrize(
    "argv, names",
    [
        (["--workers", "0"], "--workers"),
        (["--slots-per-worker", "0"], "--slots-per-worker"),
        (["--name", "Big_Name"], "--name"),
        (["--name", "x" * 52, "--workers", "10"], "--name"),
        (["--api", "mpijob", "--name", "x" * 60, "--workers", "10"], "--name"),
        (["--tensorboard"], "--runs-pvc"),
        (["--memory", "4GB"], "--memory"),
        (["--env", "NOVALUE"], "--env"),
        (["--clean-pod-policy", "Sometimes"], "--clean-pod-policy"),
        (["--runs-pvc-size", "1Gi"], "--runs-pvc"),
        (["--toleration", "gpu:Sometimes"], "--toleration"),
        (["--node-selector", "gpu"], "--node-selector"),
        (["--affinity", "{nodeAffinity"], "--affinity"),
        (["--data-pvc", "ptb", "--data-dir", "data"], "--data-dir"),
        (["--image-pull-secret", "Reg_Cred"], "--image-pull-secret"),
        (["--api", "mpijob", "--ttl-after-finished", "-1"], "--ttl-after-finished"),
    ],
)
def test_bad_options_give_one_line_naming_the_flag(argv, names):
    out = render(*argv)
    assert out.returncode == 2 and out.stdout == ""
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("launch k8s: error:") and names in lines[0], out.stderr


def test_yaml_writer_round_trips_awkward_strings():
    values = [
        "-np",
        "--x",
        "^openib",
        "0.25",
        "1e3",
        "yes",
        "No",
        "null",
        "~",
        "",
        "a: b",
        "a:",
        "x:y",
        "#c",
        "- x",
        "'q'",
        '"d"',
        "@x",
        "%x",
        "*x",
        "&x",
        "!x",
        "{a}",
        "[a]",
        "12:30",
        "0x1F",
        "0o7",
        ".inf",
        "tab\tx",
        "new\nline",
        "ünï",
        "/opt/a",
        "a.b/c",
        "-",
        "--",
    ]
    doc = {"k": values, "n": {"i": 3, "b": True, "e": {}, "l": [], "s": [{"a": "1", "b": ["x", {"c": "-gl"}]}]}}
    assert yaml.safe_load(k8s.to_yaml([doc])) == doc


def test_image_recipe_matches_what_the_manifests_assume():
    dockerfile = (ROOT / "deploy" / "Dockerfile").read_text()
    assert f"WORKDIR {k8s.APP_DIR}\n" in dockerfile
    assert f"useradd -m -u {k8s.USER_ID} mpiuser" in dockerfile and f"USER {k8s.USER_ID}\n" in dockerfile
    assert f"{k8s.APP_DIR}/.venv/bin" in dockerfile.split("ENV PATH=")[1].splitlines()[0]
    sshd = (ROOT / "deploy" / "sshd_config").read_text()
    assert f"Port {k8s.SSH_PORT}\n" in sshd and f"HostKey {k8s.SSH_DIR}/id_rsa\n" in sshd
    assert f"\\1{k8s.SSH_PORT}/g" in dockerfile  # the ssh client's port, for mpirun's ssh to the workers
    for src in ("deploy/sshd_config", "tools/install.sh", "tools/install_gpu.sh"):
        assert (ROOT / src).is_file(), src
    # neither image carries the lab's Chromium or Slurm daemons; the CPU image has CPU torch
    assert "LAB=0 TORCH_VARIANT=cpu bash tools/install.sh" in dockerfile
    assert "GPU_VENV=.venv bash tools/install_gpu.sh" in dockerfile
    # BuildKit reads the ignore file beside the Dockerfile; without it the build stops on the first RUN
    ignored = (ROOT / "deploy" / "Dockerfile.dockerignore").read_text().split()
    assert {".git", ".venv", "runs"} <= set(ignored)
    assert "if [ -e .venv ] || [ -e .git ]; then" in dockerfile
    job = by_kind(rendered("--api", "mpijob"), "MPIJob")
    commands = [rs["template"]["spec"]["containers"][0]["command"] for rs in job["spec"]["mpiReplicaSpecs"].values()]
    runtime, train = rendered("--api", "trainjob")
    commands += [
        r["template"]["spec"]["template"]["spec"]["containers"][0]["command"]
        for r in runtime["spec"]["template"]["spec"]["replicatedJobs"]
    ] + [train["spec"]["trainer"]["command"]]
    for (command,) in commands:
        assert command.startswith(k8s.APP_DIR + "/") and os.access(ROOT / command[len(k8s.APP_DIR) + 1 :], os.X_OK)


# -- the entrypoints, for real ------------------------------------------------------------------

RANK = """
import signal, sys, time
def stop(sig, frame):
    open(sys.argv[1], "w").write(signal.Signals(sig).name)
    sys.exit(75)
signal.signal(signal.SIGUSR1, stop)
open(sys.argv[1] + ".ready", "w").close()
time.sleep(60)
"""


def wait_for(path: Path, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.05)


def test_launcher_entrypoint_turns_sigterm_into_sigusr1_and_passes_the_exit_code(tmp_path):
    mark = tmp_path / "rank"
    proc = subprocess.Popen([str(ROOT / "deploy" / "launcher-entrypoint.sh"), sys.executable, "-c", RANK, str(mark)])
    try:
        wait_for(Path(f"{mark}.ready"))
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 75
        assert mark.read_text() == "SIGUSR1"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


DEAF_RANK = """
import signal, sys, time
signal.signal(signal.SIGUSR1, signal.SIG_IGN)  # a rank that cannot answer the stop (frozen, cut off)
open(sys.argv[1] + ".ready", "w").close()
time.sleep(600)
"""


@pytest.mark.heavy
def test_launcher_entrypoint_ends_a_job_that_cannot_answer_the_stop_within_its_grace_period(tmp_path):
    mark = tmp_path / "rank"
    proc = subprocess.Popen(
        [str(ROOT / "deploy" / "launcher-entrypoint.sh"), sys.executable, "-c", DEAF_RANK, str(mark)],
        env={**os.environ, "ALLREDUCE_TRAIN_GRACE_PERIOD": "2"},
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for(Path(f"{mark}.ready"))
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 128 + signal.SIGTERM  # killed after 2 s, before the pod's SIGKILL
        assert proc.stderr is not None and "no checkpoint was written" in proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


# A stand-in for sshd: starts one "rank" (a process whose command line holds -m allreduce_train, as
# orted's children do) and waits, as sshd -D would, until it is told to stop.
FAKE_SSHD = """
import signal, subprocess, sys
rank = subprocess.Popen([sys.executable, "-c", sys.argv[1], sys.argv[2], "-m", "allreduce_train", "train"])
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
rank.wait()
signal.pause()
"""


def test_worker_entrypoint_asks_its_ranks_to_checkpoint_before_sshd_stops(tmp_path):
    sshd = tmp_path / "sshd"
    sshd.write_text(
        f"#!/bin/sh\nexec {shlex.quote(sys.executable)} -c {shlex.quote(FAKE_SSHD)} "
        f"{shlex.quote(RANK)} {shlex.quote(str(tmp_path / 'rank'))}\n"
    )
    sshd.chmod(0o755)
    proc = subprocess.Popen([str(ROOT / "deploy" / "worker-entrypoint.sh")], env={**os.environ, "SSHD": str(sshd)})
    try:
        wait_for(tmp_path / "rank.ready")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 75  # preempted: a Job replaces the pod (a 0 would mark its work done)
        assert (tmp_path / "rank").read_text() == "SIGUSR1"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.heavy
def test_launcher_entrypoint_waits_for_the_hostfiles_names_and_gives_up_with_one_line(tmp_path):
    # mpi-operator v0.8.0 build/base/entrypoint.sh resolves every hostfile name before mpirun: ssh's
    # ConnectionAttempts (the operators' OMPI_MCA_plm_rsh_args) does not retry a failed lookup
    hostfile = tmp_path / "hostfile"
    mark = tmp_path / "ran"
    cmd = [str(ROOT / "deploy" / "launcher-entrypoint.sh"), "touch", str(mark)]
    env = {**os.environ, "OMPI_MCA_orte_default_hostfile": str(hostfile), "ALLREDUCE_TRAIN_RESOLVE_TIMEOUT": "2"}
    hostfile.write_text("localhost slots=2\nnode-0.no-such-job.invalid slots=2\n")
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 69 and not mark.exists()
    (line,) = out.stderr.strip().splitlines()
    assert "node-0.no-such-job.invalid" in line and "2 s" in line
    hostfile.write_text("localhost slots=2\n")
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and mark.exists(), out.stderr


@pytest.mark.parametrize("layout", ["trainjob", "mpijob"])
def test_pod_check_names_the_pods_as_the_operator_and_resolves_each_name_to_its_pod(layout, tmp_path):
    # tools/k8s_pod_check.sh plays these files: the operator's hostfile with DNS names, and /etc/hosts
    subprocess.run(
        [sys.executable, "tools/k8s_pod_job.py", str(tmp_path), layout, "--epochs", "1"],
        cwd=ROOT,
        check=True,
        timeout=60,
    )
    spec = k8s.K8sSpec(
        api=layout, workers=2 if layout == "trainjob" else 1, slots_per_worker=1 if layout == "trainjob" else 2
    )
    assert (tmp_path / "hostfile").read_text().splitlines() == k8s.hostfile(spec)
    hosts = {
        name: line.split()[0] for line in (tmp_path / "hosts").read_text().splitlines() for name in line.split()[1:]
    }
    launcher, worker = (tmp_path / "pods").read_text().split()
    for line in k8s.hostfile(spec):
        name = line.split()[0]
        assert hosts[name] == hosts[name.split(".")[0]]  # the DNS name and the pod's hostname: one address
    assert hosts[launcher] == "10.250.0.1" and hosts[worker] == "10.250.0.2"
    cmd = (tmp_path / "cmd").read_text().splitlines()
    assert cmd == k8s.mpirun_command(k8s.K8sSpec(**{**spec.__dict__, "trainer_args": cmd[cmd.index("--dataset") :]}))
    env = dict(line.split("=", 1) for line in (tmp_path / "launcher.env").read_text().splitlines())
    assert set(k8s.MPI_RESERVED_ENV) - set(env) == {"OMPI_MCA_orte_default_hostfile"}  # the check adds its path
