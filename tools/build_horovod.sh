#!/usr/bin/env bash
# Build (once) and install Horovod 0.28.1 into the project venv, patched for PyTorch >= 2.1.
#
# Horovod's last PyPI release is an sdist that compiles as C++14; PyTorch >= 2.1 headers need
# C++17. We apply every tools/patches/horovod-0.28.1-*.patch in name order (cxx17: the build fix;
# cycle-phase: keeps the ranks' background threads in phase, docs/performance.md; gcc14, cmake4,
# setup-requires: today's toolchains and no network at build time, docs/portability.md) and cache
# the resulting wheel under
# $ALLREDUCE_TRAIN_CACHE (default ~/.cache/allreduce_train/wheels), keyed by the Horovod, torch
# and Python versions plus the patch and build flags, so a repeated install takes seconds.
#
# GPU build (tools/install_gpu.sh, docs/gpu.md): with HOROVOD_GPU_OPERATIONS=NCCL the patches of
# tools/patches/gpu/ are applied too and the key adds the NCCL ops, torch's CUDA version and the CUDA
# architectures, so CPU and GPU wheels never mix; the CPU key and build are as before.
#
# The sdist is third_party/horovod-0.28.1.tar.gz, carried with the tree (checked against its PyPI
# sha256), so a build needs no network for it (tools/gpu_check.sh runs on machines without one).
set -euo pipefail

HOROVOD_VERSION=0.28.1
here=$(cd "$(dirname "$0")" && pwd)
patch_files=("$here"/patches/horovod-"${HOROVOD_VERSION}"-*.patch)  # name order
sdist=${HOROVOD_SDIST:-$here/../third_party/horovod-${HOROVOD_VERSION}.tar.gz}
sdist_sha256=92a43f5a94c43907a56805bad15f19700c62ffc83b7ca483f9e104e229f67ef0  # PyPI's
PY=${PY:-.venv/bin/python}

# The build must see the exact venv torch; its version and the python tag are part of the key.
torch_ver=$("$PY" -c 'import torch; print(torch.__version__)')
py_tag=$("$PY" -c 'import sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}")')
gpu_ops=${HOROVOD_GPU_OPERATIONS:-}
gpu_tag=none
if [ -n "$gpu_ops" ]; then
    shopt -s nullglob  # tools/patches/gpu/ may be empty
    patch_files+=("$here"/patches/gpu/horovod-"${HOROVOD_VERSION}"-*.patch)
    shopt -u nullglob
    cuda_ver=$("$PY" -c 'import torch; print(torch.version.cuda or "none")')
    gpu_tag="${gpu_ops}-cuda${cuda_ver}-cc${HOROVOD_BUILD_CUDA_CC_LIST:-all}"
fi
patch_sum=$(cat "${patch_files[@]}" | sha256sum | cut -c1-12)
key="horovod-${HOROVOD_VERSION}_torch-${torch_ver}_${py_tag}_gpu-${gpu_tag}_patch-${patch_sum}"
# HOROVOD_WITHOUT_MPI=1: Gloo only, for a machine without MPI (tools/gpu_check.sh); its own key.
[ "${HOROVOD_WITHOUT_MPI:-}" = 1 ] && key="${key}_nompi"
# HOROVOD_TARGET=DIR: install into DIR (pip --target, used through PYTHONPATH) instead of PY's
# environment, for a Python that is not ours to change (tools/gpu_check.sh).
target=${HOROVOD_TARGET:-}
cache_root=${ALLREDUCE_TRAIN_CACHE:-$HOME/.cache/allreduce_train}/wheels
cache_dir="$cache_root/$key"

installed=$(PYTHONPATH="$target${PYTHONPATH:+:$PYTHONPATH}" "$PY" - <<'PY'
import importlib.metadata as m
try:
    print(m.version("horovod"))
except m.PackageNotFoundError:
    print("")
PY
)
stamp="${target:-$("$PY" -c 'import sys; print(sys.prefix)')}/.horovod-build-key"
if [ "$installed" = "$HOROVOD_VERSION" ] && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$key" ]; then
    echo "horovod $HOROVOD_VERSION already installed ($key)"
    exit 0
fi

if ! ls "$cache_dir"/horovod-*.whl >/dev/null 2>&1; then
    echo "building horovod $HOROVOD_VERSION wheel ($key); about 7 minutes on 2 cores, once"
    work=$(mktemp -d)
    trap 'rm -rf "$work"' EXIT
    if [ ! -f "$sdist" ]; then
        echo "error: $sdist is missing (it is part of the tree); restore it with: git checkout -- third_party" >&2
        exit 1
    fi
    if [ "$(sha256sum "$sdist" | cut -d' ' -f1)" != "$sdist_sha256" ]; then
        echo "error: $sdist is not PyPI's horovod ${HOROVOD_VERSION} sdist (sha256 differs); restore it with: git checkout -- third_party" >&2
        exit 1
    fi
    tar -xzf "$sdist" -C "$work"
    for p in "${patch_files[@]}"; do
        (cd "$work/horovod-${HOROVOD_VERSION}" && patch -p1 --forward < "$p")
    done
    # --no-build-isolation: the build imports the venv's torch (a fresh isolated env would pull
    # a multi-GB CUDA torch) plus cloudpickle, psutil, pyyaml, packaging installed beforehand.
    export HOROVOD_WITH_PYTORCH=1 HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_MXNET=1
    export HOROVOD_WITH_GLOO=1
    [ "${HOROVOD_WITHOUT_MPI:-}" = 1 ] || export HOROVOD_WITH_MPI=1
    export MAKEFLAGS="-j$(nproc)"
    mkdir -p "$work/dist"
    "$PY" -m pip wheel --no-deps --no-build-isolation -w "$work/dist" "$work/horovod-${HOROVOD_VERSION}"
    mkdir -p "$cache_dir.tmp.$$"
    cp "$work"/dist/horovod-*.whl "$cache_dir.tmp.$$/"
    # Atomic publish: a half-written cache entry is never mistaken for a good one.
    rm -rf "$cache_dir"
    mv "$cache_dir.tmp.$$" "$cache_dir"
fi

if [ -n "$target" ]; then
    "$PY" -m pip install --no-deps --upgrade -q --target "$target" "$cache_dir"/horovod-*.whl
else
    "$PY" -m pip install --no-deps --force-reinstall -q "$cache_dir"/horovod-*.whl
fi
echo "$key" > "$stamp"
echo "horovod $HOROVOD_VERSION installed from $cache_dir"
