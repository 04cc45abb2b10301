"""Kubernetes: `python -m launch k8s` and the helm chart render an MPIJob that Kubernetes would accept.

There is no cluster here. What is checked: the manifests parse as YAML; the MPIJob carries what
mpi-operator's v2beta1 CRD and its validation (pkg/apis/kubeflow/validation) require; every pod
template, Deployment, Service and claim survives a round trip through the `kubernetes` client's
models (unknown or misspelt fields, wrong types and missing required fields fail); the launcher
runs the same mpirun line as `python -m launch`; the entrypoints turn SIGTERM into the trainer's
SIGUSR1 for real processes.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from kubernetes.client import models
from pydantic import ValidationError

from launch import LaunchSpec, build_command
from launch.mpirun import RING_RULES
from launch import k8s

from helm_subset import Fail, Renderer, TemplateError, helmify, lex, parse, render_chart

ROOT = Path(__file__).resolve().parents[2]


def render(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "launch", "k8s", *argv], cwd=ROOT, capture_output=True, text=True,
                          timeout=60)


def docs_of(text: str) -> list[dict]:
    return [d for d in yaml.safe_load_all(text) if d is not None]


def by_kind(docs: list[dict], kind: str) -> dict:
    (doc,) = [d for d in docs if d["kind"] == kind]
    return doc


def launcher_container(job: dict) -> dict:
    return job["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"][0]


# -- mpi-operator's MPIJob v2beta1 -------------------------------------------------------------
# From its CRD (manifests/base/kubeflow.org_mpijobs.yaml) and validation.go: the fields spec may
# carry, the enums, and what the operator rejects.
SPEC_FIELDS = {"slotsPerWorker", "runPolicy", "mpiImplementation", "launcherCreationPolicy", "sshAuthMountPath",
               "mpiReplicaSpecs", "runLauncherAsWorker"}
RUN_POLICY_FIELDS = {"cleanPodPolicy", "backoffLimit", "activeDeadlineSeconds", "ttlSecondsAfterFinished",
                     "schedulingPolicy", "suspend", "managedBy"}
REPLICA_FIELDS = {"replicas", "restartPolicy", "template"}


def check_mpijob(job: dict) -> None:
    assert job["apiVersion"] == "kubeflow.org/v2beta1" and job["kind"] == "MPIJob"
    spec = job["spec"]
    assert set(spec) <= SPEC_FIELDS, set(spec) - SPEC_FIELDS
    assert isinstance(spec["slotsPerWorker"], int) and spec["slotsPerWorker"] >= 1
    assert spec["mpiImplementation"] == "OpenMPI"
    assert spec["launcherCreationPolicy"] in ("AtStartup", "WaitForWorkersReady")
    assert spec["sshAuthMountPath"]
    policy = spec["runPolicy"]
    assert set(policy) <= RUN_POLICY_FIELDS, set(policy) - RUN_POLICY_FIELDS
    assert policy["cleanPodPolicy"] in ("None", "Running", "All")
    assert isinstance(policy["backoffLimit"], int) and policy["backoffLimit"] >= 0
    replicas = spec["mpiReplicaSpecs"]
    assert set(replicas) == {"Launcher", "Worker"}
    for role, rs in replicas.items():
        assert set(rs) <= REPLICA_FIELDS, (role, set(rs) - REPLICA_FIELDS)
        assert isinstance(rs["replicas"], int) and rs["replicas"] >= 1
        assert rs["restartPolicy"] in ("Never", "OnFailure")  # what validation.go accepts
        assert rs["template"]["spec"]["containers"]
        check_model(rs["template"], "V1PodTemplateSpec")
    assert replicas["Launcher"]["replicas"] == 1
    last = f"{job['metadata']['name']}-worker-{replicas['Worker']['replicas'] - 1}"
    assert k8s.DNS_LABEL.match(last) and len(last) <= 63  # mpi-operator's name check
    check_model(job["metadata"], "V1ObjectMeta")


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


# -- python -m launch k8s ----------------------------------------------------------------------

def test_rendered_job_parses_and_passes_the_schema_checks():
    out = render("--name", "lenet", "--workers", "3", "--slots-per-worker", "2", "--runs-pvc", "runs",
                 "--runs-pvc-size", "5Gi", "--tensorboard", "--", "--epochs", "2")
    assert out.returncode == 0, out.stderr
    docs = docs_of(out.stdout)
    assert [d["kind"] for d in docs] == ["PersistentVolumeClaim", "MPIJob", "Deployment", "Service"]
    job = by_kind(docs, "MPIJob")
    check_mpijob(job)
    assert job["spec"]["slotsPerWorker"] == 2 and job["spec"]["mpiReplicaSpecs"]["Worker"]["replicas"] == 3
    check_model(by_kind(docs, "PersistentVolumeClaim"), "V1PersistentVolumeClaim")
    check_model(by_kind(docs, "Deployment"), "V1Deployment")
    check_model(by_kind(docs, "Service"), "V1Service")


def test_launcher_runs_the_mpirun_line_of_python_m_launch():
    out = render("--workers", "2", "--slots-per-worker", "2", "--mca", "btl_tcp_if_include", "eth0",
                 "--env", "HOROVOD_CYCLE_TIME=0.25", "--", "--model", "lenet5", "--lr", "0.1; rm -rf /")
    assert out.returncode == 0, out.stderr
    job = by_kind(docs_of(out.stdout), "MPIJob")
    args = launcher_container(job)["args"]
    # independently: the launcher module's own line for 4 ranks in the image's environment (its checkout)
    image_rules = f"{k8s.APP_DIR}/launch/{RING_RULES.name}"
    expected = build_command(
        LaunchSpec(np=4, mca=[("btl_tcp_if_include", "eth0")], python=k8s.PYTHON, allreduce_rules=image_rules,
                   trainer_args=["--name", "allreduce-train", "--resume", "auto", "--model", "lenet5", "--lr", "0.1; rm -rf /"]),
        environ={"PATH": "/usr/bin", "HWLOC_COMPONENTS": "-gl", "HOROVOD_CYCLE_TIME": "0.25"}, is_root=False)
    assert args == expected
    assert "--allow-run-as-root" not in args  # the image's user is mpiuser
    # the line printed at the top of the manifest is the one in it
    assert "# + " + shlex.join(args) in out.stdout.splitlines()
    # and the CLI's dry run prints the same flags for the same ranks
    env = {"PATH": os.environ["PATH"], "HWLOC_COMPONENTS": "-gl", "HOROVOD_CYCLE_TIME": "0.25"}
    dry = subprocess.run([sys.executable, "-m", "launch", "-np", "4", "--mca", "btl_tcp_if_include", "eth0",
                          "--mpi-allreduce", "ring", "--dry-run",
                          "--", "--name", "allreduce-train", "--resume", "auto", "--model", "lenet5", "--lr", "0.1; rm -rf /"],
                         cwd=ROOT, capture_output=True, text=True, env=env, timeout=60)  # cwd puts launch on sys.path
    line = shlex.split(dry.stdout.strip().splitlines()[-1][2:])
    line = [{sys.executable: k8s.PYTHON, str(RING_RULES): image_rules}.get(a, a) for a in line if a != "--allow-run-as-root"]
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
    assert (tmp_path / "job.yaml").read_text() == printed.replace("--workers 3", f"-o {tmp_path / 'job.yaml'} --workers 3", 1)


def test_gpus_set_the_resource_and_the_slots():
    out = render("--workers", "2", "--gpus", "4", "--image", "r.example/allreduce-train:gpu")
    assert out.returncode == 0, out.stderr
    job = by_kind(docs_of(out.stdout), "MPIJob")
    check_mpijob(job)
    assert job["spec"]["slotsPerWorker"] == 4
    worker = job["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]
    assert worker["resources"]["limits"][k8s.GPU_RESOURCE] == "4"
    assert launcher_container(job)["args"][launcher_container(job)["args"].index("-np") + 1] == "8"


def test_preemption_grace_period_and_restart_are_wired():
    out = render("--grace-period", "300", "--backoff-limit", "5", "--", "--epochs", "1")
    job = by_kind(docs_of(out.stdout), "MPIJob")
    for role in ("Launcher", "Worker"):
        rs = job["spec"]["mpiReplicaSpecs"][role]
        assert rs["template"]["spec"]["terminationGracePeriodSeconds"] == 300
        assert rs["restartPolicy"] == "OnFailure"
    assert job["spec"]["runPolicy"]["backoffLimit"] == 5
    launcher = launcher_container(job)
    assert launcher["command"] == [f"{k8s.APP_DIR}/deploy/launcher-entrypoint.sh"]
    assert launcher["args"][-4:] == ["--resume", "auto", "--epochs", "1"]
    for script in ("launcher-entrypoint.sh", "worker-entrypoint.sh"):
        assert os.access(ROOT / "deploy" / script, os.X_OK)


def test_tensorboard_listens_on_the_pod_and_the_service_stays_in_the_cluster():
    docs = docs_of(render("--runs-pvc", "runs", "--tensorboard").stdout)
    deployment, service = by_kind(docs, "Deployment"), by_kind(docs, "Service")
    cmd = deployment["spec"]["template"]["spec"]["containers"][0]["command"]
    assert cmd[cmd.index("--host") + 1] == "0.0.0.0" and cmd[cmd.index("--logdir") + 1] == k8s.RUNS_DIR
    assert service["spec"]["type"] == "ClusterIP"
    assert service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]
    assert deployment["spec"]["template"]["metadata"]["labels"] == service["spec"]["selector"]
    mount = deployment["spec"]["template"]["spec"]["containers"][0]["volumeMounts"][0]
    assert mount["readOnly"] and mount["mountPath"] == k8s.RUNS_DIR


@pytest.mark.parametrize("argv, names", [
    (["--workers", "0"], "--workers"),
    (["--slots-per-worker", "0"], "--slots-per-worker"),
    (["--name", "Big_Name"], "--name"),
    (["--name", "x" * 60, "--workers", "10"], "--name"),
    (["--tensorboard"], "--runs-pvc"),
    (["--memory", "4GB"], "--memory"),
    (["--env", "NOVALUE"], "--env"),
    (["--clean-pod-policy", "Sometimes"], "--clean-pod-policy"),
    (["--runs-pvc-size", "1Gi"], "--runs-pvc"),
])
def test_bad_options_give_one_line_naming_the_flag(argv, names):
    out = render(*argv)
    assert out.returncode == 2 and out.stdout == ""
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("launch k8s: error:") and names in lines[0], out.stderr


def test_yaml_writer_round_trips_awkward_strings():
    values = ["-np", "--x", "^openib", "0.25", "1e3", "yes", "No", "null", "~", "", "a: b", "a:", "x:y", "#c", "- x",
              "'q'", '"d"', "@x", "%x", "*x", "&x", "!x", "{a}", "[a]", "12:30", "0x1F", "0o7", ".inf", "tab\tx",
              "new\nline", "ünï", "/opt/a", "a.b/c", "-", "--"]
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
    job = by_kind(docs_of(render().stdout), "MPIJob")
    for role in ("Launcher", "Worker"):
        (command,) = job["spec"]["mpiReplicaSpecs"][role]["template"]["spec"]["containers"][0]["command"]
        assert command.startswith(k8s.APP_DIR + "/") and os.access(ROOT / command[len(k8s.APP_DIR) + 1:], os.X_OK)


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
    sshd.write_text(f"#!/bin/sh\nexec {shlex.quote(sys.executable)} -c {shlex.quote(FAKE_SSHD)} "
                    f"{shlex.quote(RANK)} {shlex.quote(str(tmp_path / 'rank'))}\n")
    sshd.chmod(0o755)
    proc = subprocess.Popen([str(ROOT / "deploy" / "worker-entrypoint.sh")], env={**os.environ, "SSHD": str(sshd)})
    try:
        wait_for(tmp_path / "rank.ready")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
        assert (tmp_path / "rank").read_text() == "SIGUSR1"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


# -- the helm chart -------------------------------------------------------------------------------

CHART = ROOT / "deploy" / "helm" / "allreduce-train"
ALLREDUCE = ["--model", "lenet5", "--epochs", "2", "--strategy", "allreduce"]


def test_chart_default_render_is_the_job_launch_k8s_renders():
    chart = docs_of(render_chart(CHART, "lenet"))
    assert [d["kind"] for d in chart] == ["MPIJob"]
    check_mpijob(chart[0])
    out = render("--name", "lenet", "--", *ALLREDUCE)
    assert out.returncode == 0, out.stderr
    assert chart == docs_of(out.stdout)  # the same object, field for field, so the same mpirun line


def test_chart_values_map_to_the_launcher_options():
    values = {"workers": 3, "slotsPerWorker": 2, "strategy": "ps-dedicated", "psServers": 2, "psMode": "async",
              "model": "ptb-lstm-small", "dataset": "ptb", "epochs": 13, "extraArgs": ["--lr", "20"],
              "image": {"repository": "r.example/allreduce-train", "tag": "gpu"},
              "resources": {"cpu": "8", "memory": "32Gi", "gpus": 2},
              "env": {"NCCL_SOCKET_IFNAME": "eth0", "HOROVOD_CYCLE_TIME": "0.25", "OMP_NUM_THREADS": "4"},
              "mca": {"btl_tcp_if_include": "eth0"}, "mpiAllreduce": "auto",
              "runs": {"create": True, "size": "20Gi", "storageClass": "nfs"}, "tensorboard": {"enabled": True},
              "gracePeriodSeconds": 300, "backoffLimit": 5, "cleanPodPolicy": "All"}
    chart = docs_of(render_chart(CHART, "lstm", values))
    for doc in chart:
        check_model(doc, {"PersistentVolumeClaim": "V1PersistentVolumeClaim", "Deployment": "V1Deployment",
                          "Service": "V1Service"}[doc["kind"]]) if doc["kind"] != "MPIJob" else check_mpijob(doc)
    out = render("--name", "lstm", "--workers", "3", "--slots-per-worker", "2", "--image", "r.example/allreduce-train:gpu",
                 "--cpu", "8", "--memory", "32Gi", "--gpus", "2",
                 # the chart's maps come out sorted by key, as Go templates range over them
                 "--env", "HOROVOD_CYCLE_TIME=0.25", "--env", "NCCL_SOCKET_IFNAME=eth0", "--env", "OMP_NUM_THREADS=4",
                 "--mca", "btl_tcp_if_include", "eth0", "--mpi-allreduce", "auto", "--runs-pvc", "lstm-runs", "--runs-pvc-size", "20Gi",
                 "--storage-class", "nfs", "--tensorboard", "--grace-period", "300", "--backoff-limit", "5",
                 "--clean-pod-policy", "All", "--",
                 "--model", "ptb-lstm-small", "--dataset", "ptb", "--epochs", "13", "--strategy", "ps",
                 "--ps-placement", "dedicated", "--ps-servers", "2", "--ps-mode", "async", "--lr", "20")
    assert out.returncode == 0, out.stderr
    ours = docs_of(out.stdout)
    key = lambda d: d["kind"]  # noqa: E731 (helm orders objects by template file, launch k8s by use)
    assert sorted(chart, key=key) == sorted(ours, key=key)


def test_chart_leaves_the_ring_rules_out_when_mca_chooses_open_mpis_allreduce():
    mca = {"coll_tuned_use_dynamic_rules": "1", "coll_tuned_allreduce_algorithm": "3"}
    chart = docs_of(render_chart(CHART, "own", {"mca": mca}))
    assert "coll_tuned_dynamic_rules_filename" not in launcher_container(chart[0])["args"]
    out = render("--name", "own", "--mca", "coll_tuned_allreduce_algorithm", "3",  # the chart's map: sorted by key
                 "--mca", "coll_tuned_use_dynamic_rules", "1", "--", *ALLREDUCE)
    assert out.returncode == 0, out.stderr
    assert chart == docs_of(out.stdout)


def test_chart_colocated_ps_and_no_resume():
    # --set resources.cpu=4 gives a number, not a string: both are a quantity
    job = docs_of(render_chart(CHART, "co", {"strategy": "ps-colocated", "resume": False, "resources": {"cpu": 4}}))[0]
    worker = job["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]
    assert worker["resources"]["limits"]["cpu"] == "4"
    args = launcher_container(job)["args"]
    assert args[args.index("train") + 1:] == ["--model", "lenet5", "--epochs", "2",
                                              "--strategy", "ps", "--ps-placement", "colocated", "--ps-mode", "sync"]
    # the model's own defaults where dataset and epochs are left out
    job = docs_of(render_chart(CHART, "lm", {"model": "ptb-lstm-small", "epochs": 0}))[0]
    args = launcher_container(job)["args"]
    assert "--dataset" not in args and "--epochs" not in args


@pytest.mark.parametrize("values, message", [
    ({"strategy": "ps-dedicated", "psServers": 2}, "psServers (2) must be less than workers x slotsPerWorker (2)"),
    ({"tensorboard": {"enabled": True}}, "tensorboard.enabled needs runs.claimName or runs.create"),
    ({"strategy": "ring"}, "strategy"),
    ({"workers": 0}, "workers"),
    ({"resources": {"memory": "4GB"}}, "resources.memory"),
    ({"env": {"BAD-NAME": "1"}}, "env"),
])
def test_chart_refuses_bad_values_with_a_message_naming_them(values, message):
    with pytest.raises(Fail, match=re.escape(message)):
        render_chart(CHART, "bad", values)


def test_template_subset_fails_where_helm_would():
    # helm reads numbers as float64: printf %d of a raw value and eq of a number and a string are errors
    with pytest.raises(TemplateError, match="float64"):
        Renderer({}).run(parse(lex('{{ printf "%d" .n }}'), {}), {"n": helmify(2)}, [{}])
    with pytest.raises(TemplateError, match="incompatible"):
        Renderer({}).run(parse(lex('{{ if eq .n "2" }}x{{ end }}'), {}), {"n": helmify(2)}, [{}])
    with pytest.raises(TemplateError, match="outside the subset"):
        Renderer({}).run(parse(lex("{{ toYaml .n }}"), {}), {"n": 1}, [{}])
    text = Renderer({}).run(parse(lex("a {{- if .x }} b {{ else }} c {{- end }}\n{{ range $k, $v := .m }}{{ $k }}={{ $v }},{{ end }}"), {}),
                            {"x": False, "m": helmify({"b": 1, "a": 1e6})}, [{}])
    assert text == "a c\na=1e+06,b=1,"
