#!/usr/bin/env bash
# The pods' plumbing without a cluster (docs/kubernetes.md, "What was verified"): two network
# namespaces stand in for the launcher pod and one worker pod, joined by a veth pair. As a non-root
# user (uid 1000, like the image's mpiuser), the worker runs deploy/worker-entrypoint.sh with a real
# sshd configured as deploy/sshd_config; the launcher runs deploy/launcher-entrypoint.sh with the
# mpirun line `python -m launch k8s` renders, and Open MPI reads a hostfile and ssh options from the
# environment, as the operators set them. The hostfile is the operator's (launch.k8s.hostfile: DNS
# names, in its order; Trainer's lists the node pod before the launcher), and the names resolve
# through each pod's /etc/hosts, as the cluster's DNS would answer them. After the ranks have written
# a checkpoint it sends SIGTERM to the launcher entrypoint, as Kubernetes does to a pod it stops,
# reports how the job ended, then starts the launcher again, as the operator would, which resumes
# (--resume auto) and finishes.
#
#   sudo SSHD=/path/to/sshd [STOP=worker] tools/k8s_pod_check.sh [trainer arguments]
#   sudo IMAGE=localhost/allreduce-train:cpu [LAYOUT=...] tools/k8s_pod_check.sh [trainer arguments]
#
# IMAGE=TAG: the pods run from that image's own root file system (make image; a buildah container
# of it, mounted; STORAGE_DRIVER, default vfs): its Python, sshd, ssh client configuration,
# entrypoints and user, each pod chrooted in its own mount namespace with its own /proc, /dev/shm
# and /tmp. Without IMAGE, this checkout's tree and .venv and the given SSHD binary.
# STOP=worker sends the SIGTERM to the worker pod's entrypoint instead (a worker pod evicted alone).
# LAYOUT=mpijob (default): the launcher runs only mpirun, the worker's 2 slots run the ranks.
# LAYOUT=trainjob: the launcher is a node too (Trainer's runLauncherAsNode), 1 slot in each pod, the
# node pod first in the hostfile (so rank 0 runs there), and the trainer expects 2 hosts. Each pod
# has its own hostname (a UTS namespace), as pods do.
# HOSTFILE=unread: the launcher's environment does not name the hostfile (as with an Open MPI that
# reads other variables), so mpirun starts every rank in the launcher pod; with LAYOUT=trainjob the
# trainer must then refuse to train (--expect-hosts 2: one line, exit 2).
#
# Needs root (namespaces, mounts), iproute2, setpriv, ssh-keygen, and an sshd binary (Debian's
# openssh-server; `apt-get download openssh-server && dpkg -x` is enough, no service is installed or
# started) or IMAGE and buildah. Everything it creates is removed on exit.
set -euo pipefail
cd "$(dirname "$0")/.."
IMAGE=${IMAGE:-}
[ -n "$IMAGE" ] || : "${SSHD:?set SSHD to an sshd binary, or IMAGE to a built image (make image)}"
STORAGE_DRIVER=${STORAGE_DRIVER:-vfs}
PY=${PY:-$PWD/.venv/bin/python}
RUNAS=${RUNAS:-1000}
LAYOUT=${LAYOUT:-mpijob}
case "$LAYOUT" in mpijob|trainjob) ;; *) echo "error: LAYOUT=$LAYOUT: use mpijob or trainjob" >&2; exit 2 ;; esac
HOSTFILE=${HOSTFILE:-read}
case "$HOSTFILE" in read|unread) ;; *) echo "error: HOSTFILE=$HOSTFILE: use read or unread" >&2; exit 2 ;; esac
L=k8scheck-launcher W=k8scheck-worker0
LAUNCHER_IP=10.250.0.1 WORKER_IP=10.250.0.2
APP=/opt/allreduce_train  # launch.k8s.APP_DIR

work=$(mktemp -d /tmp/k8s_pod_check.XXXXXX)
pids=()
ctr=""
cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    sleep 1
    for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done
    ip netns del "$L" 2>/dev/null || true
    ip netns del "$W" 2>/dev/null || true
    rm -rf "/etc/netns/$L" "/etc/netns/$W"
    rmdir /etc/netns 2>/dev/null || true  # only if no one else keeps files there
    if [ -n "$ctr" ]; then
        buildah --storage-driver "$STORAGE_DRIVER" umount "$ctr" >/dev/null 2>&1 || true
        buildah --storage-driver "$STORAGE_DRIVER" rm "$ctr" >/dev/null 2>&1 || true
    fi
    rm -rf "$work"
}
trap cleanup EXIT

ip netns add "$L"
ip netns add "$W"
ip link add k8scheck-l type veth peer name k8scheck-w
ip link set k8scheck-l netns "$L"
ip link set k8scheck-w netns "$W"
ip -n "$L" addr add "$LAUNCHER_IP/30" dev k8scheck-l
ip -n "$W" addr add "$WORKER_IP/30" dev k8scheck-w
for ns in "$L" "$W"; do ip -n "$ns" link set lo up; done
ip -n "$L" link set k8scheck-l up
ip -n "$W" link set k8scheck-w up

# The job as the operator names it: the pods' hostnames, the hostfile (launch.k8s.hostfile: the
# operator's order and DNS names), each pod's /etc/hosts, the launcher's environment and its mpirun
# line for 1 worker x 2 slots or 2 pods x 1 (with --name allreduce-train --resume auto --expect-hosts N).
run_dir=()
[ -n "$IMAGE" ] || run_dir=(--run-dir "$work/runs")
"$PY" tools/k8s_pod_job.py "$work" "$LAYOUT" "${run_dir[@]}" "$@"
mapfile -t cmd <"$work/cmd"
{ read -r launcher_host; read -r worker_host; } <"$work/pods"
echo "+ ${cmd[*]}"
echo "--- the operator's hostfile (names resolved through each pod's /etc/hosts)"
sed 's/^/    /' "$work/hostfile"

# the job's Secret as the operators make it: one key pair, the public key authorized, the private key
# also the sshd host key (deploy/sshd_config)
mkdir -p "$work/ssh" "$work/runs"
ssh-keygen -q -t ecdsa -N "" -f "$work/ssh/id_rsa"
cp "$work/ssh/id_rsa.pub" "$work/ssh/authorized_keys"

if [ -n "$IMAGE" ]; then
    # the image's root file system, one container of it for both pods: the Secret at sshAuthMountPath,
    # the hostfile where the operators mount it, the pods' names in /etc/hosts
    ctr=$(buildah --storage-driver "$STORAGE_DRIVER" from --pull-never "$IMAGE")
    root=$(buildah --storage-driver "$STORAGE_DRIVER" mount "$ctr")
    echo "--- the pods run from $IMAGE (container $ctr)"
    mkdir -p "$root/home/mpiuser/.ssh" "$root/etc/mpi"
    cp -a "$work/ssh/." "$root/home/mpiuser/.ssh/"
    chown -R 1000:1000 "$root/home/mpiuser/.ssh"
    chmod 600 "$root/home/mpiuser/.ssh/id_rsa"
    cp "$work/hostfile" "$root/etc/mpi/hostfile"
    cp "$work/hosts" "$root/etc/hosts"
    hostfile_path=/etc/mpi/hostfile
    run="$root$APP/runs/allreduce-train"
else
    mkdir -p "/etc/netns/$L" "/etc/netns/$W"  # ip netns exec binds these over /etc/hosts
    cp "$work/hosts" "/etc/netns/$L/hosts"
    cp "$work/hosts" "/etc/netns/$W/hosts"
    printf '%s\n' "Port 2222" "PidFile $work/sshd.pid" "HostKey $work/ssh/id_rsa" "StrictModes no" \
        "AuthorizedKeysFile $work/ssh/authorized_keys" "ListenAddress $WORKER_IP" >"$work/sshd_config"
    printf '%s\n' "Host *" "    StrictHostKeyChecking no" "    UserKnownHostsFile /dev/null" "    Port 2222" \
        "    IdentityFile $work/ssh/id_rsa" "    LogLevel ERROR" >"$work/ssh_config"
    hostfile_path=$work/hostfile
    # this checkout's Python in place of the image's
    for i in "${!cmd[@]}"; do [ "${cmd[$i]}" != "$APP/.venv/bin/python" ] || cmd[$i]=$PY; done
    run="$work/runs/allreduce-train"
fi
chown -R "$RUNAS" "$work"
chmod 755 "$work"

pod() {  # $1: the pod's namespace, $2: its hostname, then the command to run there as $RUNAS
    local ns=$1 host=$2
    shift 2
    if [ -n "$IMAGE" ]; then
        # a mount namespace per pod: its own /proc, /dev/shm (Open MPI's shared memory) and /tmp
        exec ip netns exec "$ns" unshare --uts --mount --propagation private -- sh -c '
            root=$1 host=$2 uid=$3; shift 3
            hostname "$host"
            mount -t proc proc "$root/proc" && mount --rbind /dev "$root/dev" && mount --rbind /sys "$root/sys"
            mount -t tmpfs -o size=2g shm "$root/dev/shm" && mount -t tmpfs tmp "$root/tmp"
            exec chroot --userspec="$uid:$uid" "$root" "$@"' sh "$root" "$host" "$RUNAS" \
            env -i -C "$APP" HOME=/home/mpiuser HOSTNAME="$host" "$@"
    else
        exec ip netns exec "$ns" unshare --uts -- \
            sh -c 'hostname "$1" && shift && exec setpriv --reuid="$0" --regid="$0" --clear-groups -- "$@"' \
            "$RUNAS" "$host" "$@"
    fi
}

start_worker() {  # the worker pod (a TrainJob's node pod): its entrypoint and sshd
    if [ -n "$IMAGE" ]; then
        (pod "$W" "$worker_host" PATH="$APP/.venv/bin:/usr/local/bin:/usr/bin:/bin" SSHD_PORT=2222 \
            "$APP/deploy/worker-entrypoint.sh") &
    else
        (pod "$W" "$worker_host" env HOME="$work" SSHD="$SSHD" SSHD_CONFIG="$work/sshd_config" \
            LD_LIBRARY_PATH="${SSHD_LIBS:-}" deploy/worker-entrypoint.sh) &
    fi
    worker=$!
    pids+=($worker)
    for _ in $(seq 100); do ip netns exec "$W" bash -c "exec 3<>/dev/tcp/$WORKER_IP/2222" 2>/dev/null && break; sleep 0.2; done
}

start_launcher() {  # the launcher pod's container; $1: log file
    local env=() i
    mapfile -t env <"$work/launcher.env"
    [ "$HOSTFILE" = unread ] || env+=(OMPI_MCA_orte_default_hostfile="$hostfile_path")
    if [ -n "$IMAGE" ]; then
        (pod "$L" "$launcher_host" PATH="$APP/.venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin" \
            "${env[@]}" "$APP/deploy/launcher-entrypoint.sh" "${cmd[@]}" >"$1" 2>&1) &
    else
        for i in "${!env[@]}"; do  # this checkout's ssh options in place of the image's /etc/ssh/ssh_config
            case "${env[$i]}" in OMPI_MCA_plm_rsh_args=*) env[$i]="${env[$i]} -F $work/ssh_config" ;; esac
        done
        (pod "$L" "$launcher_host" env HOME="$work" PATH="$PATH" "${env[@]}" \
            deploy/launcher-entrypoint.sh "${cmd[@]}" >"$1" 2>&1) &
    fi
    launcher=$!
    pids+=($launcher)
}

start_worker
start_launcher "$work/launcher1.log"
# trained and checkpointed at least once (--checkpoint-every 20)
for _ in $(seq 1200); do
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
