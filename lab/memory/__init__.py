"""``make bench-memory`` (``python -m lab bench-memory``): per-rank memory of the ring, the parameter
server and the sharded stages, measured by the trainer, against the ZeRO paper's formula; and a run
that fits a per-rank memory limit only sharded (docs/performance.md, "Memory per rank")."""
