"""allreduce_train: data-parallel PyTorch training with Horovod ring allreduce, launched with mpirun."""

__version__ = "0.1.0"
