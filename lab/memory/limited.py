"""``python -m lab.memory.limited BYTES -- COMMAND...``: run COMMAND under an RLIMIT_AS of BYTES.

What ``prlimit --as`` or ``ulimit -v`` do, without either: the limit is set on this process and
COMMAND replaces it (exec), so mpirun and every rank it starts inherit it. RLIMIT_AS is the limit that
works in this sandbox: the cgroup's memory controller is mounted read-only (docs/performance.md)."""

from __future__ import annotations

import os
import resource
import sys


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[1] != "--" or not argv[0].isdigit():
        print("lab.memory.limited: usage: python -m lab.memory.limited BYTES -- COMMAND...", file=sys.stderr)
        return 2
    limit = int(argv[0])
    resource.setrlimit(resource.RLIMIT_AS, (limit, resource.getrlimit(resource.RLIMIT_AS)[1]))
    os.execvp(argv[2], argv[2:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
