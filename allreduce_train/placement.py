"""Where the ranks run, and the check that they run where the launcher asked (``--expect-hosts``).

A launcher that spreads the ranks over N hosts (a Kubernetes job of N pods, a Slurm allocation of
N nodes) passes ``--expect-hosts N``. A hostfile the MPI runtime did not read, or read otherwise
(with Open MPI 5 images, Kubeflow jobs have run every rank on the launcher pod and still reported
Complete), then ends the job at start with one line instead of training on fewer hosts.
"""

from __future__ import annotations


def by_host(hosts: list[str]) -> dict[str, list[int]]:
    """The ranks of each host, hosts in order of their lowest rank (``hosts``: rank -> hostname)."""
    ranks: dict[str, list[int]] = {}
    for rank, host in enumerate(hosts):
        ranks.setdefault(host, []).append(rank)
    return ranks


def _ranges(ranks: list[int]) -> str:
    """``[0, 1, 2, 5]`` -> ``0-2,5``."""
    parts: list[str] = []
    start = prev = ranks[0]
    for r in ranks[1:] + [None]:
        if r is not None and r == prev + 1:
            prev = r
            continue
        parts.append(str(start) if start == prev else f"{start}-{prev}")
        if r is not None:
            start = prev = r
    return ",".join(parts)


def describe(hosts: list[str]) -> str:
    """One line naming every host and its ranks: ``2 hosts: node-0 (ranks 0-1), node-1 (ranks 2-3)``."""
    groups = by_host(hosts)
    return f"{len(groups)} host{'s' if len(groups) != 1 else ''}: " + ", ".join(
        f"{host} (rank{'s' if len(r) > 1 else ''} {_ranges(r)})" for host, r in groups.items()
    )


def check(hosts: list[str], expected: int) -> str | None:
    """The error line when the ranks landed on fewer than ``expected`` distinct hosts, else None."""
    found = len(set(hosts))
    if not expected or found >= expected:
        return None
    return (
        f"--expect-hosts {expected}: the {len(hosts)} ranks run on {describe(hosts)}, not spread as the "
        f"launcher asked; check the hostfile mpirun read (docs/kubernetes.md), or lower --expect-hosts"
    )
