"""`make image`: the plan tools/image.sh runs (its --dry-run prints every command and runs none).

The build itself takes minutes and is not part of make test; docs/kubernetes.md ("The image") has
the commands that built it here and what tools/k8s_pod_check.sh ran from it.
"""

from __future__ import annotations

import shlex
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def plan(*args: str) -> list[list[str]]:
    out = subprocess.run(
        ["bash", "tools/image.sh", "--dry-run", *args], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    return [shlex.split(line[2:], comments=True) for line in out.stdout.splitlines() if line.startswith("+ ")]


def build_line(lines: list[list[str]]) -> list[str]:
    (line,) = [x for x in lines if "bud" in x or "build" in x]
    return line


def arg_values(line: list[str], flag: str) -> list[str]:
    return [line[i + 1] for i, a in enumerate(line) if a == flag]


def test_make_image_passes_variant_and_base_to_the_script():
    out = subprocess.run(
        # --no-print-directory: under `make test` this make is a sub-make, which would add "Entering directory"
        ["make", "-n", "--no-print-directory", "image", "VARIANT=gpu", "BASE=local", "CUDA=12"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert shlex.split(out.stdout.replace("\\\n", " ")) == [
        "bash",
        "tools/image.sh",
        "--variant",
        "gpu",
        "--base",
        "local",
        "--cuda",
        "12",
    ]


def test_buildah_plan_makes_the_base_with_mmdebstrap_and_builds_with_chroot_isolation():
    lines = plan("--engine", "buildah", "--base", "local")
    text = [" ".join(x) for x in lines]
    (debootstrap,) = [x for x in lines if x[:1] == ["mmdebstrap"]]
    assert debootstrap[1:3] == ["--variant=apt", "bookworm"] and debootstrap[-1].startswith("http")
    assert any("buildah commit" in t and "localhost/allreduce-train-base:bookworm" in t for t in text)
    line = build_line(lines)
    assert line[:5] == ["buildah", "--storage-driver", "vfs", "bud", "--isolation"] and line[5] == "chroot"
    assert arg_values(line, "--ignorefile") == ["deploy/Dockerfile.dockerignore"]
    assert arg_values(line, "-f") == ["deploy/Dockerfile"] and line[-1] == "."
    assert arg_values(line, "--build-arg") == ["BASE=localhost/allreduce-train-base:bookworm", "VARIANT=cpu", "CUDA=13"]
    assert arg_values(line, "-t") == ["localhost/allreduce-train:cpu"]
    (context,) = arg_values(line, "--build-context")
    local = context.removeprefix("local=")
    # the CPU torch wheel as make install takes it (pip's --find-links) and make install's Horovod wheels
    (pip,) = [x for x in lines if x[:4] == ["python3", "-m", "pip", "download"]]
    assert "--no-index" in pip and pip[pip.index("-d") + 1] == f"{local}/wheels" and pip[-1].endswith("+cpu")
    (cp,) = [x for x in lines if x[:2] == ["cp", "-r"]]
    assert "_gpu-none_" in cp[2] and cp[3] == f"{local}/cache/wheels/"


def test_docker_plan_and_the_gpu_variant():
    lines = plan("--engine", "docker", "--variant", "gpu", "--base", "debian:bookworm", "--tag", "r.example/at:gpu")
    line = build_line(lines)
    assert line[:2] == ["docker", "build"] and "--ignorefile" not in line  # BuildKit reads it beside the Dockerfile
    assert arg_values(line, "--build-arg") == ["BASE=debian:bookworm", "VARIANT=gpu", "CUDA=13"]
    assert arg_values(line, "-t") == ["r.example/at:gpu"]
    assert not [x for x in lines if x[:1] == ["mmdebstrap"] or "download" in x]  # no local base, no CPU wheel


def test_dockerfile_takes_the_local_context_through_a_mount_not_a_copy():
    dockerfile = (ROOT / "deploy" / "Dockerfile").read_text()
    install = dockerfile[dockerfile.index("RUN --mount=type=bind,from=local") :]
    install = install[: install.index("\n\n")]
    assert "PIP_FIND_LINKS=/tmp/local/wheels" in install and "LAB=0 TORCH_VARIANT=cpu bash tools/install.sh" in install
    assert "rm -rf /tmp/build-cache" in install
    assert "COPY --from=local" not in dockerfile


@pytest.mark.parametrize(
    "args, names",
    [
        (["--variant", "arm"], "VARIANT=arm"),
        (["--cuda", "11"], "CUDA=11"),
        (["--engine", "kaniko"], "ENGINE=kaniko"),
        (["--bogus"], "usage"),
    ],
)
def test_bad_settings_give_one_line_and_exit_2(args, names):
    out = subprocess.run(
        ["bash", "tools/image.sh", "--dry-run", "--engine", "buildah", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2 and len(lines) == 1 and names in lines[0], out.stderr
