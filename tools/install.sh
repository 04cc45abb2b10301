#!/usr/bin/env bash
# One-time set-up, safe to re-run (make install calls it only when an input changed):
# Debian packages, the .venv with the pinned torch (CPU build unless TORCH_VARIANT=cuda), the
# project, and a patched Horovod.
#
#   LAB=0            only what training needs: no Chromium, libx11-6 or Slurm daemons, which the
#                    lab's checks use (make tb-check, tests/launch/test_hwloc.py, the emulated Slurm
#                    cluster); their tests skip without them
#   TORCH_VARIANT=cpu|cuda   torch's CPU build (default; tools/torch_pip.py says from where) or
#                    PyPI's default CUDA build
set -euo pipefail
cd "$(dirname "$0")/.."

LAB=${LAB:-1}
case "$LAB" in
    0|1) ;;
    *) echo "error: LAB=$LAB; use LAB=1 (the lab's packages too, the default) or LAB=0 (training only)" >&2; exit 1 ;;
esac
# procps: pgrep, which deploy/worker-entrypoint.sh uses (tests/launch/test_k8s.py runs it).
apt_pkgs=(openmpi-bin libopenmpi-dev cmake dataset-fashion-mnist iproute2 procps)
slurm_pkgs=()
if [ "$LAB" = 1 ]; then
    # libx11-6: Xlib, so that tests/launch/test_hwloc.py can show that mpirun no longer hangs on hwloc's
    # X probe next to TensorBoard (any desktop has it; HWLOC_COMPONENTS=-gl is what keeps mpirun safe).
    apt_pkgs+=(chromium libx11-6)
    # The emulated Slurm cluster (lab/emulation/slurm_cluster.py), without recommends (a mail server, ...).
    slurm_pkgs=(slurmctld slurmd slurm-client munge)
fi
missing=()
slurm_missing=()
for p in "${apt_pkgs[@]}" "${slurm_pkgs[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" && continue
    case " ${slurm_pkgs[*]} " in *" $p "*) slurm_missing+=("$p") ;; *) missing+=("$p") ;; esac
done
if [ ${#missing[@]} -gt 0 ] || [ ${#slurm_missing[@]} -gt 0 ]; then
    if [ "$(id -u)" -ne 0 ]; then
        echo "error: missing Debian packages; run: sudo apt-get update && sudo apt-get install -y ${missing[*]}" \
             "${slurm_missing[*]:+&& sudo apt-get install -y --no-install-recommends ${slurm_missing[*]}}" >&2
        exit 1
    fi
    echo "installing Debian packages: ${missing[*]} ${slurm_missing[*]}"
    apt-get update -qq
    [ ${#missing[@]} -eq 0 ] || DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}"
    [ ${#slurm_missing[@]} -eq 0 ] || \
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${slurm_missing[@]}"
fi

PYTHON=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
PY=.venv/bin/python
"$PY" -m pip install -q --upgrade pip setuptools wheel
# torch first and pinned, so that nothing later pulls another build: the CPU one unless
# TORCH_VARIANT=cuda (a local +cpu file, else PyTorch's CPU index, else one line says why not).
torch_pip=$("$PY" tools/torch_pip.py --python "$PY")
mapfile -t torch_pip <<<"$torch_pip"
"$PY" -m pip install -q "${torch_pip[@]}"
# mpi4py from source so that it links the same Open MPI as Horovod (a PyPI binary wheel may
# carry or expect another MPI).
"$PY" -m pip install -q --no-binary mpi4py "mpi4py>=4.0"
"$PY" -m pip install -q -e ".[dev,build]"
PY="$PY" tools/build_horovod.sh
