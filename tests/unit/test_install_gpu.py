"""make install-gpu's CUDA choice (tools/install_gpu.sh --plan, tools/gpu_common.sh): CUDA 13 with an
NVIDIA driver >= 580 or none found, CUDA 12 below 580, CUDA=12|13 overrides; each its own venv.

Runs the real script with a stand-in nvidia-smi on PATH that prints a driver version; --plan prints
the choice and the pip line and installs nothing.
"""

import os
import shutil
import subprocess

import pytest

from helpers import ROOT as REPO


def plan(tmp_path, driver, *args, env_extra=None):
    """install_gpu.sh --plan with a stand-in nvidia-smi printing ``driver`` (None: no nvidia-smi,
    "fail": one that finds no driver). PATH holds only the few tools --plan uses besides it."""
    bindir = tmp_path / "bin"
    bindir.mkdir(exist_ok=True)
    for tool in ("dirname", "head", "tr", "date"):
        (bindir / tool).symlink_to(shutil.which(tool))
    if driver is not None:
        smi = bindir / "nvidia-smi"
        smi.write_text(
            "#!/bin/sh\necho 'NVIDIA-SMI has failed' >&2; exit 9\n"
            if driver == "fail"
            else f"#!/bin/sh\n[ \"$1\" = --query-gpu=driver_version ] && echo '{driver}'\n"
        )
        smi.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k not in ("GPU_VENV", "CUDA12_INDEX")}
    env.update(env_extra or {}, PATH=str(bindir))
    bash = shutil.which("bash")  # found before PATH becomes the fake bin directory alone
    assert bash is not None
    return subprocess.run(
        [bash, "tools/install_gpu.sh", "--plan", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize(
    "driver,major",
    [("575.57.08", 12), ("570.195.03", 12), ("580.65.06", 13), ("590.44.01", 13), (None, 13), ("fail", 13)],
)
def test_the_driver_picks_the_cuda_major(tmp_path, driver, major):
    proc = plan(tmp_path, driver)
    assert proc.returncode == 0, proc.stderr
    assert f"CUDA {major}: " in proc.stdout and "nothing installed" in proc.stdout
    if major == 12:
        assert "venv .venv-gpu-cu12" in proc.stdout
        assert "pip install torch==2.13.0+cu128 --index-url https://download.pytorch.org/whl/cu128" in proc.stdout
        assert f"driver {driver} < 580" in proc.stdout
    else:
        assert "venv .venv-gpu\n" in proc.stdout
        assert "pip install torch===2.13.0\n" in proc.stdout  # PyPI's default wheel: CUDA 13
        assert ("no NVIDIA driver found" if driver in (None, "fail") else f"driver {driver} >= 580") in proc.stdout


@pytest.mark.parametrize("driver,choice", [("590.44.01", "12"), ("575.57.08", "13"), (None, "12")])
def test_cuda_overrides_the_driver(tmp_path, driver, choice):
    proc = plan(tmp_path, driver, "--cuda", choice)
    assert proc.returncode == 0, proc.stderr
    assert f"CUDA {choice}: CUDA={choice}; venv {'.venv-gpu-cu12' if choice == '12' else '.venv-gpu'}" in proc.stdout


def test_another_cuda12_index_is_used(tmp_path):
    proc = plan(tmp_path, "575.57.08", env_extra={"CUDA12_INDEX": "https://mirror.example/whl/cu126"})
    assert proc.returncode == 0, proc.stderr
    assert "pip install torch==2.13.0+cu126 --index-url https://mirror.example/whl/cu126" in proc.stdout


def test_a_bad_cuda_is_one_clear_line(tmp_path):
    proc = plan(tmp_path, "575.57.08", "--cuda", "11")
    assert proc.returncode != 0 and proc.stdout == ""
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "CUDA=11" in lines[0] and "CUDA=12 or CUDA=13" in lines[0]
