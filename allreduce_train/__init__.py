"""allreduce_train: data-parallel PyTorch training, ring allreduce (Horovod) or a parameter server
behind one trainer, launched with mpirun.

The core: :mod:`.cli` (``python -m allreduce_train train|models``), :mod:`.config`,
:mod:`.trainer`, :mod:`.tasks`, :mod:`.data`, :mod:`.checkpoint`, :mod:`.run_logger` and the
exchanges in :mod:`.distributed`. :mod:`.experiments` builds on the core; the core never imports it.
"""

__version__ = "0.1.0"
