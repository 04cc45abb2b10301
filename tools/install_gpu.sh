#!/usr/bin/env bash
# make install-gpu: a separate venv (.venv-gpu) with the CUDA build of torch 2.13.0 and Horovod 0.28.1
# built with NCCL operations (HOROVOD_GPU_OPERATIONS=NCCL), for GPU nodes. The CPU .venv and its
# make test are untouched. Works on a machine without a GPU (it only compiles). Safe to re-run:
# the Horovod wheel is cached under its own key beside the CPU one (tools/build_horovod.sh).
# docs/gpu.md has the steps, the choices and the timings.
set -euo pipefail
cd "$(dirname "$0")/.."
. tools/gpu_common.sh

VENV=${GPU_VENV:-.venv-gpu}
PYTHON=${PYTHON:-python3}
t0=$SECONDS

for tool in mpicxx cmake g++; do
    command -v "$tool" >/dev/null || die "$tool not found; install the Debian packages of tools/install.sh" \
        "(apt-get install -y openmpi-bin libopenmpi-dev cmake g++) and re-run make install-gpu"
done

[ -x "$VENV/bin/python" ] || { log "creating $VENV"; "$PYTHON" -m venv "$VENV"; }
PY=$VENV/bin/python
# The pip steps run again only when their inputs changed (a re-run then takes seconds).
pip_key=$(cat pyproject.toml tools/install_gpu.sh | sha256sum | cut -c1-16)
pip_stamp=$VENV/.install-gpu-pip
if [ "$(cat "$pip_stamp" 2>/dev/null)" != "$pip_key" ]; then
    "$PY" -m pip install -q --upgrade pip setuptools wheel
    # torch===2.13.0 (exactly, no local label): PyPI's default Linux wheel, built with CUDA 13.0. Its
    # dependencies bring the CUDA 13 runtime libraries and NCCL (nvidia-nccl-cu13, pinned by torch).
    # "==" would also accept a local 2.13.0+cpu wheel where pip finds one.
    log "torch 2.13.0 with CUDA (a ~0.5 GB wheel plus ~3 GB of NVIDIA libraries, once)"
    "$PY" -m pip install -q "torch===2.13.0" "numpy>=1.24"
    "$PY" -m pip install -q --no-binary mpi4py "mpi4py>=4.0"
    "$PY" -m pip install -q -e ".[dev,build]"
    echo "$pip_key" > "$pip_stamp"
fi
cuda_ver=$(torch_cuda_version "$PY")
[ -n "$cuda_ver" ] || die "$VENV has a CPU build of torch; remove $VENV and re-run make install-gpu"
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
    [ -n "$toolkit" ] || die "no CUDA toolkit found (set CUDA_HOME) and torch names no cuda-toolkit version"
    log "no CUDA toolkit on this machine (CUDA_HOME, /usr/local/cuda, PATH): installing $toolkit from PyPI"
    "$PY" -m pip install -q "$toolkit"
    cuda_home=$("$PY" -c 'import importlib.util as u, os; print(os.path.join(list(u.find_spec("nvidia").submodule_search_locations)[0], "cu" + __import__("torch").version.cuda.split(".")[0]))')
    cuda_home=$(cuda_home_of "$cuda_home") || die "the NVIDIA wheels gave no bin/nvcc and include/cuda_runtime.h"
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
log "Horovod $HOROVOD_VERSION with NCCL ops (NCCL $(nccl_version "$nccl/include") from $nccl), CUDA archs $GPU_CC_LIST"
PY="$PY" tools/build_horovod.sh
log "done in $((SECONDS - t0)) s; check: $VENV/bin/horovodrun --check-build"
