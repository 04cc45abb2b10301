"""Which `pip install` arguments bring the pinned torch, CPU or CUDA build (tools/install.sh).

    python tools/torch_pip.py [--variant cpu|cuda] [--local auto|yes|no] [--cpu-index auto|yes|no]

prints pip's arguments after `pip install`, one per line; a note for the user goes to stderr.

On Linux x86_64, PyPI's torch is the CUDA build (several GB with its nvidia-* wheels); the CPU build
(`+cpu`) lies on PyTorch's own index. So for the CPU variant:
  1. a `torch==VERSION+cpu` file pip finds locally (its --find-links, e.g. /opt/wheels) is used as is;
  2. else PyTorch's CPU index is added (--extra-index-url, so the user's own index still serves
     torch's dependencies) and `+cpu` is asked for;
  3. else (that index cannot be reached) one line says so and PyPI's default build is installed.
Elsewhere (macOS, Windows, other CPUs) PyPI's wheel is already the CPU build: plain `torch==VERSION`.
The CUDA variant is PyPI's default build, whatever the machine.

--local and --cpu-index take the two facts as given instead of finding them out (tests, and users
who know); TORCH_CPU_INDEX names another CPU index (a mirror of PyTorch's).
"""

import argparse
import os
import platform
import subprocess
import sys
import urllib.error
import urllib.request

TORCH_VERSION = "2.13.0"
CPU_INDEX = "https://download.pytorch.org/whl/cpu"


def pip_args(
    variant: str,
    version: str,
    local_cpu_wheel: bool,
    cpu_index_reachable: bool,
    machine: str,
    cpu_index: str = CPU_INDEX,
) -> tuple[list[str], str]:
    """The arguments after `pip install` for torch==version of `variant`, and a note ('' if none)."""
    if variant == "cuda" or machine != "Linux-x86_64":
        return [f"torch=={version}"], ""
    if local_cpu_wheel:
        return [f"torch=={version}+cpu"], ""
    if cpu_index_reachable:
        return ["--extra-index-url", cpu_index, f"torch=={version}+cpu"], ""
    return [f"torch=={version}"], (
        f"warning: PyTorch's CPU wheel index {cpu_index} cannot be reached, so torch=={version} comes from "
        f"your package index, which on Linux x86_64 is the CUDA build (several GB); set TORCH_CPU_INDEX to "
        f"a mirror of it, or TORCH_VARIANT=cuda to ask for the CUDA build"
    )


def finds_local_cpu_wheel(python: str, version: str) -> bool:
    """Whether `python -m pip` finds torch==version+cpu without any index (its --find-links)."""
    # --ignore-installed: an installed torch says nothing about a file (the test's venv has one).
    proc = subprocess.run(
        [
            python,
            "-m",
            "pip",
            "install",
            "--dry-run",
            "--ignore-installed",
            "--no-deps",
            "--no-index",
            "-q",
            f"torch=={version}+cpu",
        ],
        capture_output=True,
        text=True,
    )
    return proc.returncode == 0


def reachable(index: str, timeout: float = 15) -> bool:
    """Whether the index answers for torch (its /torch/ page), within timeout seconds."""
    try:
        with urllib.request.urlopen(index.rstrip("/") + "/torch/", timeout=timeout) as reply:
            return reply.status == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--variant",
        choices=("cpu", "cuda"),
        default=os.environ.get("TORCH_VARIANT") or "cpu",
        help="default: TORCH_VARIANT, else cpu",
    )
    parser.add_argument("--version", default=TORCH_VERSION)
    parser.add_argument("--python", default=sys.executable, help="the pip whose --find-links are looked at")
    parser.add_argument("--local", choices=("auto", "yes", "no"), default="auto")
    parser.add_argument("--cpu-index", choices=("auto", "yes", "no"), default="auto")
    args = parser.parse_args(argv)
    if args.variant not in ("cpu", "cuda"):  # argparse checks choices on the command line, not a default
        print(
            f"error: TORCH_VARIANT={args.variant!r} is not a torch build; use TORCH_VARIANT=cpu or TORCH_VARIANT=cuda",
            file=sys.stderr,
        )
        return 2
    machine = f"{platform.system()}-{platform.machine()}"
    cpu_index = os.environ.get("TORCH_CPU_INDEX") or CPU_INDEX
    cpu = args.variant == "cpu" and machine == "Linux-x86_64"
    local = args.local == "yes" or (args.local == "auto" and cpu and finds_local_cpu_wheel(args.python, args.version))
    index_ok = args.cpu_index == "yes" or (args.cpu_index == "auto" and cpu and not local and reachable(cpu_index))
    pip, note = pip_args(args.variant, args.version, local, index_ok, machine, cpu_index)
    if note:
        print(note, file=sys.stderr)
    print("\n".join(pip))
    return 0


if __name__ == "__main__":
    sys.exit(main())
