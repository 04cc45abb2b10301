# Shell functions shared by tools/install_gpu.sh, tools/check_gpu_build.sh and tools/gpu_check.sh
# (sourced, not run). See docs/gpu.md.

HOROVOD_VERSION=0.28.1
# The CUDA architectures Horovod's own kernels are compiled for: Ampere (A100) and Hopper (H100/H200).
# nvcc 13 dropped everything below sm_75, and Horovod's default (every arch nvcc lists) takes longer.
GPU_CC_LIST=${HOROVOD_BUILD_CUDA_CC_LIST:-80,90}

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
