"""Address space that 8 threads' first malloc() reserves: ``python arena_probe.py keep|default``.

Each thread calls glibc's malloc() once and waits until all 8 have (so that none hands its arena back
before the others start); the growth of VmSize then is 8 thread stacks plus one 64 MB arena per thread
that got one of its own. ``keep`` calls the trainer's ``keep_freed_memory()`` first (its arena limit, which
it sets under an ``RLIMIT_AS``);
``default`` leaves glibc at its defaults. Prints one line: ``vm_growth_mib X``.
"""

import ctypes
import sys
import threading
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root

THREADS = 8


def vm_size_kib() -> int:
    with open("/proc/self/status") as fh:
        return next(int(line.split()[1]) for line in fh if line.startswith("VmSize:"))


def main(mode: str) -> None:
    if mode == "keep":
        from allreduce_train.memory import keep_freed_memory

        keep_freed_memory({}, limited=True)  # no MALLOC_* settings of its own, as under an RLIMIT_AS
    libc = ctypes.CDLL(None)
    libc.malloc.restype = ctypes.c_void_p
    ready, done = threading.Barrier(THREADS + 1), threading.Barrier(THREADS + 1)

    def thread() -> None:
        libc.malloc(1000)  # this thread's first allocation: where glibc gives it an arena
        ready.wait()
        done.wait()

    before = vm_size_kib()
    threads = [threading.Thread(target=thread) for _ in range(THREADS)]
    for t in threads:
        t.start()
    ready.wait()
    grown = vm_size_kib() - before
    done.wait()
    for t in threads:
        t.join()
    print(f"vm_growth_mib {grown / 1024:.0f}")


if __name__ == "__main__":
    main(sys.argv[1])
