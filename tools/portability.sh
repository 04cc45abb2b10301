#!/usr/bin/env bash
# make portability: the project from a clean copy of HEAD on today's toolchains (docs/portability.md).
#
#   tools/portability.sh [debian13] [cmake4]        (both when none is named)
#
# debian13: a Debian 13 (trixie) root file system (GCC 14, CMake 3.31, Python 3.13, Open MPI 5), made
#   once with mmdebstrap from the Debian mirror this machine's apt uses and kept as a tarball; every
#   run unpacks it afresh and runs, in a chroot, as a new user on plain PyPI would:
#   make install LAB=0, make train, make test-fast. Its pip, apt and Horovod wheel caches persist.
# cmake4: on this machine, with `cmake` 4.x from PyPI first on PATH and a Horovod wheel cache of its
#   own: the same three targets.
# PORTABILITY_TRAIN_ARGS (default --epochs 1) and PORTABILITY_TEST_ARGS go to make train's and
# make test-fast's ARGS.
# Needs root (chroot, mounts) and the network (Debian mirror, PyPI). Each row ends with one line
# "portability: ROW ok|FAILED ..." and the seconds each target took. Not part of make test.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD

cache=${ALLREDUCE_TRAIN_CACHE:-$HOME/.cache/allreduce_train}/portability
train_args=${PORTABILITY_TRAIN_ARGS:---epochs 1}
test_args=${PORTABILITY_TEST_ARGS:-}  # pytest's, for make test-fast ARGS=
rows=("$@")
[ ${#rows[@]} -gt 0 ] || rows=(debian13 cmake4)
for row in "${rows[@]}"; do
    case "$row" in
        debian13|cmake4) ;;
        *) echo "error: unknown row '$row'; use debian13, cmake4 or nothing (both)" >&2; exit 2 ;;
    esac
done
if [ "$(id -u)" -ne 0 ]; then
    echo "error: make portability needs root (mmdebstrap, chroot, mounts); run it as root" >&2
    exit 1
fi
mkdir -p "$cache"

# The Debian mirror apt uses here (first URIs:/deb line), so the chroot needs no other network.
mirror() {
    local uri
    uri=$(grep -h -E '^(URIs:|deb )' /etc/apt/sources.list.d/*.sources /etc/apt/sources.list 2>/dev/null \
          | grep -v -E 'security|updates' | grep -o -E 'https?://[^ ]*/debian/?' | head -n1 || true)
    echo "${uri:-http://deb.debian.org/debian}"
}

# A copy of HEAD as a user gets it from git: tracked files only, nothing built.
clean_copy() {
    mkdir -p "$1"
    git -C "$repo" archive HEAD | tar -x -C "$1"
}

# Refuse to delete a directory something is still mounted under (a /dev bind, say).
remove_tree() {
    if grep -q -F " $1/" /proc/self/mountinfo || grep -q -F " $1 " /proc/self/mountinfo; then
        echo "error: something is still mounted under $1; unmount it (umount -R $1/...) and rerun" >&2
        exit 1
    fi
    rm -rf "$1"
}

# row NAME COMMAND...: runs COMMAND with its output in $cache/NAME.log; prints the row's line.
results=()
row() {
    local name=$1; shift
    local start=$SECONDS status=ok rc
    echo "== portability: $name (log: $cache/$name.log)"
    # errexit inside the row's subshell, not in the caller: a failed row still lets the next one run.
    set +e
    (set -e; "$@") 2>&1 | tee "$cache/$name.log"
    rc=${PIPESTATUS[0]}
    set -e
    [ "$rc" -eq 0 ] || status=FAILED
    local times
    times=$(grep -E '^portability-step ' "$cache/$name.log" | sed 's/^portability-step //' | paste -sd ' ' || true)
    results+=("portability: $name $status in $((SECONDS - start)) s ($times)")
    echo "${results[-1]}"
}

# The targets, timed; runs in the copy's root (used inside the chroot and here alike).
targets_script='
set -euo pipefail
step() { local t=$SECONDS; "$@"; echo "portability-step $2=$((SECONDS - t))s"; }
echo "portability-tools: $(uname -m) $(. /etc/os-release; echo "$PRETTY_NAME"); $(g++ --version | head -n1);" \
     "$(cmake --version | head -n1); $(python3 --version)"
step make install LAB=0
echo "portability-torch: $(.venv/bin/python -c "import torch; print(torch.__version__, \"cuda\", torch.version.cuda)")," \
     "venv $(du -sm .venv | cut -f1) MB"
step make train ARGS="$1"
step make test-fast ARGS="$2"
'

debian13() {
    local tarball=$cache/debian13-rootfs.tar root=$cache/debian13-root
    if [ ! -f "$tarball" ]; then
        command -v mmdebstrap >/dev/null || { echo "error: mmdebstrap is missing; apt-get install mmdebstrap" >&2; return 1; }
        local t=$SECONDS
        # patch: build_horovod.sh applies the patches; the rest is what a Debian user's build needs.
        mmdebstrap --variant=apt \
            --include=python3,python3-venv,python3-dev,g++,cmake,make,git,ca-certificates,patch \
            trixie "$cache/debian13-rootfs.tmp.tar" "$(mirror)"
        mv "$cache/debian13-rootfs.tmp.tar" "$tarball"
        echo "portability-step mmdebstrap=$((SECONDS - t))s ($(du -sm "$tarball" | cut -f1) MB)"
    fi
    remove_tree "$root"
    mkdir -p "$root"
    tar -xf "$tarball" -C "$root"
    cp /etc/resolv.conf "$root/etc/resolv.conf"
    # This machine's network: its CA bundle (local CAs included) and pip's pointer to it, as any
    # machine here has them; nothing else of its pip configuration (no local wheels, no constraints).
    cp /etc/ssl/certs/ca-certificates.crt "$root/etc/ssl/certs/ca-certificates.crt"
    [ ! -f /etc/pip.conf ] || cp /etc/pip.conf "$root/etc/pip.conf"
    clean_copy "$root/root/allreduce_train"
    # Persistent between runs: pip's and the project's caches (~/.cache: the Horovod wheels) and apt's.
    mkdir -p "$cache/debian13-home-cache" "$cache/debian13-apt-archives" "$root/root/.cache"
    # A private mount namespace: whatever happens, the mounts end with it; the trap unmounts them anyway.
    unshare --mount --propagation private --fork bash -euo pipefail -c '
        root=$1; cache=$2
        trap "umount -R \"\$root/var/cache/apt/archives\" \"\$root/root/.cache\" \"\$root/dev\" \"\$root/sys\" \"\$root/proc\" 2>/dev/null || true" EXIT
        mount -t proc proc "$root/proc"
        mount -t sysfs sys "$root/sys"
        mount --rbind /dev "$root/dev"          # /dev/shm for Open MPI'"'"'s shared memory, /dev/pts
        mount --bind "$cache/debian13-home-cache" "$root/root/.cache"
        mount --bind "$cache/debian13-apt-archives" "$root/var/cache/apt/archives"
        # A new user: no pip configuration of this machine, nothing of its environment.
        chroot "$root" env -i HOME=/root PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
            LANG=C.UTF-8 TERM=dumb bash -c "cd /root/allreduce_train && bash -c \"\$1\" - \"\$2\" \"\$3\"" - "$3" "$4" "$5"
    ' - "$root" "$cache" "$targets_script" "$train_args" "$test_args"
}

cmake4() {
    local work=$cache/cmake4-work tools=$cache/cmake4-tools
    # cmake 4.x from PyPI, alone on PATH (not its venv's python).
    if [ ! -x "$tools/venv/bin/cmake" ]; then
        python3 -m venv "$tools/venv"
        "$tools/venv/bin/python" -m pip install -q "cmake>=4,<5"
    fi
    mkdir -p "$tools/bin"
    ln -sf "$tools/venv/bin/cmake" "$tools/bin/cmake"
    remove_tree "$work"
    clean_copy "$work"
    (cd "$work" && PATH="$tools/bin:$PATH" ALLREDUCE_TRAIN_CACHE="$cache/cmake4-cache" \
        bash -c "$targets_script" - "$train_args" "$test_args")
}

for r in "${rows[@]}"; do
    row "$r" "$r"
done
printf '%s\n' "${results[@]}"
! printf '%s\n' "${results[@]}" | grep -q FAILED
