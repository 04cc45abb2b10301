#!/usr/bin/env bash
# The GPU check's Horovod build on a machine like a GPU node without network, shown without a GPU:
# in a Debian 13 root file system (GCC 14, CMake 3.31, Python 3.13) with PyPI's CUDA torch for
# Python 3.13 and PyPI's nvcc, `tools/gpu_check.sh --build-only` from a clean copy of the tree's HEAD,
# with no network during the build (unshare -n) and a clean environment. Root only (mmdebstrap,
# chroot, mounts). Not part of make test: the first run downloads ~2.7 GB and compiles Horovod's
# NCCL build with nvcc (28 min on 2 busy cores); later runs reuse the root file system, the wheels,
# the venv and the cached Horovod wheel. docs/gpu.md ("The GPU build offline").
#
#   tools/gpu_offline_check.sh [--cmake4]     # --cmake4: PyPI's CMake 4 first on PATH in the root
#
# Under ~/.cache/allreduce_train/ (ALLREDUCE_TRAIN_CACHE): trixie-gpu/ (the root, ~6 GB with the
# venv) and trixie-gpu-wheels/ (the wheels).
set -euo pipefail
cd "$(dirname "$0")/.."
. tools/gpu_common.sh
[ "$(id -u)" = 0 ] || die "run as root (mmdebstrap, chroot and mounts)"
cmake4=0 src=/src extra_path=""
if [ "${1:-}" = --cmake4 ]; then cmake4=1 src=/src4 extra_path=/cm4/bin; fi
cache=${ALLREDUCE_TRAIN_CACHE:-$HOME/.cache/allreduce_train}
root=$cache/trixie-gpu
wheels=$cache/trixie-gpu-wheels
# The Debian mirror this machine's apt uses (its .../debian entry; not -security, not third-party ones).
mirror=$({ grep -rhoE 'https?://[^ ]*/debian/?( |$)' /etc/apt/sources.list /etc/apt/sources.list.d/ 2>/dev/null || true; } \
    | head -1 | tr -d ' ')
mirror=${mirror:-http://deb.debian.org/debian}
t0=$SECONDS

if [ ! -x "$root/usr/bin/python3" ]; then
    log "step 1/4: Debian 13 root file system from $mirror"
    rm -rf "$root"
    mmdebstrap --variant=apt --include=python3,python3-venv,python3-dev,g++,cmake,make,git,patch \
        trixie "$root" "$mirror"
fi
# The root's /etc/hosts does not name this machine; a real node resolves its own name (Gloo does,
# for a world of one).
grep -qw "$(hostname)" "$root/etc/hosts" || echo "127.0.1.1 $(hostname)" >> "$root/etc/hosts"
log "root: Debian $(cat "$root/etc/debian_version"), $(chroot "$root" g++ --version | head -1)," \
    "$(chroot "$root" cmake --version | head -1), $(chroot "$root" python3 --version)"

# pip 23's --platform takes only the tags it is given: every manylinux tag, or it finds no
# nvidia-cudnn-cu13 (manylinux_2_27) or NCCL (manylinux_2_18) wheel.
plats=(--platform manylinux2014_x86_64 --platform manylinux2010_x86_64 --platform manylinux1_x86_64)
for v in 5 12 17 18 19 20 21 22 23 24 25 26 27 28; do plats+=(--platform "manylinux_2_${v}_x86_64"); done
if [ ! -f "$wheels/.complete" ]; then
    log "step 2/4: the wheels for Python 3.13, with network (torch 2.13.0 with CUDA 13.0, PyPI's nvcc, CMake 4)"
    mkdir -p "$wheels"
    python3 -m pip download -q -d "$wheels" --python-version 3.13 --only-binary=:all: "${plats[@]}" \
        "torch===2.13.0" "numpy>=1.24" setuptools wheel packaging "cuda-toolkit[nvcc,cudart,cccl]==13.0.3" "cmake>=4,<5"
    touch "$wheels/.complete"
fi
log "wheels: $(du -sh "$wheels" | cut -f1) in $wheels"

cleanup() {
    umount "$root/wheels" 2>/dev/null || true
    umount "$root/proc" 2>/dev/null || true
    umount "$root/dev" 2>/dev/null || true
}
trap cleanup EXIT
mkdir -p "$root/wheels" "$root/proc" "$root/dev"
mount --bind "$wheels" "$root/wheels"
mount -o remount,bind,ro "$root/wheels"
mount -t proc proc "$root/proc"
mount --bind /dev "$root/dev"
offline() {  # offline EXTRA_PATH SCRIPT: no network but loopback (as on a node without one), a clean
    # environment, inside the root
    local path=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
    unshare -n sh -c 'ip link set lo up && exec "$@"' sh \
        env -i PATH="${1:+$1:}$path" HOME=/root LANG=C.UTF-8 chroot "$root" bash -c "$2"
}

log "step 3/4: the venv from the wheels only, no network"
offline "" '[ -x /venv/bin/python ] || { python3 -m venv /venv && /venv/bin/pip install -q --no-index --find-links /wheels \
    "torch===2.13.0" "numpy>=1.24" setuptools wheel packaging "cuda-toolkit[nvcc,cudart,cccl]==13.0.3"; }
    [ -x /cm4/bin/cmake ] || { python3 -m venv /cm4 && /cm4/bin/pip install -q --no-index --find-links /wheels "cmake>=4,<5"; }
    /venv/bin/python -c "import torch; print(\"    torch\", torch.__version__, \"CUDA\", torch.version.cuda)"'

log "step 4/4: tools/gpu_check.sh --build-only from a copy of HEAD in $src, no network${extra_path:+, CMake 4 first on PATH}"
mkdir -p "$root$src"
git archive HEAD | tar -x -C "$root$src"  # over an earlier copy: its .gpucheck/ cache stays
offline "$extra_path" "cd $src
    python3 -c 'import urllib.request as u; u.urlopen(\"https://pypi.org/simple/\", timeout=5)' 2>/dev/null \
        && { echo 'error: the network is reachable inside' >&2; exit 1; }
    echo '    no network inside (pypi.org does not resolve)'
    PYTHON=/venv/bin/python HOROVOD_BUILD_CUDA_CC_LIST=90 bash tools/gpu_check.sh --build-only"
log "done in $((SECONDS - t0)) s"
