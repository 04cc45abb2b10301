"""tools/torch_pip.py: the `pip install` arguments tools/install.sh uses for torch, and what pip makes of them.

The indexes here are real HTTP servers on 127.0.0.1 holding small stand-in wheels named like torch's
(a `+cpu` one as on PyTorch's CPU index, a plain one as on PyPI), so pip's own resolution shows which
build the command line brings.
"""

import functools
import http.server
import json
import os
import platform
import socket
import subprocess
import sys
import threading
import zipfile
from pathlib import Path

import pytest

from helpers import ROOT

SCRIPT = ROOT / "tools" / "torch_pip.py"
VERSION = "2.13.0"
PLAIN_PYPI_CPU = ["--extra-index-url", "https://download.pytorch.org/whl/cpu", f"torch=={VERSION}+cpu"]

linux_x86_64 = pytest.mark.skipif(
    f"{platform.system()}-{platform.machine()}" != "Linux-x86_64",
    reason="the +cpu route is for Linux x86_64, where PyPI's torch is the CUDA build",
)


def wheel(directory: Path, version: str) -> Path:
    """A minimal installable wheel called torch, of `version`."""
    path = directory / f"torch-{version}-py3-none-any.whl"
    info = f"torch-{version}.dist-info"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: torch\nVersion: {version}\n")
        z.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        z.writestr(f"{info}/RECORD", "")
    return path


def simple_index(root: Path, *wheels: Path) -> None:
    """A PEP 503 page for torch under root/torch/ linking the wheels."""
    (root / "torch").mkdir(parents=True)
    links = "".join(f'<a href="{w.name}">{w.name}</a>\n' for w in wheels)
    (root / "torch" / "index.html").write_text(f"<html><body>\n{links}</body></html>\n")
    for w in wheels:
        (root / "torch" / w.name).write_bytes(w.read_bytes())


class Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


@pytest.fixture
def serve():
    """serve(directory) -> its http://127.0.0.1:PORT URL, for the test's duration."""
    servers = []

    def start(directory: Path) -> str:
        handler = functools.partial(Quiet, directory=str(directory))
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return f"http://127.0.0.1:{server.server_address[1]}"

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def pip_env(find_links: Path | None = None, **extra: str) -> dict:
    """No pip configuration file and no environment's find-links: only what the test gives pip."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("PIP_") and k not in ("TORCH_VARIANT", "TORCH_CPU_INDEX")
    }
    env.update(PIP_CONFIG_FILE=os.devnull, PIP_DISABLE_PIP_VERSION_CHECK="1", **extra)
    if find_links is not None:
        env["PIP_FIND_LINKS"] = str(find_links)
    return env


def torch_pip(env: dict, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], env=env, capture_output=True, text=True, timeout=120)


def resolves_to(pip_args: list[str], env: dict, index: str | None) -> str:
    """The torch version `pip install <pip_args>` would install with `index` as the package index (None: none)."""
    where = ["--index-url", index] if index else ["--no-index"]
    report = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--dry-run",
            "--ignore-installed",
            "--no-deps",
            "-q",
            "--report",
            "-",
            *where,
            *pip_args,
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert report.returncode == 0, report.stderr
    (item,) = json.loads(report.stdout)["install"]
    return item["metadata"]["version"]


@linux_x86_64
def test_plain_pypi_gets_the_cpu_build_from_pytorchs_cpu_index():
    proc = torch_pip(pip_env(), "--local", "no", "--cpu-index", "yes")
    assert proc.returncode == 0 and proc.stderr == ""
    assert proc.stdout.split() == PLAIN_PYPI_CPU


@pytest.mark.heavy
@linux_x86_64
def test_a_local_cpu_wheel_pip_finds_is_taken_without_any_index(tmp_path):
    local = tmp_path / "wheels"
    local.mkdir()
    wheel(local, f"{VERSION}+cpu")
    proc = torch_pip(pip_env(find_links=local), "--cpu-index", "no")
    assert proc.returncode == 0 and proc.stderr == ""
    assert proc.stdout.split() == [f"torch=={VERSION}+cpu"]
    assert resolves_to(proc.stdout.split(), pip_env(find_links=local), None) == f"{VERSION}+cpu"


@pytest.mark.heavy
@linux_x86_64
def test_without_a_local_wheel_the_reachable_cpu_index_wins_over_the_cuda_build_on_the_package_index(tmp_path, serve):
    (tmp_path / "files").mkdir()
    (tmp_path / "empty").mkdir()
    simple_index(tmp_path / "pypi", wheel(tmp_path / "files", VERSION))  # PyPI: the CUDA build, no label
    simple_index(tmp_path / "cpu", wheel(tmp_path / "files", f"{VERSION}+cpu"))
    pypi, cpu = serve(tmp_path / "pypi"), serve(tmp_path / "cpu")
    env = pip_env(find_links=tmp_path / "empty", TORCH_CPU_INDEX=cpu)
    proc = torch_pip(env)
    assert proc.returncode == 0 and proc.stderr == ""
    assert proc.stdout.split() == ["--extra-index-url", cpu, f"torch=={VERSION}+cpu"]
    assert resolves_to(proc.stdout.split(), env, pypi) == f"{VERSION}+cpu"


@pytest.mark.heavy
@linux_x86_64
def test_an_unreachable_cpu_index_falls_back_to_the_package_index_with_one_line(tmp_path):
    with socket.socket() as s:  # a port nobody listens on: connection refused
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    (tmp_path / "empty").mkdir()
    proc = torch_pip(pip_env(find_links=tmp_path / "empty", TORCH_CPU_INDEX=f"http://127.0.0.1:{port}/whl/cpu"))
    assert proc.returncode == 0
    assert proc.stdout.split() == [f"torch=={VERSION}"]
    (line,) = proc.stderr.splitlines()
    assert line.startswith("warning:") and f"http://127.0.0.1:{port}/whl/cpu cannot be reached" in line
    assert "CUDA build" in line and "TORCH_CPU_INDEX" in line


def test_the_cuda_variant_is_the_package_indexs_default_build_without_looking_anywhere():
    env = pip_env(TORCH_VARIANT="cuda", TORCH_CPU_INDEX="http://127.0.0.1:9/never-asked")
    proc = torch_pip(env)
    assert proc.returncode == 0 and proc.stderr == ""
    assert proc.stdout.split() == [f"torch=={VERSION}"]


def test_an_unknown_torch_variant_is_one_error_line():
    proc = torch_pip(pip_env(TORCH_VARIANT="gpu"))
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.splitlines() == [
        "error: TORCH_VARIANT='gpu' is not a torch build; use TORCH_VARIANT=cpu or TORCH_VARIANT=cuda"
    ]


def test_install_sh_refuses_an_unknown_lab_value_before_touching_anything(tmp_path):
    proc = subprocess.run(
        ["bash", str(ROOT / "tools" / "install.sh")],
        env={**os.environ, "LAB": "no"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 1 and proc.stdout == ""
    assert proc.stderr.splitlines() == [
        "error: LAB=no; use LAB=1 (the lab's packages too, the default) or LAB=0 (training only)"
    ]
