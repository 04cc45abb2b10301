"""Bytes each rank holds: the ZeRO paper's per-rank memory formula, without torch.

Rajbhandari et al., "ZeRO: Memory Optimizations Toward Training Trillion Parameter Models" (SC 2020),
section 5: a model of Psi parameters trained data-parallel holds, on every rank, its parameters, its
gradients and K bytes of optimizer state per parameter (Adam's two float32 moments: K = 8 here,
where parameters are float32; the paper's mixed-precision K = 12 adds the float32 master copy).
Replication (the ring, and ``--strategy none``, where every rank trains a model of its own) holds
all three whole; sharding over N workers divides them stage by stage:

====================  ==========  ==========  =============
concept               parameters  gradients   optimizer
====================  ==========  ==========  =============
ring, none            p Psi       g Psi       K Psi
sharded, stage 1      p Psi       g Psi       K Psi / N
sharded, stage 2      p Psi       g Psi / N   K Psi / N
sharded, stage 3      p Psi / N   g Psi / N   K Psi / N
PS colocated          p Psi +     g Psi       K Psi / N
                      4 Psi / N
PS dedicated worker   p Psi       g Psi       0
PS dedicated server   4 Psi / S   0           K Psi / S
====================  ==========  ==========  =============

(p, g: bytes per parameter and per gradient element; the parameter server's servers keep float32
master parameters, 4 bytes, whatever the workers hold.) The engines' own flat buffers (the ring's
buckets, the servers' message buffers) and activations are not in the formula: the measured figures
(:meth:`GradientExchange.memory <allreduce_train.distributed.base.GradientExchange.memory>`) show
them beside it. The trainer's memory check (:mod:`allreduce_train.memory`), the lab's
``make bench-memory`` and ``recommend --memory-per-rank`` import this one formula. Pure Python:
importing this module loads neither torch nor MPI.
"""

from __future__ import annotations

CONCEPTS = ("ring", "ps", "sharded", "none")
MASTER_BYTES = 4  # a parameter server's master parameters: float32 (ps/server.py ELEM)


def per_rank(
    n_params: float,
    workers: int,
    concept: str,
    *,
    stage: int = 0,
    servers: int = 0,
    dedicated: bool = False,
    state_bytes_per_param: float = 8.0,
    param_bytes: int = 4,
    grad_bytes: int = 4,
) -> dict[str, float]:
    """Bytes one worker rank holds of parameters, gradients and optimizer state, and their total.

    ``concept``: ``ring`` | ``ps`` | ``sharded`` | ``none``; ``workers``: N, the ranks that train;
    ``stage``: the sharded concept's ZeRO stage (1, 2 or 3); ``servers``, ``dedicated``: the
    parameter server's (``servers`` dedicated server ranks, 1 if 0; colocated: one server per
    worker); ``state_bytes_per_param``: K (AdamW 8, SGD with momentum 4, plain SGD 0).
    A dedicated PS also returns its server ranks' figures under ``server_params``,
    ``server_optimizer`` and ``server_total`` (a job needs the larger of the two totals per rank).
    """
    if concept not in CONCEPTS:
        raise ValueError(f"concept {concept!r}: one of {', '.join(CONCEPTS)}")
    if workers < 1:
        raise ValueError(f"workers {workers}: at least 1")
    if concept == "sharded" and stage not in (1, 2, 3):
        raise ValueError(f"stage {stage}: the sharded concept has stages 1, 2 and 3")
    psi, n, k = float(n_params), workers, state_bytes_per_param
    params, grads, optimizer = param_bytes * psi, grad_bytes * psi, k * psi
    out: dict[str, float] = {}
    if concept == "sharded":
        optimizer /= n
        if stage >= 2:
            grads /= n
        if stage >= 3:
            params /= n
    elif concept == "ps" and dedicated:
        s = servers or 1
        optimizer = 0.0
        out = {"server_params": MASTER_BYTES * psi / s, "server_optimizer": k * psi / s}
        out["server_total"] = out["server_params"] + out["server_optimizer"]
    elif concept == "ps":  # colocated: every worker rank is also the server of 1/N of the model
        params += MASTER_BYTES * psi / n
        optimizer /= n
    return {"params": params, "grads": grads, "optimizer": optimizer, "total": params + grads + optimizer, **out}
