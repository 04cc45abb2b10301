"""A thin wrapper that runs the trainer under ``mpirun`` with Horovod's recommended flags."""

from .mpirun import LaunchSpec, build_command, main

__all__ = ["LaunchSpec", "build_command", "main"]
