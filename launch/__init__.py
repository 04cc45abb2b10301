"""A thin wrapper that runs the trainer under ``mpirun`` with Horovod's recommended flags.

It prints the exact ``mpirun`` line it runs and passes the trainer's arguments through untouched.
``launch`` imports only the standard library: it starts ``python -m allreduce_train`` (or a rank
program given with ``--module``) as a command, never as an import, so it works before the trainer's
dependencies are importable and cannot grow into the trainer (tests/unit/test_layout.py).
:mod:`.mpirun` builds and runs the line, :mod:`.elastic` finds the hosts that answer before a restart
(``--min-np``, ``--host-discovery-script``), the lab (lab/emulation) emulates hosts with network namespaces through it,
:mod:`.k8s` renders the same line into a Kubeflow TrainJob or MPIJob (``python -m launch k8s``).
"""

from typing import Any

__all__ = ["LaunchSpec", "build_command", "main"]


def __getattr__(name: str) -> Any:
    """``launch.LaunchSpec`` etc. load :mod:`.mpirun` on first use, so that the trainer's import of
    ``launch.exitcodes`` (its only one from here) loads the exit-code table and nothing else."""
    if name in __all__:
        from . import mpirun

        return getattr(mpirun, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
