#!/usr/bin/env bash
# The MPIJob launcher pod's entrypoint: runs its arguments (the mpirun line) and turns the pod's
# SIGTERM into SIGUSR1 for mpirun, which Open MPI forwards to every rank; the trainer answers it by
# finishing the step, writing its checkpoint and exiting 75 (preempted). Kubernetes sends SIGTERM
# when the pod is deleted, evicted or preempted, and SIGKILL terminationGracePeriodSeconds later.
# Exits with mpirun's status, so the launcher's restartPolicy sees 75 and restarts it (--resume auto).
set -u
if [ $# -eq 0 ]; then
    echo "launcher-entrypoint: error: give the command to run (the mpirun line)" >&2
    exit 2
fi
"$@" &
child=$!
trap 'kill -USR1 "$child" 2>/dev/null' TERM USR1
while true; do
    wait "$child"
    status=$?
    # wait returns early (status > 128) when a trapped signal arrives; go on until the child is gone
    kill -0 "$child" 2>/dev/null || exit "$status"
done
