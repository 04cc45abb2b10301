# Shell functions shared by tools/install_gpu.sh, tools/check_gpu_build.sh and tools/gpu_check.sh
# (sourced, not run). See docs/gpu.md.

HOROVOD_VERSION=0.28.1
# The CUDA architectures Horovod's own kernels are compiled for: Ampere (A100) and Hopper (H100/H200).
# nvcc 13 dropped everything below sm_75, and Horovod's default (every arch nvcc lists) takes longer.
GPU_CC_LIST=${HOROVOD_BUILD_CUDA_CC_LIST:-80,90}

# CUDA 13 builds of torch need an NVIDIA driver of the 580 series or newer (CUDA 13.0's minimum);
# an older driver runs CUDA 12 builds.
CUDA13_MIN_DRIVER=580
# Where the CUDA 12 torch comes from: PyTorch's own wheel index (PyPI's torch is the CUDA 13 build).
CUDA12_INDEX=${CUDA12_INDEX:-https://download.pytorch.org/whl/cu128}

log() { printf '[%s] %s\n' "$(date -u +%H:%M:%S)" "$*"; }
die() { echo "error: $*" >&2; exit 1; }

# cuda_home_of DIR: DIR if it holds a CUDA compiler and the runtime headers, else fails.
cuda_home_of() {
    [ -n "$1" ] && [ -x "$1/bin/nvcc" ] && [ -f "$1/include/cuda_runtime.h" ] && echo "$1"
}

# find_system_cuda: $CUDA_HOME, then /usr/local/cuda, then the nvcc on PATH; prints the CUDA home or
# nothing. CUDA_HOME=pip: nothing, so that NVIDIA's PyPI wheels are used even beside a toolkit.
find_system_cuda() {
    local nvcc
    [ "${CUDA_HOME:-}" = pip ] && return 0
    cuda_home_of "${CUDA_HOME:-}" && return 0
    cuda_home_of /usr/local/cuda && return 0
    nvcc=$(command -v nvcc 2>/dev/null) || return 0
    cuda_home_of "$(dirname "$(dirname "$(readlink -f "$nvcc")")")" || true
}

# pip_cuda_home PY: the CUDA home that NVIDIA's PyPI wheels (cuda-toolkit[nvcc,cudart,cccl]) make in
# PY's environment (site-packages/nvidia/cu13: bin/nvcc, include/, lib/), or nothing.
pip_cuda_home() {
    local dir
    dir=$("$1" - <<'PY' 2>/dev/null
import importlib.util, os
import torch
spec = importlib.util.find_spec("nvidia")
if spec and torch.version.cuda:
    print(os.path.join(list(spec.submodule_search_locations)[0], "cu" + torch.version.cuda.split(".")[0]))
PY
)
    cuda_home_of "$dir" || true
}

# pip_cuda_libs CUDA_HOME OUT: NVIDIA's PyPI wheels put the CUDA libraries in lib/ and only as
# versioned files (libcudart.so.13), where nvcc's own profile links from lib64/ ("cannot find
# -lcudadevrt" in CMake's CUDA compiler check) and CMake's FindCUDAToolkit looks for libcudart.so
# ("Could NOT find CUDAToolkit (missing: CUDA_CUDART)"). For such a home: unversioned links in
# OUT/lib, and both directories on the linker's LIBRARY_PATH and CMake's CMAKE_LIBRARY_PATH. A
# toolkit with lib64/ is left as it is.
pip_cuda_libs() {
    local f
    [ ! -d "$1/lib64" ] && [ -f "$1/lib/libcudart_static.a" ] || return 0
    mkdir -p "$2/lib"
    for f in "$1"/lib/lib*.so.*; do
        ln -sf "$f" "$2/lib/$(basename "${f%%.so.*}").so"
    done
    export LIBRARY_PATH="$2/lib:$1/lib${LIBRARY_PATH:+:$LIBRARY_PATH}"
    export CMAKE_LIBRARY_PATH="$2/lib:$1/lib${CMAKE_LIBRARY_PATH:+:$CMAKE_LIBRARY_PATH}"
}

# torch_cuda_version PY: the CUDA version PY's torch was built with ("13.0"), or nothing for a CPU build.
torch_cuda_version() {
    "$1" -c 'import torch; print(torch.version.cuda or "")'
}

# nccl_dir PY: the directory of the nvidia-nccl-cu* wheel in PY's environment (include/, lib/).
nccl_dir() {
    "$1" - <<'PY'
import importlib.util
try:
    spec = importlib.util.find_spec("nvidia.nccl")
except ModuleNotFoundError:  # no nvidia namespace at all
    spec = None
print(list(spec.submodule_search_locations)[0] if spec else "")
PY
}

# nccl_link_dir NCCL_DIR OUT: the wheel ships lib/libnccl.so.2 without the libnccl.so link that
# Horovod's FindNCCL looks for; make one in OUT/lib. The built library then needs libnccl.so.2, the
# same file torch itself loads.
nccl_link_dir() {
    mkdir -p "$2/lib"
    ln -sf "$1/lib/libnccl.so.2" "$2/lib/libnccl.so"
    echo "$2/lib"
}

# nccl_version INCLUDE_DIR: "2.29.7" from nccl.h.
nccl_version() {
    awk '/^#define NCCL_(MAJOR|MINOR|PATCH) /{v = v (v == "" ? "" : ".") $3} END {print v}' "$1/nccl.h"
}

# nvidia_driver_version: the NVIDIA driver's version ("575.57.08") from nvidia-smi, or nothing where
# there is no nvidia-smi or it answers with no driver.
nvidia_driver_version() {
    command -v nvidia-smi >/dev/null 2>&1 || return 0
    nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -1 | tr -d ' ' || true
}

# cuda_major_for CHOICE DRIVER: which CUDA build of torch to install, as "MAJOR why": CHOICE (12 or
# 13, from CUDA=) wins; else CUDA 13 where DRIVER (nvidia_driver_version) is >= CUDA13_MIN_DRIVER or
# unknown (no nvidia-smi: a machine that only builds), CUDA 12 below it. Fails on another CHOICE.
cuda_major_for() {
    local choice=$1 driver=$2 major
    case "$choice" in
        12|13) echo "$choice CUDA=$choice"; return 0 ;;
        ""|auto) ;;
        *) die "CUDA=$choice: use CUDA=12 or CUDA=13 (or leave it unset: chosen by the NVIDIA driver)" ;;
    esac
    major=${driver%%.*}
    if ! [[ "$major" =~ ^[0-9]+$ ]]; then
        echo "13 no NVIDIA driver found (nvidia-smi), so torch's default build"
    elif [ "$major" -ge "$CUDA13_MIN_DRIVER" ]; then
        echo "13 NVIDIA driver $driver >= $CUDA13_MIN_DRIVER"
    else
        echo "12 NVIDIA driver $driver < $CUDA13_MIN_DRIVER (CUDA 13 needs $CUDA13_MIN_DRIVER or newer)"
    fi
}

# gpu_venv MAJOR: the venv of that CUDA major (GPU_VENV overrides): wheels of two CUDA majors never mix.
gpu_venv() {
    if [ -n "${GPU_VENV:-}" ]; then echo "$GPU_VENV"
    elif [ "$1" = 12 ]; then echo .venv-gpu-cu12
    else echo .venv-gpu; fi
}

# torch_requirement MAJOR: pip's arguments for torch 2.13.0 of that CUDA major.
# 13: "torch===2.13.0" (exactly, no local label): PyPI's default Linux wheel, built with CUDA 13.0
# ("==" would also accept a local 2.13.0+cpu wheel where pip finds one).
# 12: torch 2.13.0+cu12x from PyTorch's index (CUDA12_INDEX), as PyTorch's own install line does
# (that index carries torch's dependencies, nvidia-nccl-cu12 among them).
torch_requirement() {
    if [ "$1" = 12 ]; then
        echo "torch==2.13.0+${CUDA12_INDEX##*/} --index-url $CUDA12_INDEX"
    else
        echo "torch===2.13.0"
    fi
}

# index_reachable URL: fails with the reason on stderr when URL/torch/ cannot be read within 20 s.
index_reachable() {
    "${PYTHON:-python3}" - "$1" <<'PY'
import sys, urllib.request
try:
    urllib.request.urlopen(sys.argv[1].rstrip("/") + "/torch/", timeout=20).close()
except Exception as e:
    sys.exit(f"{type(e).__name__}: {getattr(e, 'reason', e)}")
PY
}
