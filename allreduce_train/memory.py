"""The training process's memory: allocator settings, what each rank holds, and the limit it runs under.

:class:`MemoryLog` records per rank the bytes held of parameters, gradients, optimizer state and the
engine's buffers (:meth:`GradientExchange.memory <.distributed.base.GradientExchange.memory>`), with
the peak resident (and CUDA) memory, after the first step and at the end: metrics.json's ``memory``
and TensorBoard's ``memory/`` (docs/training.md). Before that, it refuses a run that cannot fit: the
ZeRO formula (:mod:`.distributed.memcost`) against this process's memory limit.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from .errors import ConfigError, UserError

if TYPE_CHECKING:  # torch and the engines are imported where used (the allocator is set before they load)
    import torch

    from .config import Config
    from .distributed.base import GradientExchange
    from .run_logger import NullLogger

KINDS = ("params", "grads", "optimizer", "buffers")
GIB = float(1 << 30)

# glibc's mallopt() parameters (malloc.h) and the values the trainer sets, by their environment
# variable: a variable the user set wins (glibc has already read it).
_MALLOPT = {
    "MALLOC_MMAP_THRESHOLD_": (-3, 32 << 20),  # M_MMAP_THRESHOLD: blocks up to 32 MB come from the heap ...
    "MALLOC_TRIM_THRESHOLD_": (-1, 1 << 30),  # M_TRIM_THRESHOLD: ... which is not shrunk after each step ...
    "MALLOC_TOP_PAD_": (-2, 64 << 20),  # M_TOP_PAD: ... and grows 64 MB at a time
}
# Set only under an RLIMIT_AS. M_ARENA_MAX: each thread that allocates (MPI's, the watchdog, torch's pool)
# would get an arena of its own, 64 MB of address space reserved each: untouched, but RLIMIT_AS counts it
# (measured: VmSize 149 MB higher once the trainer's threads run, docs/performance.md); the main thread's
# arena and one shared. Without a limit the threads would only take turns at malloc's locks: Horovod's ring
# ran 8 % slower with the cap (docs/performance.md, "Before and after step two").
_UNDER_A_LIMIT = {"MALLOC_ARENA_MAX": (-8, 2)}


def _address_space_limit() -> int | None:
    """This process's ``RLIMIT_AS`` soft limit, bytes (``ulimit -v``, lab.memory.limited); None when unlimited."""
    import resource

    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    return None if soft == resource.RLIM_INFINITY else soft


def address_space_limited() -> bool:
    """Whether this process runs under an ``RLIMIT_AS``."""
    return _address_space_limit() is not None


def keep_freed_memory(environ: Mapping[str, str] = os.environ, limited: bool | None = None) -> dict[str, int]:
    """Make glibc keep the memory a training step frees for the next step.

    A step allocates and frees the same activations and gradients every time. By default glibc
    serves blocks over 128 kB (or a threshold it adapts) with fresh mmap()s and trims the top of
    the heap once 128 kB are free, so each step returns its memory to the kernel and faults it back
    in, page by page, zeroed: measured with 2 ranks of LeNet-5 on 2 cores, 2 s of system time per
    1000 steps and 20 % lower throughput (docs/performance.md). Under an address-space limit
    (``limited``; by default whether an ``RLIMIT_AS`` is set) the threads also share two arenas instead of
    reserving 64 MB each. Returns what was set; a no-op
    without glibc, and with ALLREDUCE_TRAIN_MALLOC=glibc (glibc's own behaviour, for comparison
    or to return memory to the system between steps).
    """
    mode = environ.get("ALLREDUCE_TRAIN_MALLOC", "keep")
    if mode not in ("keep", "glibc"):
        raise UserError(f"ALLREDUCE_TRAIN_MALLOC={mode!r}: use keep (the default) or glibc")
    if mode == "glibc":
        return {}
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return {}
    limited = address_space_limited() if limited is None else limited
    done = {}
    for var, (param, value) in {**_MALLOPT, **(_UNDER_A_LIMIT if limited else {})}.items():
        if var not in environ and mallopt(param, value) == 1:
            done[var] = value
    return done


def peak_rss_mib() -> float:
    """This process's peak resident memory so far, MiB (Linux reports KiB)."""
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def limit_headroom() -> tuple[float, str] | None:
    """Bytes this process may still allocate under the tightest memory limit it runs under, and the
    limit's description; None when unlimited. ``RLIMIT_AS`` (``ulimit -v``, ``prlimit --as``) bounds
    this process's virtual memory, so its headroom is the limit less VmSize; a cgroup's (v2
    ``memory.max``, v1 ``memory.limit_in_bytes``) bounds the resident memory of every process in the
    group, so its headroom is the limit less the group's usage, shared by the ranks on this host."""
    found: list[tuple[float, str]] = []
    soft = _address_space_limit()
    if soft is not None:
        found.append((soft - _status_kib("VmSize") * 1024, f"RLIMIT_AS {soft / GIB:.2f} GiB"))
    for limit_file, usage_file in (
        ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
        ("/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory/memory.usage_in_bytes"),
    ):
        try:
            with open(limit_file) as fh, open(usage_file) as uh:
                text, usage = fh.read().strip(), int(uh.read())
        except (OSError, ValueError):
            continue
        if text != "max" and int(text) < 1 << 60:  # v1 writes "unlimited" as a page-rounded 2^63
            found.append((int(text) - usage, f"the cgroup's {os.path.basename(limit_file)} {int(text) / GIB:.2f} GiB"))
    return min(found) if found else None


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def state_bytes_per_param(optimizer: torch.optim.Optimizer) -> float:
    """K: bytes of optimizer state per parameter element, from one step of ``optimizer``'s class on a
    probe of 1024 elements with its first group's hyperparameters (AdamW: 8, SGD with momentum: 4).
    0 where the class cannot be built from its groups alone: the estimate then leaves the state out."""
    import torch

    probe = torch.nn.Parameter(torch.zeros(1024))
    group = {k: v for k, v in optimizer.param_groups[0].items() if k not in ("params", "initial_lr")}
    # how a step runs, not what it keeps: the probe is on the CPU, whatever device the model uses
    group.update({k: v for k, v in (("foreach", None), ("fused", None), ("capturable", False)) if k in group})
    probe.grad = torch.ones_like(probe)
    cls: Any = type(optimizer)  # a subclass: built as its own constructor takes groups, not as Optimizer's
    try:
        opt = cls([{**group, "params": [probe]}])
        opt.step()
    except Exception:  # a user's class may need more than its groups, or a GPU: no estimate of its state
        return 0.0
    per_element = [v for v in opt.state[probe].values() if isinstance(v, torch.Tensor) and v.numel() == 1024]
    return sum(v.element_size() for v in per_element)


def concept_of(cfg: Config) -> dict[str, Any]:
    """The configured concept as :func:`.distributed.memcost.per_rank`'s arguments."""
    x = cfg.exchange
    if x.strategy == "ps":
        return {"concept": "ps", "dedicated": cfg.ps.placement == "dedicated", "servers": cfg.ps.servers}
    if x.strategy == "sharded":
        return {"concept": "sharded", "stage": x.shard_stage}
    return {"concept": "ring" if x.strategy == "allreduce" else x.strategy}


def check_fits(cfg: Config, ex: GradientExchange, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """Refuse, before the first step, a run whose per-rank bytes by the ZeRO formula do not fit under
    this process's memory limit (:func:`limit_headroom`), naming the need, the limit and the sharded
    stage that would fit. The formula leaves out activations and the engines' buffers, so it is a
    lower bound: what it refuses cannot run, and a run it lets through may still need more."""
    from .distributed.memcost import per_rank

    room = limit_headroom()
    if room is None:
        return
    headroom, limit = room
    params = list(model.parameters())
    n = sum(p.numel() for p in params)
    held = sum(p.numel() * p.element_size() for p in params)  # built already: in the usage the headroom left out
    k = state_bytes_per_param(optimizer)
    workers, server = ex.num_workers, not ex.is_worker
    share = 1 if limit.startswith("RLIMIT") else ex.local_size  # a cgroup's room is shared by this host's ranks

    def need(**concept: Any) -> float:
        got = per_rank(n, workers, state_bytes_per_param=k, **concept)
        return got["server_total"] if server and "server_total" in got else got["total"]

    mine = need(**concept_of(cfg))
    if (mine - min(mine, held)) * share <= headroom:
        return
    fits = [s for s in (1, 2, 3) if (need(concept="sharded", stage=s) - held) * share <= headroom]
    stages = [f"{s} ({need(concept='sharded', stage=s) / GIB:.2f} GiB)" for s in fits]
    fix = (
        f"--strategy sharded fits with --shard-stage {', '.join(stages[:-1])}{' or ' if len(stages) > 1 else ''}"
        f"{stages[-1]} by the same formula (activations and buffers come on top)"
        if fits
        else f"no sharded stage fits at {workers} worker(s) (stage 3: "
        f"{need(concept='sharded', stage=3) / GIB:.2f} GiB): add ranks or memory"
    )
    raise ConfigError(
        f"memory: --strategy {cfg.exchange.strategy} needs at least {mine / GIB:.2f} GiB per rank (the ZeRO formula "
        f"for {n:,} parameters, {k:g} bytes of {type(optimizer).__name__} state each, {workers} worker(s)), "
        f"{(mine - min(mine, held)) * share / GIB:.2f} GiB more than this rank holds, over the "
        f"{max(headroom, 0) / GIB:.2f} GiB left under {limit}; {fix}"
    )


def peak_cuda_mib(device: torch.device) -> float | None:
    """The peak CUDA memory allocated by this process on ``device``, MiB; None off a GPU."""
    import torch

    return torch.cuda.max_memory_allocated(device) / (1 << 20) if device.type == "cuda" else None


class MemoryLog:
    """Per-rank memory, after the first step and at the end (metrics.json ``memory``; TensorBoard
    ``memory/<kind>_bytes/rank<R>``, ``memory/peak_rss_mib/rank<R>``). :meth:`check` builds it and
    refuses a run that cannot fit (:func:`check_fits`)."""

    def __init__(self, ex: GradientExchange, device: torch.device) -> None:
        self.ex, self.device = ex, device
        self.first: list[dict[str, Any]] | None = None

    @classmethod
    def check(
        cls,
        cfg: Config,
        ex: GradientExchange,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        device: torch.device,
    ) -> MemoryLog:
        check_fits(cfg, ex, model, optimizer)
        return cls(ex, device)

    def row(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
        """This rank's figures: bytes of each kind, their total, peak RSS (and CUDA) MiB."""
        held = self.ex.memory(model, optimizer)
        out: dict[str, Any] = {"rank": self.ex.rank, "role": "worker", **held, "total": sum(held.values())}
        out["peak_rss_mib"] = peak_rss_mib()
        out["peak_vm_mib"] = _status_kib("VmPeak") / 1024  # what RLIMIT_AS bounds
        cuda = peak_cuda_mib(self.device)
        if cuda is not None:
            out["peak_cuda_mib"] = cuda
        return out

    def gather(
        self, step: int, model: torch.nn.Module, optimizer: torch.optim.Optimizer, log: NullLogger
    ) -> list[dict[str, Any]]:
        """Every rank's row by global rank (collective over the workers; a dedicated PS's servers
        answer the main worker), logged to TensorBoard at ``step``."""
        rows = self.ex.gather_from_workers(self.row(model, optimizer))  # communication: every worker's row
        if self.ex.is_main:
            rows = sorted(rows + self.ex.server_memory(), key=lambda r: r["rank"])  # communication: the servers'
        log.scalars(
            step,
            {
                f"memory/{k}{'' if k.endswith('mib') else '_bytes'}/rank{r['rank']}": float(r[k])
                for r in rows
                for k in (*KINDS, "total", "peak_rss_mib", "peak_vm_mib", "peak_cuda_mib")
                if k in r
            },
        )
        return rows

    def after_step(self, step: int, model: torch.nn.Module, optimizer: torch.optim.Optimizer, log: NullLogger) -> None:
        """Record the first step's figures (the optimizer's state exists from its first step on)."""
        if self.first is None:
            self.first = self.gather(step, model, optimizer, log)

    def finish(
        self, step: int, model: torch.nn.Module, optimizer: torch.optim.Optimizer, log: NullLogger
    ) -> dict[str, Any]:
        """metrics.json's ``memory``: the rows after the first step of this run and at its end."""
        return {"after_first_step": self.first or [], "end": self.gather(step, model, optimizer, log)}
