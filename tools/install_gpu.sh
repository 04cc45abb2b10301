#!/usr/bin/env bash
# make install-gpu [CUDA=12|13]: a separate venv with a CUDA build of torch 2.13.0 and Horovod 0.28.1
# built with NCCL operations (HOROVOD_GPU_OPERATIONS=NCCL), for GPU nodes. The CPU .venv and its
# make test are untouched. Works on a machine without a GPU (it only compiles). Safe to re-run:
# the Horovod wheel is cached under its own key beside the CPU one (tools/build_horovod.sh).
#
# Which CUDA: torch's default PyPI wheel is CUDA 13, which needs an NVIDIA driver >= 580; with an
# older driver (nvidia-smi) the CUDA 12 build from PyTorch's index (CUDA12_INDEX, default cu128).
# --cuda 12|13 (make install-gpu CUDA=12) chooses. Each CUDA major has its own venv (.venv-gpu for
# 13, .venv-gpu-cu12 for 12; GPU_VENV=dir for another place), so their wheels never mix.
# --plan: print the choice and the install lines, change nothing. docs/gpu.md.
#
#   tools/install_gpu.sh [--cuda 12|13] [--plan]
set -euo pipefail
cd "$(dirname "$0")/.."
. tools/gpu_common.sh

choice="" plan=0
while [ $# -gt 0 ]; do
    case "$1" in
        --cuda) [ $# -ge 2 ] || die "--cuda needs 12 or 13"; choice=$2; shift 2 ;;
        --cuda=*) choice=${1#--cuda=}; shift ;;
        --plan) plan=1; shift ;;
        *) die "unknown option $1 (use: tools/install_gpu.sh [--cuda 12|13] [--plan])" ;;
    esac
done
driver=$(nvidia_driver_version)
decision=$(cuda_major_for "$choice" "$driver")
major=${decision%% *}
VENV=$(gpu_venv "$major")
read -r -a torch_req <<<"$(torch_requirement "$major")"
PYTHON=${PYTHON:-python3}
log "CUDA $major: ${decision#* }; venv $VENV"
log "torch: pip install ${torch_req[*]}"
if [ $plan = 1 ]; then
    log "plan only (--plan): nothing installed"
    exit 0
fi
t0=$SECONDS

for tool in mpicxx cmake g++; do
    command -v "$tool" >/dev/null || die "$tool not found; install the Debian packages of tools/install.sh" \
        "(apt-get install -y openmpi-bin libopenmpi-dev cmake g++) and re-run make install-gpu"
done
if [ "$major" = 12 ]; then
    why=$(index_reachable "$CUDA12_INDEX" 2>&1) || \
        die "CUDA 12: PyTorch's wheel index $CUDA12_INDEX cannot be reached ($why); set CUDA12_INDEX to a mirror of it, or use CUDA=13 with an NVIDIA driver >= $CUDA13_MIN_DRIVER"
fi

[ -x "$VENV/bin/python" ] || { log "creating $VENV"; "$PYTHON" -m venv "$VENV"; }
PY=$VENV/bin/python
# The pip steps run again only when their inputs changed (a re-run then takes seconds).
pip_key=$(cat pyproject.toml tools/install_gpu.sh tools/gpu_common.sh | sha256sum | cut -c1-16)-cuda$major
pip_stamp=$VENV/.install-gpu-pip
if [ "$(cat "$pip_stamp" 2>/dev/null)" != "$pip_key" ]; then
    "$PY" -m pip install -q --upgrade pip setuptools wheel
    # Its dependencies bring the CUDA runtime libraries and the NCCL torch loads (nvidia-nccl-cu13 or
    # nvidia-nccl-cu12, pinned by torch): Horovod is built against that one below.
    log "torch 2.13.0 with CUDA $major (a ~0.5-1 GB wheel plus ~3 GB of NVIDIA libraries, once)"
    "$PY" -m pip install -q "${torch_req[@]}"
    "$PY" -m pip install -q "numpy>=1.24"
    "$PY" -m pip install -q --no-binary mpi4py "mpi4py>=4.0"
    "$PY" -m pip install -q -e ".[dev,build]"
    echo "$pip_key" > "$pip_stamp"
fi
cuda_ver=$(torch_cuda_version "$PY")
[ -n "$cuda_ver" ] || die "$VENV has a CPU build of torch; remove $VENV and re-run make install-gpu"
[ "${cuda_ver%%.*}" = "$major" ] || die "$VENV has torch built with CUDA $cuda_ver, not CUDA $major; remove $VENV (or set GPU_VENV) and re-run"
log "torch $("$PY" -c 'import torch; print(torch.__version__)') built with CUDA $cuda_ver"

# A CUDA compiler and headers: the system's toolkit, else NVIDIA's PyPI wheels at the version of
# torch's own CUDA libraries (cuda-toolkit, pinned in torch's requirements).
cuda_home=$(find_system_cuda)
if [ -z "$cuda_home" ]; then
    toolkit=$("$PY" - <<'PY'
import importlib.metadata as m, re
for r in m.requires("torch") or []:
    found = re.match(r"cuda-toolkit\[[^\]]*\]\s*(==\s*[\w.]+)", r)
    if found:
        print("cuda-toolkit[nvcc,cudart,cccl]" + found.group(1).replace(" ", ""))
PY
)
    # CUDA 12 torch wheels name no cuda-toolkit (their nvcc wheels have another layout): a CUDA 12
    # node brings its own toolkit.
    [ -n "$toolkit" ] || die "no CUDA $major toolkit found (CUDA_HOME, /usr/local/cuda, nvcc on PATH) and torch" \
        "names no cuda-toolkit wheel to take nvcc from; install a CUDA $major toolkit and set CUDA_HOME"
    log "no CUDA toolkit on this machine (CUDA_HOME, /usr/local/cuda, PATH): installing $toolkit from PyPI"
    "$PY" -m pip install -q "$toolkit"
    cuda_home=$(pip_cuda_home "$PY")
    [ -n "$cuda_home" ] || die "the NVIDIA wheels gave no bin/nvcc and include/cuda_runtime.h"
fi
nvcc_ver=$("$cuda_home/bin/nvcc" --version | sed -n 's/.*release \([0-9.]*\),.*/\1/p')
log "CUDA compiler: $cuda_home/bin/nvcc ($nvcc_ver)"
[ "${nvcc_ver%%.*}" = "${cuda_ver%%.*}" ] || \
    log "warning: nvcc $nvcc_ver and torch's CUDA $cuda_ver differ in the major version; set CUDA_HOME to a CUDA ${cuda_ver%%.*} toolkit if the build fails"

nccl=$(nccl_dir "$PY")
[ -n "$nccl" ] && [ -f "$nccl/include/nccl.h" ] || die "torch brought no nvidia-nccl wheel into $VENV"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# CUDA_HOME too: Horovod asks torch.utils.cpp_extension whether torch has CUDA, and that looks there.
export HOROVOD_GPU_OPERATIONS=NCCL HOROVOD_CUDA_HOME="$cuda_home" CUDA_HOME="$cuda_home" HOROVOD_NCCL_LINK=SHARED
export HOROVOD_NCCL_INCLUDE="$nccl/include" HOROVOD_NCCL_LIB=$(nccl_link_dir "$nccl" "$work/nccl")
export HOROVOD_BUILD_CUDA_CC_LIST=$GPU_CC_LIST PATH="$cuda_home/bin:$PATH"
pip_cuda_libs "$cuda_home" "$work/cuda"
log "Horovod $HOROVOD_VERSION with NCCL ops (NCCL $(nccl_version "$nccl/include") from $nccl), CUDA archs $GPU_CC_LIST"
PY="$PY" tools/build_horovod.sh
log "done in $((SECONDS - t0)) s; check: $VENV/bin/horovodrun --check-build"
