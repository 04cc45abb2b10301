#!/usr/bin/env bash
# The entrypoint of a pod that runs ranks through ssh (an MPIJob's worker, a TrainJob's node): runs
# sshd in the foreground (the launcher's mpirun starts this pod's ranks through it) and, on the pod's
# SIGTERM, asks the ranks it started to checkpoint and exit (SIGUSR1, as Open MPI would forward it),
# then waits for them before stopping sshd: rank 0 may live here and must finish writing the
# checkpoint within terminationGracePeriodSeconds. Only processes below this sshd are signalled.
# A stopped pod exits 75 (preempted), not 0: a Job would count 0 as this pod's work done and not
# replace it, and the restarted launcher would find no sshd there.
set -u
port=${SSHD_PORT:-2222}
config=${SSHD_CONFIG:-$HOME/.sshd_config}
sshd=${SSHD:-/usr/sbin/sshd}  # tests put a stand-in here

descendants() {
    local p
    for p in $(pgrep -P "$1"); do
        echo "$p"
        descendants "$p"
    done
}

ranks() {
    local p
    for p in $(descendants "$server"); do
        tr '\0' ' ' 2>/dev/null <"/proc/$p/cmdline" | grep -q -- '-m allreduce_train ' && echo "$p"
    done
}

stop() {
    local r
    r=$(ranks)
    if [ -n "$r" ]; then
        echo "worker-entrypoint: SIGTERM; asking ranks $(echo $r) to checkpoint and exit" >&2
        kill -USR1 $r 2>/dev/null
        while [ -n "$(ranks)" ]; do sleep 0.5; done
    fi
    kill -TERM "$server" 2>/dev/null
    wait "$server"
    exit 75
}

"$sshd" -D -e -p "$port" -f "$config" &
server=$!
trap stop TERM
wait "$server"
