"""The mpi engine's exchange alone: ``python -m ring_rank TRAINER_ARGS`` under mpirun.

Each rank gives a toy model gradients of its own (seeded by rank and step), lets the exchange
average them, and compares the result with the average of every rank's raw gradients (gathered
as objects, summed in float64), for both algorithms, fp16 and bf16 on the wire and two backward passes per
step; a tensor outside the loss must come back as zeros. Prints ``ring_rank ok`` when all hold.
"""

import sys

import torch

from allreduce_train.cli import make_parser
from allreduce_train.config import build_config
from allreduce_train.distributed.ring import MPIRingAllreduce
from allreduce_train.distributed.wire import make_wire

SIZES = [1, 2, 5, 1000, 3]  # the last takes no part in the loss: its gradient stays None
VARIANTS = [  # (flags, passes per step, relative tolerance)
    (["--mpi-algorithm", "ring"], 1, 1e-6),
    (["--mpi-algorithm", "iallreduce"], 1, 1e-6),
    (["--mpi-algorithm", "ring"], 2, 1e-6),
    (["--mpi-algorithm", "ring", "--compression", "fp16"], 1, 5e-3),  # float16: 11 significant bits
    (["--mpi-algorithm", "ring", "--compression", "bf16"], 1, 4e-2),  # bfloat16: 8 significant bits
]


def run(flags: list[str], passes: int, tol: float) -> None:
    argv = ["train", "--allreduce-engine", "mpi", *sys.argv[1:], *flags, "--backward-passes-per-step", str(passes)]
    cfg = build_config(make_parser().parse_args(argv))
    ex = MPIRingAllreduce(cfg.exchange, cfg.mpi, wire=make_wire(cfg.exchange.compression))
    torch.manual_seed(0)
    model = torch.nn.ParameterList([torch.nn.Parameter(torch.randn(n)) for n in SIZES])
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ex.prepare(model, opt)
    for step in range(3):  # the same buckets and message tags again in every step
        gen = torch.Generator().manual_seed(1000 * step + ex.rank)
        weights = [torch.randn(n, generator=gen) for n in SIZES[:-1]]
        opt.zero_grad()
        for _ in range(passes):
            sum((p * w).sum() for p, w in zip(model, weights, strict=False)).backward()  # d loss / d p = w
        ex.synchronize()
        got = [p.grad.clone() for p in model]
        everyone = ex.allgather_object(([passes * w for w in weights], got))
        want = [torch.stack([raw[i].double() for raw, _ in everyone]).mean(0) for i in range(len(weights))]
        want.append(torch.zeros(SIZES[-1], dtype=torch.float64))
        for i, (g, w) in enumerate(zip(got, want, strict=True)):
            assert torch.equal(g, everyone[0][1][i]), f"{flags} step {step}: tensor {i} differs from rank 0's"
            err = float((g.double() - w).abs().max()) / max(float(w.abs().max()), 1e-30)
            assert err <= tol or (not w.any() and not g.any()), f"{flags} step {step}: tensor {i} off by {err:.2e}"
            if "--compression" in flags and w.numel() > 100:
                # the control: 16 bits really were on the wire
                assert not torch.equal(g, w.float()), f"{flags}: tensor {i} exact in float32"
        opt.step()
    ex.close()


for flags, passes, tol in VARIANTS:
    run(flags, passes, tol)
print("ring_rank ok", flush=True)
