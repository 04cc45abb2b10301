#!/usr/bin/env bash
# The launcher's entrypoint (TrainJob and MPIJob): runs its arguments (the mpirun line) inside the
# launcher's bound, `python -m launch run` (launch/run.py, docs/faults.md). The pod's SIGTERM becomes
# SIGUSR1 for mpirun, which Open MPI forwards to every rank; the trainer answers it by finishing the
# step, writing its checkpoint and exiting 75 (preempted). If the job has not ended
# $ALLREDUCE_TRAIN_GRACE_PERIOD seconds later (launch k8s sets it 10 s below the pod's
# terminationGracePeriodSeconds), or a rank in this pod failed while mpirun waits for a pod it can
# no longer reach, mpirun is killed. Exits with the job's status, so the restart policy sees 75 and
# restarts the launcher (--resume auto). A hostfile name that does not resolve within
# $ALLREDUCE_TRAIN_RESOLVE_TIMEOUT seconds (default 120) ends it with one line, exit 69 (unavailable).
set -u
if [ $# -eq 0 ]; then
    echo "launcher-entrypoint: error: give the command to run (the mpirun line)" >&2
    exit 2
fi
# The hostfile's names (the pods' DNS names, and with Trainer the launcher's own) may not resolve
# yet when the launcher starts; ssh's ConnectionAttempts does not retry a failed lookup, so wait for
# each, bounded, as mpi-operator's base image does (build/base/entrypoint.sh).
hostfile=${OMPI_MCA_orte_default_hostfile:-}
if [ -n "$hostfile" ] && [ -r "$hostfile" ]; then
    limit=${ALLREDUCE_TRAIN_RESOLVE_TIMEOUT:-120}
    deadline=$((SECONDS + limit))
    for host in $(sed -e 's/#.*//' "$hostfile" | awk '{print $1}'); do
        until getent hosts "$host" >/dev/null; do
            if [ "$SECONDS" -ge "$deadline" ]; then
                echo "launcher-entrypoint: error: $host (in $hostfile) did not resolve within ${limit} s; is its pod running and the job's Service there?" >&2
                exit 69
            fi
            sleep 1
        done
    done
fi
# launch is standard-library only: any python3 runs it, from this tree.
app=$(cd "$(dirname "$0")/.." && pwd)
exec env PYTHONPATH="$app${PYTHONPATH:+:$PYTHONPATH}" python3 -m launch run \
    --grace-period "${ALLREDUCE_TRAIN_GRACE_PERIOD:-30}" -- "$@"
