#!/usr/bin/env bash
# The launcher's entrypoint (TrainJob and MPIJob): runs its arguments (the mpirun line) inside the
# launcher's bound, `python -m launch run` (launch/run.py, docs/faults.md). The pod's SIGTERM becomes
# SIGUSR1 for mpirun, which Open MPI forwards to every rank; the trainer answers it by finishing the
# step, writing its checkpoint and exiting 75 (preempted). If the job has not ended
# $ALLREDUCE_TRAIN_GRACE_PERIOD seconds later (launch k8s sets it 10 s below the pod's
# terminationGracePeriodSeconds), or a rank in this pod failed while mpirun waits for a pod it can
# no longer reach, mpirun is killed. Exits with the job's status, so the restart policy sees 75 and
# restarts the launcher (--resume auto).
set -u
if [ $# -eq 0 ]; then
    echo "launcher-entrypoint: error: give the command to run (the mpirun line)" >&2
    exit 2
fi
# launch is standard-library only: any python3 runs it, from this tree.
app=$(cd "$(dirname "$0")/.." && pwd)
exec env PYTHONPATH="$app${PYTHONPATH:+:$PYTHONPATH}" python3 -m launch run \
    --grace-period "${ALLREDUCE_TRAIN_GRACE_PERIOD:-30}" -- "$@"
