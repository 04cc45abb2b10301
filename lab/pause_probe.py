"""One allreduce timed through Horovod or through mpi4py, back to back and after pauses
(docs/emulated_cluster.md).

    python -m lab.emulation -np 2 --emulate-hosts 2 --link-rate 100mbit \\
        --module lab.pause_probe -- --impl horovod --pauses 0,30,150 --mb 18.6

In training, each step's exchange follows the forward and backward pass; commbench times exchanges
back to back. For every pause, --iters exchanges of one float32 tensor of --mb megabytes (after one
untimed), each after sleeping that many milliseconds (0: back to back), with a one-element allreduce
first so that the ranks start it together. Rank 0 prints one line per pause: median and range of the
timed exchanges. Every exchange is checked against the exact sum. --impl:

- horovod: `hvd.allreduce_async` (Horovod copies the tensor to its output and reduces that with one
  MPI_Allreduce, in place, from its background thread), this thread waiting as the trainer does
  (polling, asleep between polls);
- horovod-spin: the same with Horovod's own wait (`hvd.synchronize`, a sched_yield loop);
  --connect-first: one small mpi4py allreduce before `hvd.init()`;
- mpi: mpi4py's `Allreduce` from this thread; mpi-thread: the same from another thread while this one
  sleeps between polls; mpi-inplace: with MPI_IN_PLACE.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time

import torch

from allreduce_train.distributed.horovod import POLL_S, connect_first

IMPLS = ("horovod", "horovod-spin", "mpi", "mpi-thread", "mpi-inplace")


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m lab.pause_probe", description=__doc__.split("\n\n")[0])
    p.add_argument("--pauses", default="0,30,150", help="milliseconds of sleep before each exchange, comma-separated")
    p.add_argument("--mb", type=float, default=18.6, help="megabytes (10^6 bytes) of float32 per exchange")
    p.add_argument("--iters", type=int, default=5, help="timed exchanges per pause")
    p.add_argument("--impl", choices=IMPLS, default="horovod")
    p.add_argument("--connect-first", action="store_true", help="horovod: one small mpi4py allreduce before hvd.init()")
    args = p.parse_args(argv)
    try:
        args.pauses = [float(x) for x in args.pauses.split(",")]
    except ValueError:
        p.error(f"--pauses {args.pauses!r}: give milliseconds separated by commas, e.g. 0,30,150")
    if any(x < 0 for x in args.pauses) or args.mb <= 0 or args.iters < 1:
        p.error("--pauses must be >= 0, --mb > 0 and --iters >= 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    torch.set_num_threads(1)
    if args.impl.startswith("horovod"):
        import horovod.torch as hvd

        if args.connect_first:
            connect_first()
        hvd.init()
        rank, size = hvd.rank(), hvd.size()

        def wait(handle):
            if args.impl == "horovod":  # the trainer's wait (allreduce_train/distributed/horovod.py)
                while not hvd.poll(handle):
                    time.sleep(POLL_S)
            return hvd.synchronize(handle)

        sync = lambda: wait(hvd.allreduce_async(torch.zeros(1), name="pause_probe.sync"))  # noqa: E731
        reduce = lambda t: wait(hvd.allreduce_async(t, op=hvd.Sum, name="pause_probe.tensor"))  # noqa: E731
    else:
        from mpi4py import MPI

        comm = MPI.COMM_WORLD
        rank, size = comm.rank, comm.size

        def sync():
            comm.Allreduce(MPI.IN_PLACE, torch.zeros(1).numpy(), op=MPI.SUM)

        def allreduce(t):
            if args.impl == "mpi-inplace":
                out = t.clone()
                comm.Allreduce(MPI.IN_PLACE, out.numpy(), op=MPI.SUM)
            else:
                out = torch.empty_like(t)
                comm.Allreduce(t.numpy(), out.numpy(), op=MPI.SUM)
            return out

        def reduce(t):
            if args.impl != "mpi-thread":
                return allreduce(t)
            box = []  # from another thread, as Horovod's background thread calls MPI; this one sleeps
            worker = threading.Thread(target=lambda: box.append(allreduce(t)))
            worker.start()
            while worker.is_alive():
                time.sleep(POLL_S)
            return box[0]

    n = int(args.mb * 1e6 / 4)
    # small integers: every order of summation gives the exact sum
    mine = torch.arange(n, dtype=torch.float32).remainder_(7).add_(rank)
    want = torch.arange(n, dtype=torch.float32).remainder_(7).mul_(size).add_(size * (size - 1) / 2)
    for pause in args.pauses:
        times = []
        for i in range(args.iters + 1):
            time.sleep(pause / 1000)
            sync()
            t0 = time.perf_counter()
            got = reduce(mine)
            dt = time.perf_counter() - t0
            if not torch.equal(got, want):
                print(f"pause_probe: rank {rank}: wrong sum after a {pause:g} ms pause", file=sys.stderr, flush=True)
                return 1
            if i:  # the first exchange of each pause is untimed
                times.append(dt * 1000)
        if rank == 0:
            print(
                f"{args.impl}, {size} ranks, {n * 4 / 1e6:.1f} MB, pause {pause:g} ms: "
                f"median {statistics.median(times):.0f} ms "
                f"({min(times):.0f}-{max(times):.0f}; {', '.join(f'{t:.0f}' for t in times)})",
                flush=True,
            )
    if args.impl.startswith("horovod"):
        hvd.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
