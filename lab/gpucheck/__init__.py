"""gpucheck experiment: ``python -m lab gpucheck`` (tools/gpu_check.sh, make gpu-check); :mod:`.main`."""

from .main import accounting, add_arguments, main, parts_table

__all__ = ["accounting", "add_arguments", "main", "parts_table"]
