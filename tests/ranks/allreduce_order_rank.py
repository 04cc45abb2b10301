"""Which algorithm did Open MPI's MPI_Allreduce use? ``python -m allreduce_order_rank`` under mpirun.

Floating-point addition is not associative, so the bits of a float32 sum tell the order in which
the ranks' values were added, and each allreduce algorithm (recursive doubling, ring, ...) adds in
an order of its own. Every rank contributes seeded values of mixed magnitude; rank 0 prints a
digest of the summed bytes for a small and a large message:

    allreduce_order small=<hex> large=<hex>

Two runs that print the same digest for a size used the same summation order for it.
"""

import hashlib

import numpy as np
from mpi4py import MPI

SIZES = {"small": 4 << 10, "large": 4 << 20}  # bytes: below and above the ring rules' threshold


def digest(nbytes: int, rank: int) -> str:
    rng = np.random.default_rng(1000 + rank)
    n = nbytes // 4
    x = (rng.standard_normal(n) * 10.0 ** rng.uniform(-4, 4, n)).astype(np.float32)
    out = np.empty_like(x)
    MPI.COMM_WORLD.Allreduce(x, out, op=MPI.SUM)
    return hashlib.sha256(out.tobytes()).hexdigest()[:16]


def main() -> None:
    rank = MPI.COMM_WORLD.Get_rank()
    found = {name: digest(nbytes, rank) for name, nbytes in SIZES.items()}
    if rank == 0:
        print("allreduce_order " + " ".join(f"{k}={v}" for k, v in found.items()), flush=True)


if __name__ == "__main__":
    main()
