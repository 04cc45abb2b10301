#!/usr/bin/env bash
# The pods' plumbing without a cluster (docs/kubernetes.md, "What was verified"): two network
# namespaces stand in for the launcher pod and one worker pod, joined by a veth pair. As a non-root
# user (uid 1000, like the image's mpiuser), the worker runs deploy/worker-entrypoint.sh with a real
# sshd configured as deploy/sshd_config; the launcher runs deploy/launcher-entrypoint.sh with the
# mpirun line `python -m launch k8s` renders, and Open MPI reads a hostfile and ssh options from the
# environment, as mpi-operator sets them. After the ranks have written a checkpoint it sends SIGTERM
# to the launcher entrypoint, as Kubernetes does to a pod it stops, reports how the job ended, then
# starts the launcher again, as the operator would, which resumes (--resume auto) and finishes.
#
#   sudo SSHD=/path/to/sshd [STOP=worker] tools/k8s_pod_check.sh [trainer arguments]
#
# STOP=worker sends the SIGTERM to the worker pod's entrypoint instead (a worker pod evicted alone).
# LAYOUT=mpijob (default): the launcher runs only mpirun, the worker's 2 slots run the ranks.
# LAYOUT=trainjob: the launcher is a node too (Trainer's runLauncherAsNode), 1 slot in each pod, and
# the trainer expects 2 hosts. Each pod has its own hostname (a UTS namespace), as pods do.
# HOSTFILE=unread: the launcher's environment does not name the hostfile (as with an Open MPI that
# reads other variables), so mpirun starts every rank in the launcher pod; with LAYOUT=trainjob the
# trainer must then refuse to train (--expect-hosts 2: one line, exit 2).
#
# Needs root (namespaces), iproute2, setpriv, ssh-keygen and an sshd binary (Debian's openssh-server;
# `apt-get download openssh-server && dpkg -x` is enough, no service is installed or started).
# Everything it creates is removed on exit.
set -euo pipefail
cd "$(dirname "$0")/.."
: "${SSHD:?set SSHD to an sshd binary}"
PY=${PY:-$PWD/.venv/bin/python}
RUNAS=${RUNAS:-1000}
LAYOUT=${LAYOUT:-mpijob}
case "$LAYOUT" in mpijob|trainjob) ;; *) echo "error: LAYOUT=$LAYOUT: use mpijob or trainjob" >&2; exit 2 ;; esac
HOSTFILE=${HOSTFILE:-read}
case "$HOSTFILE" in read|unread) ;; *) echo "error: HOSTFILE=$HOSTFILE: use read or unread" >&2; exit 2 ;; esac
L=k8scheck-launcher W=k8scheck-worker0
WORKER_IP=10.250.0.2

work=$(mktemp -d /tmp/k8s_pod_check.XXXXXX)
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    sleep 1
    for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done
    ip netns del "$L" 2>/dev/null || true
    ip netns del "$W" 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT

ip netns add "$L"
ip netns add "$W"
ip link add k8scheck-l type veth peer name k8scheck-w
ip link set k8scheck-l netns "$L"
ip link set k8scheck-w netns "$W"
ip -n "$L" addr add 10.250.0.1/30 dev k8scheck-l
ip -n "$W" addr add "$WORKER_IP/30" dev k8scheck-w
for ns in "$L" "$W"; do ip -n "$ns" link set lo up; done
ip -n "$L" link set k8scheck-l up
ip -n "$W" link set k8scheck-w up

# the job's Secret as mpi-operator makes it: one key pair, the public key authorized, the private key
# also the sshd host key (deploy/sshd_config)
mkdir -p "$work/ssh" "$work/runs"
ssh-keygen -q -t ecdsa -N "" -f "$work/ssh/id_rsa"
cp "$work/ssh/id_rsa.pub" "$work/ssh/authorized_keys"
cat >"$work/sshd_config" <<EOF
Port 2222
PidFile $work/sshd.pid
HostKey $work/ssh/id_rsa
StrictModes no
AuthorizedKeysFile $work/ssh/authorized_keys
ListenAddress $WORKER_IP
EOF
cat >"$work/ssh_config" <<EOF
Host *
    StrictHostKeyChecking no
    UserKnownHostsFile /dev/null
    Port 2222
    IdentityFile $work/ssh/id_rsa
    LogLevel ERROR
EOF
# the hostfile the operator writes: the worker pod's slots, and with runLauncherAsNode the launcher's first
if [ "$LAYOUT" = trainjob ]; then
    printf '10.250.0.1 slots=1\n%s slots=1\n' "$WORKER_IP" >"$work/hostfile"
else
    echo "$WORKER_IP slots=2" >"$work/hostfile"
fi
chown -R "$RUNAS" "$work"
chmod 755 "$work"

as_user() {  # $1: the pod's namespace, $2: its hostname, then the command to run there as $RUNAS
    local ns=$1 host=$2
    shift 2
    exec ip netns exec "$ns" unshare --uts -- \
        sh -c 'hostname "$1" && shift && exec setpriv --reuid="$0" --regid="$0" --clear-groups -- "$@"' "$RUNAS" "$host" "$@"
}

start_worker() {  # the worker pod: its entrypoint and sshd
    (as_user "$W" pod-worker-0 env HOME="$work" SSHD="$SSHD" SSHD_CONFIG="$work/sshd_config" LD_LIBRARY_PATH="${SSHD_LIBS:-}" \
        deploy/worker-entrypoint.sh) &
    worker=$!
    pids+=($worker)
    for _ in $(seq 50); do ip netns exec "$W" bash -c "exec 3<>/dev/tcp/$WORKER_IP/2222" 2>/dev/null && break; sleep 0.2; done
}

start_launcher() {  # the launcher pod's container; $1: log file
    local hostfile=()
    [ "$HOSTFILE" = unread ] || hostfile=(OMPI_MCA_orte_default_hostfile="$work/hostfile")
    (as_user "$L" pod-launcher env HOME="$work" PATH="$PATH" HWLOC_COMPONENTS=-gl "${hostfile[@]}" \
        OMPI_MCA_plm_rsh_args="-F $work/ssh_config" OMPI_MCA_orte_keep_fqdn_hostnames=true \
        deploy/launcher-entrypoint.sh "${cmd[@]}" >"$1" 2>&1) &
    launcher=$!
    pids+=($launcher)
}

# the launcher's line for 1 worker x 2 slots, or 2 pods x 1 (with --name allreduce-train --resume auto
# --expect-hosts N), this checkout's Python in place of the image's, and the run directory in $work
mapfile -t cmd < <("$PY" - "$PY" "$work/runs" "$LAYOUT" "$@" <<'EOF'
import sys
from launch import k8s
pods, slots = (2, 1) if sys.argv[3] == "trainjob" else (1, 2)
spec = k8s.K8sSpec(api=sys.argv[3], workers=pods, slots_per_worker=slots,
                   trainer_args=["--dataset", "synthetic", "--steps", "2000", "--log-every", "5", "--no-progress",
                                 "--checkpoint-every", "20", "--run-dir", sys.argv[2], *sys.argv[4:]])
print("\n".join(sys.argv[1] if a == k8s.PYTHON else a for a in k8s.mpirun_command(spec)))
EOF
)
echo "+ ${cmd[*]}"
run="$work/runs/allreduce-train"

start_worker
start_launcher "$work/launcher1.log"
# trained and checkpointed at least once (--checkpoint-every 20)
for _ in $(seq 600); do
    [ -e "$run/checkpoint.pt" ] || ! kill -0 "$launcher" 2>/dev/null && break
    sleep 0.5
done
if [ "$HOSTFILE" = unread ]; then
    status=0
    wait "$launcher" || status=$?
    echo "--- the hostfile unread: the launcher's exit status $status (2: the trainer refused to train)"
    grep -h -e "ranks on" -e "error" -e "from step" -e "^done" "$work/launcher1.log" | sed 's/^/    /'
    [ "$status" = 2 ]
    exit
fi
if ! kill -0 "$launcher" 2>/dev/null; then
    echo "the launcher ended before a checkpoint was written:"
    tail -n 20 "$work/launcher1.log"
    exit 1
fi
if [ "${STOP:-launcher}" = worker ]; then
    echo "ranks are training; SIGTERM to the worker entrypoint (the worker pod is stopped)"
    kill -TERM "$worker"
else
    echo "ranks are training; SIGTERM to the launcher entrypoint (the launcher pod is stopped)"
    kill -TERM "$launcher"
fi
status=0
wait "$launcher" || status=$?
echo "--- first launcher: output (last 12 lines), exit status $status"
tail -n 12 "$work/launcher1.log"

if [ "${STOP:-launcher}" = worker ]; then
    status=0
    wait "$worker" || status=$?
    echo "--- the worker entrypoint: exit status $status (75: a Job replaces the pod rather than count it done)"
    start_worker  # the operator recreates the worker pod
fi
echo "--- the launcher restarted (as the operator restarts it); it runs to the end"
start_launcher "$work/launcher2.log"
status=0
wait "$launcher" || status=$?
grep -h -e "from step" -e "ranks on" "$work/launcher1.log" "$work/launcher2.log" | sed 's/^/    /'
tail -n 3 "$work/launcher2.log"
echo "--- second launcher: exit status $status"
