#!/usr/bin/env bash
# make image: build deploy/Dockerfile (docs/kubernetes.md, "The image").
#
#   tools/image.sh [--variant cpu|gpu] [--base IMAGE|local] [--tag TAG] [--engine auto|docker|podman|buildah]
#                  [--cuda 12|13] [--dry-run]
#
# The engine: docker or podman where its service answers, else buildah (Debian's package), which
# builds without a daemon: `buildah bud --isolation chroot` with the vfs storage driver
# (STORAGE_DRIVER=...) works inside a container or a sandbox without overlay mounts or user namespaces.
# --base local makes the Debian base here with mmdebstrap (--variant=apt, bookworm, from the mirror
# this machine's apt uses) and imports it, for a site whose builders reach no container registry.
# The build context `local` (--build-context local=DIR, read by the Dockerfile's RUN --mount) carries
# what this machine already has and the build might not reach: for --variant cpu the CPU torch wheel
# pip finds here (its --find-links, as `make install` uses it: tools/torch_pip.py), the Horovod wheels
# `make install` cached (tools/build_horovod.sh's cache, ~/.cache/allreduce_train/wheels), and this
# machine's CA bundle (PyPI through its network). None of it stays in the image.
# --dry-run prints the commands it would run, one per line prefixed with "+ ", and runs none.
set -euo pipefail
cd "$(dirname "$0")/.."

VARIANT=cpu BASE=debian:bookworm-slim TAG="" ENGINE=auto CUDA=13 DRY=0
STORAGE_DRIVER=${STORAGE_DRIVER:-vfs}
usage() { echo "usage: tools/image.sh [--variant cpu|gpu] [--base IMAGE|local] [--tag TAG] [--engine auto|docker|podman|buildah] [--cuda 12|13] [--dry-run]" >&2; exit 2; }
while [ $# -gt 0 ]; do
    case "$1" in
        --variant) VARIANT=${2:-}; shift 2 ;;
        --base) BASE=${2:-}; shift 2 ;;
        --tag) TAG=${2:-}; shift 2 ;;
        --engine) ENGINE=${2:-}; shift 2 ;;
        --cuda) CUDA=${2:-}; shift 2 ;;
        --dry-run) DRY=1; shift ;;
        *) usage ;;
    esac
done
case "$VARIANT" in cpu|gpu) ;; *) echo "error: VARIANT=$VARIANT: use VARIANT=cpu or VARIANT=gpu" >&2; exit 2 ;; esac
case "$CUDA" in 12|13) ;; *) echo "error: CUDA=$CUDA: use CUDA=12 or CUDA=13" >&2; exit 2 ;; esac
[ -n "$BASE" ] || { echo "error: BASE is empty: give an image (e.g. debian:bookworm-slim) or BASE=local" >&2; exit 2; }
TAG=${TAG:-localhost/allreduce-train:$VARIANT}
LOCAL_BASE=localhost/allreduce-train-base:bookworm

answers() { command -v "$1" >/dev/null && "$1" info >/dev/null 2>&1; }
if [ "$ENGINE" = auto ]; then
    if answers docker; then ENGINE=docker
    elif answers podman; then ENGINE=podman
    elif command -v buildah >/dev/null; then ENGINE=buildah
    else
        echo "error: no image builder: neither a docker nor a podman service answers and buildah is missing;" \
             "apt-get install buildah (ENGINE=buildah builds without a daemon)" >&2
        exit 1
    fi
fi
case "$ENGINE" in docker|podman|buildah) ;; *) echo "error: ENGINE=$ENGINE: use auto, docker, podman or buildah" >&2; exit 2 ;; esac
engine=("$ENGINE")
[ "$ENGINE" = buildah ] && engine+=(--storage-driver "$STORAGE_DRIVER")

# The Debian mirror apt uses here (first URIs:/deb line that is not security or updates).
mirror() {
    local uri
    uri=$(grep -h -E '^(URIs:|deb )' /etc/apt/sources.list.d/*.sources /etc/apt/sources.list 2>/dev/null \
          | grep -v -E 'security|updates' | grep -o -E 'https?://[^ ]*/debian/?' | head -n1 || true)
    echo "${uri:-http://deb.debian.org/debian}"
}

run() {  # print the command; run it unless --dry-run
    echo "+ $(printf '%q ' "$@" | sed 's/ $//')"
    [ "$DRY" = 1 ] || "$@"
}

if [ "$BASE" = local ]; then
    BASE=$LOCAL_BASE
    if [ "$ENGINE" = buildah ]; then
        # mmdebstrap writes the root file system straight into an empty container's mount
        echo "+ ctr=\$(buildah from scratch); root=\$(buildah mount \$ctr)"
        echo "+ mmdebstrap --variant=apt bookworm \$root $(mirror)"
        echo "+ buildah umount \$ctr && buildah commit \$ctr $LOCAL_BASE && buildah rm \$ctr"
        if [ "$DRY" = 0 ]; then
            ctr=$("${engine[@]}" from scratch)
            root=$("${engine[@]}" mount "$ctr")
            rmdir "$root"  # mmdebstrap wants a missing or empty directory
            mmdebstrap --variant=apt bookworm "$root" "$(mirror)"
            "${engine[@]}" umount "$ctr" >/dev/null
            "${engine[@]}" commit -q "$ctr" "$LOCAL_BASE" >/dev/null
            "${engine[@]}" rm "$ctr" >/dev/null
        fi
    else
        echo "+ mmdebstrap --variant=apt bookworm - $(mirror) | $ENGINE import - $LOCAL_BASE"
        [ "$DRY" = 1 ] || mmdebstrap --variant=apt bookworm - "$(mirror)" | "$ENGINE" import - "$LOCAL_BASE" >/dev/null
    fi
fi

# The `local` build context: what this machine has that the build may not reach.
local_dir=$(mktemp -d /tmp/image-local.XXXXXX)
trap 'rm -rf "$local_dir"' EXIT
mkdir -p "$local_dir/wheels" "$local_dir/cache/wheels"
if [ "$VARIANT" = cpu ]; then
    torch="torch==$(cd tools && python3 -c 'import torch_pip; print(torch_pip.TORCH_VERSION)')"
    echo "+ python3 -m pip download --no-index --no-deps -d $local_dir/wheels ${torch}+cpu  # pip's --find-links, if it has it"
    if [ "$DRY" = 0 ] && ! python3 -m pip download -q --no-index --no-deps -d "$local_dir/wheels" "${torch}+cpu" 2>/dev/null; then
        echo "note: no local ${torch}+cpu wheel; the build asks PyTorch's CPU index (tools/torch_pip.py)" >&2
    fi
    cache=${ALLREDUCE_TRAIN_CACHE:-$HOME/.cache/allreduce_train}/wheels
    echo "+ cp -r $cache/horovod-*_gpu-none_* $local_dir/cache/wheels/  # make install's Horovod wheels, if any"
    if [ "$DRY" = 0 ]; then
        found=0
        for d in "$cache"/horovod-*_gpu-none_*; do
            [ -d "$d" ] && case "$d" in *.tmp.*) ;; *) cp -r "$d" "$local_dir/cache/wheels/"; found=1 ;; esac
        done
        [ "$found" = 1 ] || echo "note: no cached Horovod wheel in $cache; the build compiles it (~7 min on 2 cores)" >&2
    fi
fi
[ ! -f /etc/ssl/certs/ca-certificates.crt ] || run cp /etc/ssl/certs/ca-certificates.crt "$local_dir/ca-certificates.crt"

# BuildKit reads deploy/Dockerfile.dockerignore beside the Dockerfile by itself; buildah and podman are told.
build=(build)
[ "$ENGINE" = docker ] || build+=(--ignorefile deploy/Dockerfile.dockerignore)
[ "$ENGINE" = buildah ] && build=(bud --isolation chroot --ignorefile deploy/Dockerfile.dockerignore)
t=$SECONDS
run "${engine[@]}" "${build[@]}" -f deploy/Dockerfile --build-context "local=$local_dir" \
    --build-arg "BASE=$BASE" --build-arg "VARIANT=$VARIANT" --build-arg "CUDA=$CUDA" -t "$TAG" .
[ "$DRY" = 1 ] && exit 0
size=$("${engine[@]}" images --format '{{.Size}}' "$TAG" | head -n1)
echo "image: $TAG ($ENGINE, VARIANT=$VARIANT, base $BASE) built in $((SECONDS - t)) s; size $size"
