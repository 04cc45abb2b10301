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
user's class over the sharded parameters, its state cut from the broadcast whole); the checkpoint's
``optimizer.state_dict()`` on the main rank is the class's own format for the whole model. Gathering
it is collective, and the trainer's main-rank-only calls cannot be: it happens in
:meth:`gather_from_workers`, which every worker calls just before the main rank writes (each tensor
gathered whole in turn, kept by the main rank alone). Evaluation, where the workers' shares of the
evaluation set may differ by a batch, runs on parameters gathered once when the model goes to
``eval()`` (every rank does, in the trainer's evaluate), so no forward waits for a gather the other
ranks never start. Under stages 2 and 3 ``model.state_dict()`` is collective too (every rank calls it:
``--dump-params``) and returns plain whole tensors.
"""

from __future__ import annotations

from typing import Any

import torch

from ...config import Config, ExchangeConfig, TorchConfig
from ...errors import UserError
from ..c10d import TorchDistributed

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


def _whole(value: Any) -> Any:
    """A DTensor gathered whole as a plain tensor (communication: an all-gather); anything else as is."""
    from torch.distributed.tensor import DTensor

    return value.full_tensor() if isinstance(value, DTensor) else value


class TorchSharded(TorchDistributed):
    """``--strategy sharded --allreduce-engine torch``: see the module docstring."""

    name = "sharded"

    def __init__(self, x: ExchangeConfig, cfg: TorchConfig, wire: torch.dtype = torch.float32, stage: int = 2) -> None:
        super().__init__(x, cfg, wire if stage == 1 else torch.float32)  # 2, 3: FSDP2 casts (reduce_dtype)
        self.stage, self.reduce_dtype = stage, wire
        self._model: torch.nn.Module | None = None
        self._optimizer: Any = None  # ZeroRedundancyOptimizer (stage 1), the user's class over shards (2, 3)
        self._model_state: dict[str, Any] | None = None  # gathered whole for the main rank's checkpoint

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "shard_stage": self.stage, "shard_impl": IMPLEMENTATION[self.stage]}

    # ------------------------------------------------------------ set-up
    def prepare(self, model, optimizer, every_step: bool = True):
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
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
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
        sharded.gathered = None
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
        self._whole_for_evaluation(model)
        return sharded

    def _whole_for_evaluation(self, model: torch.nn.Module) -> None:
        """Gather every module's parameters when the model goes to eval() and free them when it goes back
        to train(): evaluation's forwards then send nothing (the workers' numbers of evaluation batches
        may differ), and training's gather per module as before."""
        from torch.distributed.fsdp import FSDPModule

        sharded = [m for m in model.modules() if isinstance(m, FSDPModule)]
        train = model.train
        rerelease = self.stage == 3

        def switched(mode: bool = True) -> torch.nn.Module:
            if mode != model.training:
                for m in sharded:
                    if mode:
                        m.reshard()
                        m.set_reshard_after_forward(rerelease, recurse=False)
                    else:
                        m.set_reshard_after_forward(False, recurse=False)
                        m.unshard()  # communication: every module's parameters, whole
            return train(mode)

        model.train = switched  # type: ignore[method-assign]  # eval() calls self.train(False)

    # ------------------------------------------------------------ one step
    def synchronize(self) -> None:
        if self.stage == 1:
            super().synchronize()
        # stages 2, 3: FSDP2 reduce-scattered each module's gradients during backward and waited for
        # them at its end; each rank's .grad is its shard of the average

    # ------------------------------------------------------------ checkpoints
    def gather_from_workers(self, obj: Any) -> list[Any]:
        """Each worker's ``obj`` (:meth:`~..base.GradientExchange.gather_from_workers`) and, collectively
        with it, the whole model and optimizer state onto the main rank: the trainer calls this on every
        worker right before the main rank reads ``model_state_dict`` and ``optimizer.state_dict()``."""
        out = super().gather_from_workers(obj)
        if self._optimizer is None:
            return out
        if self.stage == 1:
            self._optimizer.consolidate_state_dict(to=0)  # communication: every partition's state to rank 0
            return out
        assert self._model is not None
        model_state = self._model.state_dict()  # communication: whole, through _gathered_state_dict
        mine: Any = super(type(self._optimizer), self._optimizer)
        own = mine.state_dict()  # the user's class's own, over this rank's shards
        state: dict[int, dict[str, Any]] = {}
        for i in sorted(own["state"]):
            st = {key: _whole(v) for key, v in own["state"][i].items()}  # communication: one tensor at a time
            if self.is_main:
                state[i] = st
        if self.is_main:
            self._model_state = model_state
            self._optimizer.gathered = {**own, "state": state}
        return out

    def apply(self, optimizer) -> None:
        optimizer.step()
        if self.stage > 1:
            optimizer.gathered = None  # the next checkpoint gathers afresh
            self._model_state = None

    def model_state_dict(self, model: torch.nn.Module) -> dict[str, torch.Tensor]:
        if self._model_state is not None:
            return self._model_state
        return super().model_state_dict(model)


def _gathered_class(cls: type) -> type:
    """A subclass of the user's optimizer class whose ``state_dict()`` is the whole state that
    :meth:`TorchSharded.gather_from_workers` gathered (a DTensor shard's state is not the class's format)."""

    def state_dict(self) -> dict[str, Any]:
        if self.gathered is None:
            raise RuntimeError(
                "--strategy sharded --allreduce-engine torch: the optimizer's whole state is gathered collectively; "
                "call the exchange's gather_from_workers on every worker first (the trainer's checkpoint does)"
            )
        return self.gathered

    return type(cls.__name__, (cls,), {"state_dict": state_dict, "__module__": cls.__module__})


def _gathered_state_dict(module: torch.nn.Module, state_dict: dict[str, Any], prefix: str, local_metadata: Any) -> None:
    """The model's state_dict with every DTensor gathered whole (communication: one all-gather each)."""
    for key in list(state_dict):
        state_dict[key] = _whole(state_dict[key]).detach()


def create(cfg: Config, wire: torch.dtype) -> TorchSharded:
    """The engine of ``--strategy sharded --allreduce-engine torch`` (:func:`..create_sharded`)."""
    return TorchSharded(cfg.exchange, cfg.torch, wire=wire, stage=cfg.exchange.shard_stage)
