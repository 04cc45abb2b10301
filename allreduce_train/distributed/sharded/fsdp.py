"""``--strategy sharded --allreduce-engine torch``: ZeRO through PyTorch's own sharding.

On torch.distributed's process group (:class:`~..c10d.TorchDistributed`'s: Gloo on CPU, NCCL for CUDA
tensors), every stage is PyTorch's implementation rather than this project's layer (:mod:`.`):

* stage 1 -- :class:`torch.distributed.optim.ZeroRedundancyOptimizer`: the torch engine's bucketed
  ``all_reduce`` from the gradient hooks, unchanged (``--compression fp16|bf16`` included); each rank
  keeps the optimizer state of whole parameters (ZeRO's greedy partition by size), steps them and
  broadcasts them to the others;
* stages 2 and 3 -- FSDP2, :func:`torch.distributed.fsdp.fully_shard`, on every module with parameters
  of its own and on the root: parameters become DTensors sharded on dim 0, each module's gathered
  (``all_gather_into_tensor``) for its forward, the gradients ``reduce_scatter_tensor``-ed while backward
  runs; stage 2 keeps a module's gathered parameters from forward to backward
  (``reshard_after_forward=False``), stage 3 frees them after forward and gathers again for backward.
  ``--compression fp16|bf16`` is FSDP2's ``MixedPrecisionPolicy(reduce_dtype=...)``: the gradients'
  reduce-scatter in 16 bits, parameters and their gather float32.

The trainer's contract holds as for every engine: :meth:`prepare` returns the optimizer to step (the
user's class over the sharded parameters, its state cut from the broadcast whole), and the checkpoint
holds the whole state in the class's own format. Gathering it is collective: the optimizer's
``state_dict()`` gathers on every rank that calls it (all must, as for the sharded layer's optimizer);
:meth:`optimizer_state_dict`, which the trainer calls on every worker right before the main rank reads
:meth:`model_state_dict`, gathers each tensor in turn and keeps it on the main rank alone, the model's
too. :meth:`whole_parameters` (before evaluation, a checkpoint and the end) gathers every module's
parameters until the next training forward: evaluation, where the workers' shares may differ by a
batch, then sends nothing. Under stages 2 and 3 ``model.state_dict()`` is collective as well (every
rank calls it: ``--dump-params``) and returns plain whole tensors.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol, cast

import torch

from ...config import Config, ExchangeConfig, TorchConfig
from ...errors import UserError
from ..buffers import held_bytes
from ..c10d import TorchDistributed
from ..wire import FLOAT32, WireFormat

if TYPE_CHECKING:  # torch.distributed's, imported when the engine prepares
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.optim import ZeroRedundancyOptimizer

# What each stage is, in metrics.json's "shard_impl"
IMPLEMENTATION = {1: "ZeroRedundancyOptimizer", 2: "fully_shard", 3: "fully_shard"}


def _own_modules(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The modules FSDP2 shards apart from the root, children before parents: each with parameters of
    its own that no other module holds (a tied weight stays with the root, which shards it once)."""
    holders: dict[int, int] = {}
    for m in model.modules():
        for p in m.parameters(recurse=False):
            holders[id(p)] = holders.get(id(p), 0) + 1
    found = [
        m
        for m in model.modules()
        if m is not model
        and any(True for _ in m.parameters(recurse=False))
        and all(holders[id(p)] == 1 for p in m.parameters(recurse=False))
    ]
    return found[::-1]  # modules() is parents first; fully_shard goes bottom-up


def _local(t: torch.Tensor) -> torch.Tensor:
    """This rank's shard of a DTensor; a plain tensor as is."""
    from torch.distributed.tensor import DTensor

    return t.to_local() if isinstance(t, DTensor) else t


def _whole(value: Any) -> Any:
    """A DTensor gathered whole as a plain tensor (communication: an all-gather); anything else as is."""
    from torch.distributed.tensor import DTensor

    return value.full_tensor() if isinstance(value, DTensor) else value


class TorchSharded(TorchDistributed):
    """``--strategy sharded --allreduce-engine torch``: see the module docstring."""

    name = "sharded"

    def __init__(self, x: ExchangeConfig, cfg: TorchConfig, wire: WireFormat = FLOAT32, stage: int = 2) -> None:
        super().__init__(x, cfg, wire)
        if stage != 1:
            self.dtype = torch.float32  # the engine's own buckets; FSDP2 casts (reduce_dtype)
        self.stage, self.reduce_dtype = stage, wire.dtype
        self._model: torch.nn.Module | None = None
        # ZeroRedundancyOptimizer (stage 1), the user's class over shards (2, 3: _gathered_class's)
        self._optimizer: torch.optim.Optimizer | None = None
        self._model_state: dict[str, Any] | None = None  # gathered whole for the main rank's checkpoint
        self._sharded: list[FSDPModule] = []  # the FSDP2 modules (the root and those of _own_modules)
        self._whole = False  # whole_parameters() gathered them, and no training forward has run since

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "shard_stage": self.stage, "shard_impl": IMPLEMENTATION[self.stage]}

    # ------------------------------------------------------------ set-up
    def prepare(
        self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, every_step: bool = True
    ) -> torch.optim.Optimizer:
        if self.size == 1:
            return optimizer  # one worker: nothing to shard, nothing to send
        self._model = model
        if self.stage == 1:
            super().prepare(model, optimizer)  # communication: rank 0's state; the gradients' allreduce hooks
            self._optimizer = self._zero(optimizer)
        else:
            self.broadcast_state(model, optimizer)  # communication: rank 0's model and optimizer state, whole
            self._optimizer = self._fully_shard(model, optimizer)
        return self._optimizer

    def _zero(self, optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
        from torch.distributed.optim import ZeroRedundancyOptimizer

        whole = optimizer.state_dict()
        try:
            # each group holds every hyperparameter: the class is built from the groups alone, as the PS builds it
            zero = ZeroRedundancyOptimizer([dict(g) for g in optimizer.param_groups], optimizer_class=type(optimizer))
        except TypeError as e:
            raise UserError(
                f"--strategy sharded --shard-stage 1 --allreduce-engine torch builds {type(optimizer).__qualname__} "
                f"from its parameter groups alone (ZeroRedundancyOptimizer), which failed: {e}; use "
                "--allreduce-engine mpi or horovod"
            ) from None
        if whole["state"]:  # resumed: each rank keeps its partition's state of the broadcast whole
            zero.load_state_dict(whole)
        return zero

    def _fully_shard(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
        from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
        from torch.distributed.tensor import distribute_tensor

        whole = optimizer.state_dict()  # the class's own format, by index in param_groups' order
        name = {id(p): n for n, p in model.named_parameters()}
        if any(id(p) not in name for g in optimizer.param_groups for p in g["params"]):
            raise UserError(
                "--strategy sharded --allreduce-engine torch: the optimizer holds a tensor that is not one of "
                "the model's parameters; build the optimizer over model.parameters()"
            )
        order = [name[id(p)] for g in optimizer.param_groups for p in g["params"]]
        keep = self.stage == 2  # stage 2: a module's gathered parameters stay from its forward to its backward
        policy = MixedPrecisionPolicy(reduce_dtype=None if self.reduce_dtype == torch.float32 else self.reduce_dtype)
        for m in _own_modules(model):
            fully_shard(m, reshard_after_forward=not keep, mp_policy=policy)  # communication: from here on
        fully_shard(model, reshard_after_forward=not keep, mp_policy=policy)
        now = dict(model.named_parameters())  # the same names, DTensors now
        groups, k = [], 0
        for g in optimizer.param_groups:
            groups.append({**g, "params": [now[n] for n in order[k : k + len(g["params"])]]})
            k += len(g["params"])
        cls: Any = type(optimizer)
        try:
            sharded = cls(groups)  # each group holds every hyperparameter
        except TypeError as e:
            raise UserError(
                f"--strategy sharded --allreduce-engine torch builds {type(optimizer).__qualname__} anew over the "
                f"sharded parameters from its parameter groups alone, which failed: {e}; use "
                "--allreduce-engine mpi or horovod"
            ) from None
        sharded.__class__ = _gathered_class(type(optimizer))
        params = [p for g in groups for p in g["params"]]
        for i, st in whole["state"].items():  # each state tensor of a parameter's shape: this rank's shard of it
            p = params[i]
            sharded.state[p] = {
                key: distribute_tensor(v.to(p.device), p.device_mesh, p.placements, src_data_rank=None)
                if isinstance(v, torch.Tensor) and v.shape == p.shape
                else v
                for key, v in st.items()
            }
        model.register_state_dict_post_hook(_gathered_state_dict)
        self._sharded = [m for m in model.modules() if isinstance(m, FSDPModule)]
        # before FSDP2's own pre-hook, which gathers the root's parameters for this forward
        model.register_forward_pre_hook(self._training_again, prepend=True)
        return sharded

    def whole_parameters(self, model: torch.nn.Module) -> None:
        """Every module's parameters gathered whole, and kept so through forwards out of training (evaluation:
        each worker's number of batches may differ, so no forward may wait for a gather), until the next
        training forward gives them back (:meth:`_training_again`)."""
        if self.stage == 1 or self._whole or self._model is None:
            return
        for m in self._sharded:
            m.set_reshard_after_forward(False, recurse=False)
            m.unshard()  # communication: this module's parameters, whole
        self._whole = True

    def _training_again(self, model: torch.nn.Module, args: tuple[Any, ...]) -> None:
        """The root's first forward pre-hook: a training forward after :meth:`whole_parameters` frees the
        gathered parameters and gathers per module again, as the stage does."""
        if self._whole and model.training:
            for m in self._sharded:
                m.reshard()
                m.set_reshard_after_forward(self.stage == 3, recurse=False)
            self._whole = False

    # ------------------------------------------------------------ one step
    def synchronize(self) -> None:
        if self.stage == 1:
            super().synchronize()
        # stages 2, 3: FSDP2 reduce-scattered each module's gradients during backward and waited for
        # them at its end; each rank's .grad is its shard of the average

    def memory(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, int]:
        """Bytes this rank holds: stages 2 and 3 count the local shards (FSDP2's storage, padded to N equal
        rows) of the parameters the optimizer steps, of their gradients and of its state -- not what is
        gathered for a while (a module's turn in forward or backward; :meth:`whole_parameters` until the
        next training forward, so also at the end of a run)."""
        if self._optimizer is None:
            return super().memory(model, optimizer)
        if self.stage == 1:  # whole parameters and gradients; the state is ZeroRedundancyOptimizer's inner one's
            return super().memory(model, cast("ZeroRedundancyOptimizer", self._optimizer).optim)
        params = [p for g in optimizer.param_groups for p in g["params"]]
        return held_bytes(
            {
                "params": [_local(p) for p in params],
                "grads": [_local(p.grad) for p in params if p.grad is not None],
                "optimizer": [_local(v) for st in optimizer.state.values() for v in st.values() if torch.is_tensor(v)],
                "buffers": [],  # FSDP2's gather and reduce-scatter buffers live only during a module's turn
            }
        )

    # ------------------------------------------------------------ checkpoints
    def optimizer_state_dict(self, optimizer: torch.optim.Optimizer) -> dict[str, Any] | None:
        """The optimizer's state, whole, on the main rank (None elsewhere), and the model's for
        :meth:`model_state_dict`: collective over the workers, each tensor gathered in turn and kept by
        the main rank alone."""
        if self._optimizer is None:  # one worker: nothing is sharded
            return super().optimizer_state_dict(optimizer)
        if self.stage == 1:
            zero = cast("ZeroRedundancyOptimizer", optimizer)
            zero.consolidate_state_dict(to=0)  # communication: every partition's state to rank 0
            return zero.state_dict() if self.is_main else None
        assert self._model is not None
        model_state = self._model.state_dict()  # communication: whole, through _gathered_state_dict
        self._model_state = model_state if self.is_main else None
        return cast(_Gathering, optimizer).gather(keep=self.is_main)

    def model_state_dict(self, model: torch.nn.Module) -> dict[str, torch.Tensor]:
        """The model's state gathered by :meth:`optimizer_state_dict`, which the trainer calls just before."""
        if self._model_state is None:
            return super().model_state_dict(model)
        state, self._model_state = self._model_state, None
        return state


class _Gathering(Protocol):
    """What :func:`_gathered_class` adds to the user's optimizer class."""

    def gather(self, keep: bool = True) -> dict[str, Any] | None: ...


def _gathered_class(cls: type[torch.optim.Optimizer]) -> type:
    """A subclass of the user's optimizer class whose ``state_dict()`` is the whole state in the class's own
    format, gathered from every rank's DTensor shards (collective: every rank calls it)."""

    def gather(self: torch.optim.Optimizer, keep: bool = True) -> dict[str, Any] | None:
        own = cls.state_dict(self)  # the class's own, over this rank's shards
        state: dict[int, dict[str, Any]] = {}
        for i in sorted(own["state"]):
            st = {key: _whole(v) for key, v in own["state"][i].items()}  # communication: one tensor at a time
            if keep:
                state[i] = st
        return {**own, "state": state} if keep else None

    def state_dict(self: torch.optim.Optimizer) -> dict[str, Any] | None:
        return gather(self)

    return type(cls.__name__, (cls,), {"state_dict": state_dict, "gather": gather, "__module__": cls.__module__})


def _gathered_state_dict(module: torch.nn.Module, state_dict: dict[str, Any], prefix: str, local_metadata: Any) -> None:
    """The model's state_dict with every DTensor gathered whole (communication: one all-gather each)."""
    for key in list(state_dict):
        state_dict[key] = _whole(state_dict[key]).detach()


def create(cfg: Config, wire: WireFormat) -> TorchSharded:
    """The engine of ``--strategy sharded --allreduce-engine torch`` (:func:`..create_sharded`)."""
    return TorchSharded(cfg.exchange, cfg.torch, wire=wire, stage=cfg.exchange.shard_stage)
