"""Concept x engine: which part of a difference between ring allreduce and the parameter server is
the concept's, and which the implementation's.

Ring allreduce runs on two engines: Horovod (C++ background thread, negotiation cycle, MPI
collectives) and the mpi engine (``--allreduce-engine mpi``: buckets sent from gradient hooks as
mpi4py point-to-point messages, in this process's Python), which is the parameter server's own
machinery. The colocated PS moves the same bytes per link and step as the ring (2(N-1)/N S each
way), so on the same engine the ring/PS ratio is the concept's difference, and on the same
concept the Horovod/mpi ratio is the implementation's; the Horovod ring against the PS, the
comparison a reader sees first, is the product of the two.

The sharded concept (ZeRO stages 1-3, ``--strategy sharded``) runs on the ring's engines: stages 1 and 2
move the ring's bytes too (a reduce-scatter of the gradients, an all-gather of the parameters), so on
the same engine sharded / ring and sharded / colocated PS are concept differences of the same kind;
stage 3 gathers the parameters twice (1.5x the bytes, lab/common/costmodel.py).
"""

from __future__ import annotations

from . import methods

HOROVOD, MPI4PY, TORCH = "Horovod", "mpi4py", "torch.distributed"
ENGINES = {
    HOROVOD: "Horovod (C++ background thread, MPI collectives)",
    MPI4PY: "mpi4py (buckets from gradient hooks, point-to-point messages)",
    TORCH: "torch.distributed (buckets from gradient hooks, Gloo/NCCL all_reduce)",
}
RING, PS_COLOCATED, PS_DEDICATED = "ring allreduce", "PS colocated", "PS dedicated"
SHARDED = {stage: f"sharded, stage {stage}" for stage in (1, 2, 3)}
CONCEPTS = (RING, *SHARDED.values(), PS_COLOCATED, PS_DEDICATED)

ENGINE_OF = {"horovod": HOROVOD, "mpi": MPI4PY, "torch": TORCH}


def cell(name: str) -> tuple[str, str] | None:
    """(concept, engine) of a float32, every-step method of the lab's registry (lab/common/methods.py; an old name
    too), or of bench's ``trainer`` (the trainer's defaults); None for any other name (a concept over a method,
    an asynchronous PS, a baseline)."""
    m = methods.defaults() if name == "trainer" else methods.registry().get(methods.canonical(name))
    if m is None or m.wire != "none" or m.schedule or not m.synchronous:
        return None
    if m.strategy == "ps":
        return (PS_DEDICATED if m.placement == "dedicated" else PS_COLOCATED), MPI4PY
    return (SHARDED[m.stage] if m.stage else RING), ENGINE_OF[m.engine]


def cells(speed: dict[str, float]) -> dict[tuple[str, str], float]:
    """{(concept, engine): figure} of the methods that were measured."""
    return {c: v for name, v in speed.items() if (c := cell(name)) is not None and v and v > 0}


def markdown(title: str, speed: dict[str, float], unit: str = "samples/s", fmt: str = ".0f") -> list[str]:
    """A concept x engine table of ``speed`` (higher is better) and the sentences that split the
    Horovod-ring vs colocated-PS ratio into the concept's and the implementation's parts."""
    c = cells(speed)
    if not c:
        return []
    concepts = [k for k in CONCEPTS if any(key[0] == k for key in c)]
    engines = [e for e in (HOROVOD, MPI4PY, TORCH) if any(key[1] == e for key in c)]
    out = [
        f"{title} ({unit}):",
        "",
        "| concept \\ engine | " + " | ".join(ENGINES[e] for e in engines) + " |",
        "|---|" + "---:|" * len(engines),
    ]
    for k in concepts:
        out.append(f"| {k} | " + " | ".join(format(c[(k, e)], fmt) if (k, e) in c else "–" for e in engines) + " |")
    out += ["", verdict(c), ""]
    return out


def verdict(c: dict[tuple[str, str], float]) -> str:
    """The split of the difference, in words (ratios > 1: the first named is faster)."""
    hr, mr, mp = c.get((RING, HOROVOD)), c.get((RING, MPI4PY)), c.get((PS_COLOCATED, MPI4PY))
    said = []
    if mr and mp:
        said.append(
            f"Same engine (mpi4py), ring / colocated PS = {mr / mp:.2f}: the concept's difference "
            "(both move 2(N-1)/N of the gradient through every link per step; what remains is the "
            "ring's 2(N-1) sequential messages against the PS's parallel ones, and the PS's SGD on the "
            "servers)."
        )
    if hr and mr:
        said.append(
            f"Same concept (ring), Horovod / mpi4py = {hr / mr:.2f}: the implementation's difference "
            "(Horovod's background thread, its negotiation cycle and fusion buffer, and across "
            "hosts the allreduce algorithm Open MPI picks for it, against a ring of messages sent "
            "from this process's gradient hooks; docs/emulated_cluster.md)."
        )
    if hr and mp and mr:
        said.append(
            f"The Horovod ring / colocated PS = {hr / mp:.2f} is their product ({mr / mp:.2f} x {hr / mr:.2f})."
        )
    elif hr and mp:
        said.append(
            f"Horovod ring / colocated PS = {hr / mp:.2f}, concept and implementation together "
            "(the mpi engine was not measured, so they cannot be told apart)."
        )
    said += sharded_verdict(c)
    return " ".join(said) if said else "One concept or one engine only: nothing to separate."


def sharded_verdict(c: dict[tuple[str, str], float]) -> list[str]:
    """The sharded stages against the ring on the same engine, and stages 1-2 against the colocated PS (the
    same bytes per link and step both ways); ratios > 1: the sharded stage is faster."""
    said = []
    for stage, k in SHARDED.items():
        ratios = [f"{c[(k, e)] / c[(RING, e)]:.2f} on {e}" for e in ENGINES if (k, e) in c and (RING, e) in c]
        if ratios:
            moved = "1.5x the ring's bytes: the parameters gathered twice" if stage == 3 else "the ring's bytes"
            said.append(f"Sharded stage {stage} / ring, same engine = {', '.join(ratios)} ({moved}).")
    ps = c.get((PS_COLOCATED, MPI4PY))
    vs_ps = [f"stage {s} {c[(SHARDED[s], MPI4PY)] / ps:.2f}" for s in (1, 2) if ps and (SHARDED[s], MPI4PY) in c]
    if vs_ps:
        said.append(
            f"Sharded / colocated PS, same engine (mpi4py): {', '.join(vs_ps)}: the same bytes, as collectives "
            "(reduce-scatter, all-gather) with the update on the worker, against sends from gradient hooks to the "
            "owning servers with the update on the servers."
        )
    return said
