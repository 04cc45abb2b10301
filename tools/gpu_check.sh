#!/usr/bin/env bash
# make gpu-check: the GPU check for a machine with one GPU, its own PyTorch (a CUDA build), CMake
# and nvcc (or NVIDIA's PyPI nvcc beside torch), no network and no MPI. Builds Horovod 0.28.1 from
# the sdist carried with the tree (third_party/; Gloo controller + NCCL operations, only the GPU's
# own CUDA architecture), and a second time without GPU operations for the two-rank run; then
# trains LeNet-5, ResNet-18 and the small LSTM for a fixed number of steps at one rank through the
# trainer (without and with the exchange; float32, --precision bf16-mixed and 16-mixed), a bare
# Horovod (NCCL) loop and a bare DDP (NCCL) loop,
# at each model's batch and at a busy one, then 2 ranks on the one GPU (Horovod over Gloo, and the
# mpi4py ring and PS where MPI is installed), and prints one table. The NCCL build took 118 s on
# 16 cores for issue 24's user; both builds are cached in .gpucheck/ after. Nothing is installed into that Python: Horovod goes
# to .gpucheck/site and .gpucheck/site-gloo (PYTHONPATH).
#
#   tools/gpu_check.sh [--dry-run | --build-only] [gpucheck options, e.g. --steps 100 --models lenet5]
#
# --dry-run (make gpu-check DRY=1): on this CPU machine with the project's .venv: checks the carried
# sdist and that every patch applies, prints the build it would run, then runs the same table on
# the CPU (Horovod's CPU operations, DDP over gloo; bf16-mixed autocast on the CPU, the 16-mixed rows
# say "needs CUDA") with a few steps, one busy batch and the two-rank jobs for LeNet-5. --build-only:
# steps 1-3 for real (both builds) without a GPU (PYTHON=.venv-gpu/bin/python here), to check the build itself; on a lent GPU, a first call with
# --build-only and a second without keeps each under a device call's time limit. Results also go to $OUT when
# set (a device machine's output folder), else .gpucheck/. docs/gpu.md.
set -euo pipefail
cd "$(dirname "$0")/.."
. tools/gpu_common.sh
root=$PWD

dry=0 build_only=0
if [ "${1:-}" = "--dry-run" ]; then dry=1; shift; fi
# --build-only: steps 1-3 for real (the no-MPI NCCL build and its import) on a machine without a GPU.
if [ "${1:-}" = "--build-only" ]; then build_only=1; shift; fi
out=${OUT:-$root/.gpucheck}
mkdir -p "$out" "$root/.gpucheck"
t0=$SECONDS

if [ $dry = 1 ]; then
    PY=${PYTHON:-.venv/bin/python}
    [ -x "$PY" ] || PY=$(command -v "$PY") || die "no $PY; run make install (or set PYTHON)"
else
    PY=${PYTHON:-python3}
    PY=$(command -v "$PY") || die "no python3 on PATH (set PYTHON to the Python that has torch)"
fi

log "step 1/4: the machine"
"$PY" -c 'import torch' 2>/dev/null || die "$PY cannot import torch; set PYTHON to the Python that has it"
"$PY" -c 'import numpy' 2>/dev/null || die "$PY has no numpy (the data code needs it); install it or set PYTHON"
log "python: $PY ($("$PY" -c 'import sys; print(sys.version.split()[0])')), torch $("$PY" -c 'import torch; print(torch.__version__)')"
cuda_ver=$(torch_cuda_version "$PY")
if [ $dry = 0 ] && [ $build_only = 0 ]; then
    [ -n "$cuda_ver" ] || die "torch is a CPU build; this check needs a CUDA build of torch (or run with --dry-run)"
    "$PY" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' || \
        die "torch (CUDA $cuda_ver) sees no GPU; check nvidia-smi and CUDA_VISIBLE_DEVICES (or run with --dry-run)"
    log "GPU: $("$PY" -c 'import torch; p = torch.cuda.get_device_properties(0); print(f"{p.name}, sm_{p.major}{p.minor}, {torch.cuda.device_count()} visible")')"
fi
# nvcc: the system's toolkit, else the one NVIDIA's PyPI wheels put beside torch (cuda-toolkit[nvcc]).
cuda_home=$(find_system_cuda)
[ -n "$cuda_home" ] || cuda_home=$(pip_cuda_home "$PY")
nccl=$(nccl_dir "$PY")
cc=$(if [ $dry = 0 ] && [ $build_only = 0 ]; then "$PY" -c 'import torch; p = torch.cuda.get_device_properties(0); print(f"{p.major}{p.minor}")'; else echo "$GPU_CC_LIST"; fi)
log "nvcc: ${cuda_home:-none found} $( [ -n "$cuda_home" ] && "$cuda_home/bin/nvcc" --version | sed -n 's/.*\(release [0-9.]*\).*/(\1)/p')"
log "cmake: $(command -v cmake >/dev/null && cmake --version | head -1 || echo none)"
if [ -n "$nccl" ]; then log "NCCL: $(nccl_version "$nccl/include") from $nccl"
else log "NCCL: no pip wheel; the build searches the CUDA toolkit and the system paths"; fi
missing=()
command -v cmake >/dev/null || missing+=(cmake)
command -v g++ >/dev/null || missing+=(g++)
[ -n "$cuda_home" ] || missing+=("nvcc (set CUDA_HOME)")
"$PY" -m pip --version >/dev/null 2>&1 || missing+=("pip in $PY")
"$PY" -c 'import setuptools' 2>/dev/null || missing+=("setuptools in $PY")
if [ ${#missing[@]} -gt 0 ]; then
    [ $dry = 1 ] && log "missing for the real run here: ${missing[*]}" || die "missing: ${missing[*]}"
fi

# Horovod imports cloudpickle, packaging and psutil (horovod.torch -> its elastic module -> the runner's
# network helpers), the project's config tomli before Python 3.11; the tree carries their wheels for
# a Python that lacks them. The pure-Python ones are imported from the wheel itself; psutil's compiled
# module (an abi3 wheel, any CPython 3 on x86_64 Linux) cannot be imported from a zip, so it is
# unpacked into .gpucheck/deps.
"$PY" -c 'import sys; sys.exit(sys.version_info < (3, 10))' || die "$PY is older than Python 3.10 (the project needs >= 3.10)"
deps=""
unpacked=$root/.gpucheck/deps
for mod in cloudpickle packaging psutil $("$PY" -c 'import sys; print("tomli" if sys.version_info < (3, 11) else "")'); do
    if ! PYTHONPATH="$unpacked" "$PY" -c "import $mod" 2>/dev/null; then
        whl=$(ls "$root"/third_party/"$mod"-*.whl 2>/dev/null | head -1)
        [ -n "$whl" ] || die "$PY has no $mod and third_party/ has no $mod wheel"
        case "$whl" in
            *-none-any.whl) deps="$deps:$whl" ;;
            *) "$PY" -c 'import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])' "$whl" "$unpacked" ;;
        esac
        log "$mod: from $(basename "$whl") (not in $PY)"
    fi
done
[ -d "$unpacked" ] && deps="$deps:$unpacked"

log "step 2/4: Horovod $HOROVOD_VERSION with NCCL operations, Gloo controller, no MPI, CUDA arch $cc"
site=$root/.gpucheck/site
build_horovod() {  # in a subshell: the build's variables never reach the runs
    export HOROVOD_GPU_OPERATIONS=NCCL HOROVOD_WITHOUT_MPI=1 HOROVOD_BUILD_CUDA_CC_LIST=$cc
    export HOROVOD_TARGET=$site ALLREDUCE_TRAIN_CACHE=$root/.gpucheck/cache MAKEFLAGS="-j$(nproc)"
    if [ -n "$cuda_home" ]; then
        export HOROVOD_CUDA_HOME=$cuda_home CUDA_HOME=$cuda_home PATH="$cuda_home/bin:$PATH"
        pip_cuda_libs "$cuda_home" "$root/.gpucheck/cuda"
    fi
    if [ -n "$nccl" ]; then
        export HOROVOD_NCCL_INCLUDE=$nccl/include HOROVOD_NCCL_LINK=SHARED
        HOROVOD_NCCL_LIB=$(nccl_link_dir "$nccl" "$root/.gpucheck/nccl")
        export HOROVOD_NCCL_LIB
    fi
    if [ $dry = 0 ]; then
        PY="$PY" tools/build_horovod.sh
        return
    fi
    sdist=third_party/horovod-$HOROVOD_VERSION.tar.gz  # (a subshell: no locals needed)
    work=$(mktemp -d)
    trap 'rm -rf "$work"' EXIT
    echo "92a43f5a94c43907a56805bad15f19700c62ffc83b7ca483f9e104e229f67ef0  $sdist" | sha256sum -c --quiet - || \
        die "$sdist is not PyPI's sdist"
    tar -xzf "$sdist" -C "$work"
    shopt -s nullglob
    for p in tools/patches/horovod-"$HOROVOD_VERSION"-*.patch tools/patches/gpu/horovod-"$HOROVOD_VERSION"-*.patch; do
        (cd "$work/horovod-$HOROVOD_VERSION" && patch -p1 --forward --quiet < "$root/$p") || die "$p does not apply"
        log "patch applies: $p"
    done
    log "dry run: the carried sdist is PyPI's; would run PY=$PY tools/build_horovod.sh with:"
    env | grep -E '^HOROVOD_' | sort | sed 's/^/    /'
}
tb=$SECONDS
(build_horovod)
gloo_site=""
if [ $dry = 1 ]; then
    export PYTHONPATH="$root${deps}${PYTHONPATH:+:$PYTHONPATH}"  # the CPU .venv's own Horovod
else
    log "Horovod built and installed in $((SECONDS - tb)) s"
    # The two-rank run shares the one GPU, which NCCL refuses, and a Horovod with NCCL operations
    # sends every CUDA tensor to NCCL: a second build without GPU operations, whose CUDA tensors
    # go through the host to Gloo (lab/gpucheck/__init__.py's docstring).
    tb=$SECONDS
    gloo_site=$root/.gpucheck/site-gloo
    log "step 2/4 (b): Horovod $HOROVOD_VERSION without GPU operations (Gloo, no MPI) for the two-rank run"
    (unset HOROVOD_GPU_OPERATIONS
     export HOROVOD_WITHOUT_MPI=1 HOROVOD_TARGET=$gloo_site ALLREDUCE_TRAIN_CACHE=$root/.gpucheck/cache MAKEFLAGS="-j$(nproc)"
     PY="$PY" tools/build_horovod.sh)
    log "Horovod without GPU operations built and installed in $((SECONDS - tb)) s"
    export PYTHONPATH="$site:$root${deps}${PYTHONPATH:+:$PYTHONPATH}"
fi

log "step 3/4: import horovod.torch, and what it was built with"
"$PY" - <<'PY'
import horovod
import horovod.torch as hvd
print(f"    horovod {horovod.__version__} from {horovod.__path__[0]}: NCCL {bool(hvd.nccl_built())}, Gloo {hvd.gloo_built()}, MPI {hvd.mpi_built()}, "
      f"CUDA {hvd.cuda_built()}")
PY
if [ $dry = 0 ]; then
    "$PY" -c 'import horovod.torch as hvd, sys; sys.exit(0 if hvd.nccl_built() else 1)' || die "Horovod was built without NCCL"
fi

if [ $build_only = 1 ]; then
    log "build only: Horovod built and imported in $((SECONDS - t0)) s; no runs"
    exit 0
fi
log "step 4/4: the runs (each prints what it does), then the table"
device=cuda
extra=(--gloo-pythonpath "$gloo_site")
if [ $dry = 1 ]; then
    device=cpu
    extra=(--steps 2 --warmup-steps 1 --batch-size 4 --synthetic-samples 128 --busy lenet5=16
           --two-rank-models lenet5 --two-rank-steps 4)
fi
set +e
"$PY" -m lab gpucheck --device $device "${extra[@]}" --out "$out/gpucheck.json" "$@" \
    | tee "$out/gpucheck.txt"
rc=${PIPESTATUS[0]}
set -e
log "gpu check $([ "$rc" = 0 ] && echo done || echo "FAILED (exit $rc)") in $((SECONDS - t0)) s; table in $out/gpucheck.txt"
exit "$rc"
