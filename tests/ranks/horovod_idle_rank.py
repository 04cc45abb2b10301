"""A rank that sits idle after hvd.init(): ``python -m horovod_idle_rank SECONDS``.

Prints how much CPU this rank's threads other than the main one (Horovod's background thread,
MPI's) used while the main thread slept, after one allreduce that proves the ranks are connected.
"""

import os
import sys
import time

import horovod.torch as hvd
import torch


def other_threads_cpu_s() -> float:
    main, total = str(os.getpid()), 0.0
    for tid in os.listdir("/proc/self/task"):
        if tid == main:
            continue
        try:
            with open(f"/proc/self/task/{tid}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
        except OSError:  # the thread ended
            continue
        total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime
    return total


hvd.init()
got = hvd.allreduce(torch.tensor([float(hvd.rank() + 1)]), op=hvd.Sum, name="connected").item()
idle_s = float(sys.argv[1])
c0, t0 = other_threads_cpu_s(), time.perf_counter()
time.sleep(idle_s)
cpu, wall = other_threads_cpu_s() - c0, time.perf_counter() - t0
print(f"rank {hvd.rank()} size {hvd.size()} sum {got:g} idle_s {wall:.3f} background_cpu_s {cpu:.3f}", flush=True)
hvd.shutdown()
