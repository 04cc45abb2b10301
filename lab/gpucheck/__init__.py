"""``gpucheck``: LeNet-5, ResNet-18 and the small LSTM for a fixed number of steps on one GPU, and one
table (samples/s, step ms, peak GPU memory).

One rank, six ways, at each model's own batch and at a larger one that keeps the GPU busy
(``--busy``; at the small batches an H200 waits on kernel launches):

* ``trainer``: the project's :class:`Trainer` with ``--strategy allreduce`` at one rank, as ``train``
  runs it: it exchanges nothing (the average over one worker is its own gradient), so this row is
  the trainer's own cost on the GPU, labelled "no exchange"; float32.
* ``trainer-bf16-mixed`` and ``trainer-16-mixed``: the same with ``--precision bf16-mixed`` (bfloat16
  autocast) and ``--precision 16-mixed`` (float16 autocast and the loss scaler); below the table each as a
  multiple of float32's samples/s. 16-mixed needs CUDA: in the CPU dry run its row says so (not a failure),
  bf16-mixed runs on the CPU too.
* ``trainer-exchange``: the same with ``ALLREDUCE_TRAIN_EXCHANGE_AT_ONE_RANK=1`` (for checks): every
  gradient goes through Horovod's allreduce from the backward hooks, as at more ranks (with CUDA
  tensors: Horovod's NCCL operations). The row counts the allreduces the trainer started, so it
  shows that they ran; comparable with the two rows below.
* ``horovod``: a bare loop that allreduces every gradient through Horovod each step
  (``hvd.grouped_allreduce_``).
* ``ddp``: the same loop on ``torch.nn.parallel.DistributedDataParallel``, process group ``nccl``.

Then two ranks on the same device (``--two-ranks``), through the trainer's multi-rank path, each
rank's parameters compared at the end (identical only if the exchange really averaged them):

* ``ring-gloo``: Horovod with Gloo for control and data, started here without MPI (a Gloo
  rendezvous served by this process, as ``horovodrun --gloo`` does). NCCL refuses two ranks on one
  GPU, and a Horovod built with NCCL operations sends every CUDA tensor to NCCL (there is no
  run-time switch), so these ranks load a Horovod built without GPU operations
  (``--gloo-pythonpath``): it copies each CUDA gradient to the host, allreduces it with Gloo and
  copies the result back (Horovod's ``*CudaOnCPU`` entry points). This checks the trainer's
  multi-rank CUDA path and Horovod's staging through the host, not NCCL between GPUs.
* ``ring-mpi`` and ``ps-sync-colocated`` (``ps`` also accepted): the mpi4py ring engine and the
  colocated parameter server, which move CUDA gradients through host buffers themselves; under
  ``python -m launch -np 2`` (mpirun), so only where mpirun and mpi4py are installed: elsewhere the row
  says it was skipped.

Below the table, the accounting of issue 28 per model and batch: the trainer's step against
DDP-NCCL's (and the bare Horovod loop's), as the microseconds per step the trainer adds, and with
``--parts`` where they go: the trainer's exchanging run once more, its timed steps traced (each phase of
its step, :mod:`lab.common.stepparts`; a separate run, so the figures above carry no tracer's cost).
On a GPU a part's wall time is where the CPU waited: the forward pass's kernels show up where the
step's vote reads the loss, backward's in the step end's ``torch.cuda.synchronize()`` (residue).

Each run is its own process (or job), so the peak memory is its own and one failure does not hide
the rest. ``--device cpu`` (tools/gpu_check.sh --dry-run) runs everything on the CPU instead:
Horovod's CPU operations and DDP over gloo; it checks the code, not the figures. The bare loops
train on one fixed batch, as Horovod's synthetic benchmark does; the trainer on the synthetic
dataset. Started by tools/gpu_check.sh (make gpu-check); docs/gpu.md.

The modules: :mod:`.main` (the flags and the whole check), :mod:`.one` (one run in its own process),
:mod:`.tworanks` (the two-rank jobs), :mod:`.report` (the table and the accounting), :mod:`.ways` (what
runs and its labels); the bare loops are :mod:`lab.common.baselines`, the ones ``bench`` times.
"""

from .main import add_arguments, main

__all__ = ["add_arguments", "main"]
