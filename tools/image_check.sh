#!/usr/bin/env bash
# What a built image holds and must not hold (docs/kubernetes.md, "The image"), read from its own
# root file system: a buildah container of it, mounted (STORAGE_DRIVER, default vfs), and its
# programs run there with chroot (no OCI runtime is needed).
#
#   sudo tools/image_check.sh [IMAGE]        (default localhost/allreduce-train:cpu)
#
# Asserts, for VARIANT=cpu: the venv's torch is the CPU build (torch.version.cuda is None, no nvidia-*
# or CUDA libraries anywhere), Horovod and mpi4py import and Horovod has MPI; no Chromium and no Slurm
# daemons (LAB=0); sshd, ssh, mpirun and orted, the entrypoints, mpiuser as uid 1000, the runs/
# directory it owns. Prints the image's size and its largest parts. Exit 1 with the failed checks.
set -euo pipefail
IMAGE=${1:-localhost/allreduce-train:cpu}
STORAGE_DRIVER=${STORAGE_DRIVER:-vfs}
APP=/opt/allreduce_train
b=(buildah --storage-driver "$STORAGE_DRIVER")

ctr=$("${b[@]}" from --pull-never "$IMAGE")
trap '"${b[@]}" umount "$ctr" >/dev/null 2>&1 || true; "${b[@]}" rm "$ctr" >/dev/null 2>&1 || true' EXIT
root=$("${b[@]}" mount "$ctr")
echo "image $IMAGE: $("${b[@]}" images --format '{{.Size}}' "$IMAGE" | head -n1) (buildah images);" \
     "root file system $(du -sm --exclude=proc "$root" | cut -f1) MB (du -sm)"
echo "  largest: $(cd "$root" && du -sm usr/lib/x86_64-linux-gnu "${APP#/}/.venv" "${APP#/}/.venv/lib/python3.11/site-packages/torch" var usr/share 2>/dev/null | sort -rn | awk '{printf "%s %s MB; ", $2, $1}')"

failed=0
check() {  # $1: what, then the command (run on the host, over $root)
    local what=$1
    shift
    if "$@" >/dev/null 2>&1; then echo "  ok: $what"; else echo "  FAILED: $what"; failed=1; fi
}
in_image() { chroot "$root" "$@"; }
absent() { ! in_image sh -c "command -v $1"; }
no_files() { [ -z "$(find "$root/usr" "$root/opt" "$root/lib" -name "$1" -print -quit 2>/dev/null)" ]; }

check "torch is the CPU build (torch.version.cuda is None)" \
    in_image "$APP/.venv/bin/python" -c "import torch, sys; sys.exit(torch.version.cuda is not None or '+cpu' not in torch.__version__)"
check "Horovod imports and was built with MPI" \
    in_image "$APP/.venv/bin/python" -c "import horovod.torch as hvd, sys; sys.exit(not hvd.mpi_built())"
check "mpi4py and the trainer import" in_image "$APP/.venv/bin/python" -c "import mpi4py.MPI, allreduce_train"
check "no nvidia-* or CUDA Python packages" \
    sh -c "! ls '$root$APP/.venv/lib/python3.11/site-packages' | grep -i -E '^(nvidia|cuda|triton)'"
check "no CUDA runtime, driver or NCCL library" sh -c "$(declare -f no_files); root='$root'; no_files 'libcudart*' && no_files 'libcuda.so*' && no_files 'libnccl*' && no_files 'libcublas*'"
check "no Chromium" sh -c "$(declare -f in_image absent); root='$root'; absent chromium && absent chromium-browser && [ ! -e '$root/usr/lib/chromium' ]"
check "no Slurm daemons (slurmd, slurmctld, munged)" sh -c "$(declare -f in_image absent); root='$root'; absent slurmd && absent slurmctld && absent munged"
check "sshd, ssh, mpirun and orted are there" in_image sh -c "command -v ssh && command -v mpirun && command -v orted && test -x /usr/sbin/sshd"
check "the entrypoints are executable" test -x "$root$APP/deploy/launcher-entrypoint.sh" -a -x "$root$APP/deploy/worker-entrypoint.sh"
check "mpiuser is uid 1000 and owns runs/" sh -c "grep -q '^mpiuser:x:1000:1000:' '$root/etc/passwd' && [ \"\$(stat -c %u '$root$APP/runs')\" = 1000 ]"
check "no .git, no host .venv-gpu, no runs of the host" sh -c "[ ! -e '$root$APP/.git' ] && [ ! -e '$root$APP/.venv-gpu' ] && [ -z \"\$(ls -A '$root$APP/runs')\" ]"
check "the build's local context left nothing (/tmp/local, /tmp/build-cache)" sh -c "[ ! -e '$root/tmp/local/wheels' ] && [ ! -e '$root/tmp/build-cache' ]"
echo "  torch $(in_image "$APP/.venv/bin/python" -c 'import torch; print(torch.__version__)'), $(in_image mpirun --version | head -n1), $(in_image /usr/sbin/sshd -V 2>&1 | head -n1)"
exit "$failed"
