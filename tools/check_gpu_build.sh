#!/usr/bin/env bash
# make check-gpu-build [CUDA=12|13]: build the GPU venv (make install-gpu) on this machine, which has no GPU, and
# check what can be checked without one:
#   1. horovodrun --check-build lists NCCL among the tensor operations;
#   2. import horovod.torch works and reports NCCL and CUDA built in;
#   3. the trainer with --device auto, 2 ranks under mpirun, prints ONE line that no GPU was found
#      and trains on the CPU.
# Not part of make test: the first run downloads ~4 GB and compiles Horovod with nvcc (docs/gpu.md
# has the times). Exits non-zero on the first failed check.
set -euo pipefail
cd "$(dirname "$0")/.."
. tools/gpu_common.sh
# The same CUDA choice as install-gpu (--cuda 12|13, else the driver's), so the same venv.
[ "${1:-}" = --cuda ] && { choice=${2:-}; shift 2 || true; }
decision=$(cuda_major_for "${choice:-}" "$(nvidia_driver_version)")
VENV=$(gpu_venv "${decision%% *}")
export HWLOC_COMPONENTS=-gl  # hwloc's GL plugin probes X displays (a hang, README)
t0=$SECONDS

log "make install-gpu"
bash tools/install_gpu.sh --cuda "${decision%% *}"
t_install=$((SECONDS - t0))
log "install-gpu took ${t_install} s"

log "check 1/3: horovodrun --check-build"
build=$("$VENV/bin/horovodrun" --check-build)
echo "$build"
grep -Eq '\[X\] NCCL' <<<"$build" || die "horovodrun --check-build does not list NCCL as built"
grep -Eq '\[X\] PyTorch' <<<"$build" || die "horovodrun --check-build does not list PyTorch as built"

log "check 2/3: import horovod.torch"
"$VENV/bin/python" - <<'PY'
import torch
import horovod
import horovod.torch as hvd
built = {"NCCL": hvd.nccl_built(), "CUDA": hvd.cuda_built(), "MPI": hvd.mpi_built(), "Gloo": hvd.gloo_built()}
print(f"horovod {horovod.__version__} on torch {torch.__version__} (CUDA {torch.version.cuda}):",
      ", ".join(f"{k} {v}" for k, v in built.items()), f"; GPU visible: {torch.cuda.is_available()}")
missing = [k for k, v in built.items() if not v]
if missing:
    raise SystemExit(f"error: horovod.torch was built without {', '.join(missing)}")
PY

log "check 3/3: the trainer, --device auto, 2 ranks, on a machine without a GPU"
runs=$(mktemp -d)
trap 'rm -rf "$runs"' EXIT
set +e
out=$("$VENV/bin/python" -m launch -np 2 -- --model lenet5 --dataset synthetic --synthetic-samples 512 \
    --steps 6 --device auto --run-dir "$runs" --name gpucheck --threads 1 --no-tensorboard --no-progress 2>&1)
rc=$?
set -e
echo "$out" | tail -8
[ $rc = 0 ] || die "the trainer failed (exit $rc)"
n=$(grep -c 'no GPU found' <<<"$out" || true)
[ "$n" = 1 ] || die "expected one 'no GPU found' line from the job, got $n"
grep -q '^done: ' <<<"$out" || grep -q 'done: 6 steps' <<<"$out" || die "the trainer did not report its 6 steps"
[ -f "$runs/gpucheck/metrics.json" ] || die "no metrics.json in the run directory"
log "all checks passed in $((SECONDS - t0)) s (install-gpu ${t_install} s)"
