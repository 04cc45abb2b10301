"""A stand-in rank for the emulated-cluster tests: ``python -m netns_rank MODE``.

report: print where this rank runs (hostname, Open MPI's local size, network namespace) and exit 0.
fail:   like report, then rank 1 exits 3 while the others wait: the job fails on purpose.
"""

import os
import socket
import sys
import time

mode = sys.argv[1]
rank = int(os.environ["OMPI_COMM_WORLD_RANK"])
print(
    f"rank {rank} pid {os.getpid()} host {socket.gethostname()} "
    f"local_size {os.environ['OMPI_COMM_WORLD_LOCAL_SIZE']} netns {os.readlink('/proc/self/ns/net')}",
    flush=True,
)
if mode == "fail":
    if rank == 1:
        time.sleep(1)
        sys.exit(3)
    time.sleep(600)  # mpirun must end this rank when its peer fails
