"""Atomic checkpoints: written by global rank 0, loaded by rank 0 and broadcast by the strategy.

Besides ``checkpoint.pt`` (the latest, what ``--resume auto`` reads) a run keeps what :class:`Kept`
says: the last ``--keep-checkpoints`` step checkpoints and the best by ``--target``'s metric. The
weights leave the project as a plain ``state_dict`` (:func:`export`) and come back into a new run
(:func:`init_weights`, ``--init-from``).
"""

from __future__ import annotations

import math
import os
import re
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import IO, Any

import torch

from .config import parse_target
from .errors import UserError

CHECKPOINT_NAME = "checkpoint.pt"
BEST_NAME = "checkpoint-best.pt"  # the best evaluation by --target's metric
STEPS_DIR = "checkpoints"  # --keep-checkpoints: step-000120.pt, ...
STEP_FILE = re.compile(r"^step-(\d+)\.pt$")
CHECKPOINT_KEYS = ("model", "optimizer", "step", "config")
SHARDS_DIR = "shards"  # --strategy sharded: each worker's optimizer state, step-000120.0-of-2.pt, ...
SHARD_FILE = re.compile(r"^step-(\d+)\.(\d+)-of-(\d+)\.pt$")


@dataclass
class WorkerState:
    """One worker's part of a checkpoint (its entry in ``workers``), each piece saved and loaded by
    its owner, so that a resumed run continues bit-exactly mid-epoch:

    * ``rng``, ``cuda_rng``: the trainer's random state (dropout masks);
    * ``task``: the task's (an LSTM's hidden state, the text's position);
    * ``exchange``: the wire format's (PowerSGD's error feedback and Qs; :mod:`.distributed.wire`);
    * ``schedule``: the schedule's, under its key (``local_sgd``, ``diloco``: the worker's own
      parameters and optimizer state between averagings; :mod:`.distributed.schedules`).

    On disk it is a plain dict with those keys (checkpoints written before this class read the same).
    """

    rng: torch.Tensor
    task: Any = None
    exchange: Any = None
    schedule: dict[str, Any] = field(default_factory=dict)
    cuda_rng: torch.Tensor | None = None

    def to_dict(self) -> dict[str, Any]:
        out = {"rng": self.rng, "task": self.task, **self.schedule, "exchange": self.exchange}
        if self.cuda_rng is not None:
            out["cuda_rng"] = self.cuda_rng
        return out

    @classmethod
    def from_dict(cls, saved: dict[str, Any], path: str = "") -> WorkerState:
        if not isinstance(saved, dict) or "rng" not in saved:
            raise UserError(
                f"--resume {path}: the checkpoint's per-worker state has no 'rng'; it was not written by "
                "allreduce_train's trainer (start afresh without --resume)"
            )
        own = ("rng", "task", "exchange", "cuda_rng")
        return cls(
            saved["rng"],
            saved.get("task"),
            saved.get("exchange"),
            {k: v for k, v in saved.items() if k not in own},
            saved.get("cuda_rng"),
        )


def _first_line(e: BaseException) -> str:
    """An exception as one line (torch's unpickling errors run over several)."""
    lines = str(e).strip().splitlines()
    return f"{type(e).__name__}: {lines[0] if lines else ''}"


def _write_atomically(path: str, write: Callable[[IO[bytes]], object]) -> None:
    """``write`` the file's bytes to a temporary file in ``path``'s directory, flush them to disk, and
    only then rename it over ``path``: a crash at any moment leaves either the previous file or the
    new one, never a torn one."""
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".checkpoint-", suffix=".tmp", dir=directory)
    mask = os.umask(0)
    os.umask(mask)
    try:
        os.fchmod(fd, 0o666 & ~mask)  # mkstemp's is 0600: give the file the mode open() would (weights to share)
        with os.fdopen(fd, "wb") as fh:
            write(fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    _sync_dir(directory)


def _sync_dir(directory: str) -> None:
    dir_fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dir_fd)  # make the rename itself durable
    finally:
        os.close(dir_fd)


def save(path: str, state: dict[str, Any]) -> None:
    """Write ``state`` to ``path`` atomically (see :func:`_write_atomically`), making its directory."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    _write_atomically(path, lambda fh: torch.save(state, fh))


def load(path: str, flag: str = "--resume") -> dict[str, Any]:
    """Read a checkpoint (tensors and plain data only: ``weights_only=True``); ``flag`` names what the
    user gave it to, in the error line."""
    if not os.path.isfile(path):
        raise UserError(f"{flag} {path}: checkpoint not found; give an existing checkpoint file or 'auto'")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # torch raises several types for a torn or foreign file
        raise UserError(f"{flag} {path}: not a readable checkpoint ({_first_line(e)})") from None
    for key in CHECKPOINT_KEYS:
        if not isinstance(state, dict) or key not in state:
            raise UserError(f"{flag} {path}: checkpoint lacks {key!r}; was it written by allreduce_train?")
    optimizer = state["optimizer"]
    if isinstance(optimizer, dict) and "shards" in optimizer:  # a manifest: the state is in the shards' files
        files = [_read_shard(path, name, flag) for name in optimizer.pop("shards")]
        optimizer["state"] = join_shards(files)
    return state


# ------------------------------------------------------------------ one file per shard (--strategy sharded)


def shard_file(step: int, rank: int, workers: int) -> str:
    """A worker's shard of a sharded checkpoint's optimizer state, under the run directory:
    ``shards/step-000120.0-of-2.pt``; the checkpoint itself (the manifest) names its step's files."""
    return os.path.join(SHARDS_DIR, f"step-{step:06d}.{rank}-of-{workers}.pt")


def _read_shard(manifest: str, name: str, flag: str) -> dict[str, Any]:
    """Shard file ``name`` of the checkpoint ``manifest``: under its run directory, which holds the
    manifest itself (``checkpoint.pt``) or the step checkpoints' directory (``checkpoints/step-NNNNNN.pt``)."""
    here = os.path.dirname(os.path.abspath(manifest))
    found = [c for c in (os.path.join(here, name), os.path.join(os.path.dirname(here), name)) if os.path.isfile(c)]
    if not found:
        raise UserError(
            f"{flag} {manifest}: its optimizer state is in {name} beside it, which is missing; keep the run "
            f"directory's {SHARDS_DIR}/ with its checkpoints"
        )
    try:
        return torch.load(found[0], map_location="cpu", weights_only=True)
    except Exception as e:
        raise UserError(f"{flag} {manifest}: {name} is not a readable shard file ({_first_line(e)})") from None


def join_shards(files: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    """The optimizer's state, whole, in its class's ``state_dict`` format (by parameter index), from every
    worker's shard file (``ShardedExchange.optimizer_shard``): each parameter's per-element tensors joined
    from its segments in order, the rest (``step``) from its first segment."""
    segments: dict[int, list[dict[str, Any]]] = {}
    for f in files:
        for i, segs in f["pieces"].items():
            segments.setdefault(i, []).extend(segs)
    state: dict[int, dict[str, Any]] = {}
    for i, segs in segments.items():
        segs.sort(key=lambda seg: seg["lo"])
        first = segs[0]
        if not first["state"] or any(set(seg["state"]) != set(first["state"]) for seg in segs):
            continue  # no step yet
        state[i] = {
            k: torch.cat([seg["state"][k] for seg in segs]).view(first["shape"]) if k in first["flat"] else v
            for k, v in first["state"].items()
        }
    return state


# ------------------------------------------------------------------ what a run keeps


def step_file(step: int) -> str:
    """A kept step checkpoint's path under the run directory: ``checkpoints/step-000120.pt``."""
    return os.path.join(STEPS_DIR, f"step-{step:06d}.pt")


class Kept:
    """The checkpoints a run writes (on the main rank) and keeps: ``checkpoint.pt``, the latest, always;
    with ``keep`` > 0 also the last ``keep`` step checkpoints (``checkpoints/step-NNNNNN.pt``; the latest
    is a hard link to the newest, no second copy); with a ``target`` (``--target``'s, given under
    ``--keep-best``), the best evaluation by its metric (``checkpoint-best.pt``, the direction from ``>=``
    or ``<=``). Each is a whole checkpoint: it resumes,
    exports and starts a fine-tuning run alike. The best value so far travels in every checkpoint
    (``best``), so a resumed run replaces ``checkpoint-best.pt`` only with a better one."""

    def __init__(self, run_dir: str, keep: int, target: str) -> None:
        self.run_dir, self.keep = run_dir, keep
        self.metric, self.op = parse_target(target)[:2] if target else ("", "")
        self.best: dict[str, Any] | None = None  # {"metric", "op", "value", "step"}
        self.best_step: int | None = None  # the step of checkpoint-best.pt, once written or read (prune_shards)

    def record(self, step: int, figures: dict[str, float]) -> bool:
        """Note one evaluation (the global figures, the same on every worker, so that all decide alike);
        True when it beats the best so far and ``checkpoint-best.pt`` is to be written."""
        value = figures.get(self.metric) if self.metric else None
        if value is None or not math.isfinite(value):
            return False
        if self.best is not None:
            old = self.best["value"]
            if not (value > old if self.op == ">=" else value < old):
                return False  # a tie keeps the earlier step
        self.best = {"metric": self.metric, "op": self.op, "value": value, "step": step}
        return True

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """A resumed run's best so far (main rank): the checkpoint's, or ``checkpoint-best.pt``'s where
        that is better (written after the checkpoint the run resumes from). A best by another metric
        or direction is forgotten: this run's ``--target`` decides."""
        found = [state.get("best")]
        path = os.path.join(self.run_dir, BEST_NAME)
        if os.path.isfile(path):
            try:  # mmap: only the small "best" entry is read, not the weights
                found.append(torch.load(path, map_location="cpu", weights_only=True, mmap=True).get("best"))
            except Exception:
                pass  # unreadable: the next better evaluation replaces it
        self.best = None
        for best in found:
            if isinstance(best, dict) and (best.get("metric"), best.get("op")) == (self.metric, self.op):
                self.record(int(best["step"]), {self.metric: float(best["value"])})

    def write(self, state: dict[str, Any], latest: bool, best: bool) -> None:
        """Write ``state`` (main rank) as the latest checkpoint and/or as the best; older step
        checkpoints are removed only once the new one is on disk."""
        state = {**state, "best": self.best}
        if best:
            save(os.path.join(self.run_dir, BEST_NAME), state)
            self.best_step = int(state["step"])
        if not latest:
            return
        path = os.path.join(self.run_dir, CHECKPOINT_NAME)
        if not self.keep:
            save(path, state)
            return
        kept = os.path.join(self.run_dir, step_file(int(state["step"])))
        save(kept, state)
        _link_atomically(kept, path, state)
        self._prune(int(state["step"]))

    def _prune(self, step: int) -> None:
        """Remove all but the newest ``keep`` step checkpoints up to ``step``; later ones (from a run
        this one resumed before) are not older and stay."""
        directory = os.path.join(self.run_dir, STEPS_DIR)
        steps = sorted(int(m.group(1)) for m in map(STEP_FILE.match, os.listdir(directory)) if m)
        for old in [s for s in steps if s <= step][: -self.keep]:
            os.unlink(os.path.join(self.run_dir, step_file(old)))

    def prune_shards(self, step: int, shards: list[str]) -> None:
        """Remove the shard files that no checkpoint kept here names any more, once step ``step``'s manifest
        (naming ``shards``) is written: each kept checkpoint names its own step's files, and a step is read
        from a file's name (``checkpoints/step-NNNNNN.pt``) or, for ``checkpoint-best.pt``, once from the
        file (not every manifest: mapping one costs the weights' size of virtual memory)."""
        directory = os.path.join(self.run_dir, SHARDS_DIR)
        steps_dir = os.path.join(self.run_dir, STEPS_DIR)
        kept = set()
        if os.path.isdir(steps_dir):
            kept = {int(m.group(1)) for m in map(STEP_FILE.match, os.listdir(steps_dir)) if m}
        best = os.path.join(self.run_dir, BEST_NAME)
        if self.best_step is None and os.path.isfile(best):
            self.best_step = int(torch.load(best, map_location="cpu", weights_only=True, mmap=True)["step"])
        kept.add(-1 if self.best_step is None else self.best_step)
        mine = {os.path.basename(n) for n in shards}
        for name in os.listdir(directory):
            m = SHARD_FILE.match(name)
            if m and name not in mine and (int(m.group(1)) != step and int(m.group(1)) not in kept):
                os.unlink(os.path.join(directory, name))


def _link_atomically(src: str, path: str, state: dict[str, Any]) -> None:
    """Make ``path`` the same file as ``src`` (a hard link renamed over it: atomic, no second copy);
    where the file system has no hard links, write ``state`` there too."""
    directory = os.path.dirname(os.path.abspath(path))
    tmp = os.path.join(directory, f".checkpoint-link-{os.getpid()}.tmp")
    try:
        if os.path.lexists(tmp):
            os.unlink(tmp)
        os.link(src, tmp)
    except OSError:
        save(path, state)
        return
    os.replace(tmp, path)
    _sync_dir(directory)


# ------------------------------------------------------------------ weights in and out


def _is_state_dict(obj: Any) -> bool:
    """A plain model state_dict: names -> tensors (a module's ``_extra_state`` may be anything)."""
    return (
        isinstance(obj, dict)
        and bool(obj)
        and all(isinstance(k, str) for k in obj)
        and all(isinstance(v, torch.Tensor) or k.endswith("_extra_state") for k, v in obj.items())
    )


def read_weights(path: str, flag: str) -> tuple[dict[str, Any], int | None]:
    """The model weights in ``path`` -- a plain state_dict (``.pt``), a ``.safetensors`` file, or an
    allreduce_train checkpoint (its ``model``) -- and the checkpoint's step (None for the others).
    Tensors and plain data only (``weights_only=True``); ``flag`` names the input in error lines."""
    if not os.path.isfile(path):
        raise UserError(f"{flag} {path}: file not found; give a checkpoint, a state_dict .pt or a .safetensors file")
    if path.endswith(".safetensors"):
        st = _safetensors(f"{flag} {path}")
        try:
            return st.load_file(path, device="cpu"), None
        except Exception as e:
            raise UserError(f"{flag} {path}: not a readable safetensors file ({_first_line(e)})") from None
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # torch raises several types for a torn or foreign file
        raise UserError(f"{flag} {path}: not a readable PyTorch file ({_first_line(e)})") from None
    if _is_state_dict(obj):
        return obj, None
    if isinstance(obj, dict) and all(k in obj for k in CHECKPOINT_KEYS) and _is_state_dict(obj["model"]):
        return obj["model"], int(obj["step"])
    raise UserError(
        f"{flag} {path}: neither a model state_dict (parameter names -> tensors) nor an allreduce_train checkpoint"
    )


def plain_state_dict(sd: dict[str, Any]) -> dict[str, Any]:
    """``sd`` as plain PyTorch loads it anywhere: every tensor detached, on the CPU, contiguous and
    owning exactly its own storage (no view into a larger buffer), while entries that were one tensor
    (tied weights: torch's state_dict names a shared parameter under each of its names) stay one."""
    out: dict[str, Any] = {}
    done: dict[tuple, torch.Tensor] = {}
    for name, t in sd.items():
        if not isinstance(t, torch.Tensor):
            out[name] = t
            continue
        alias = (t.device, t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), t.stride(), t.dtype)
        if alias not in done:
            c = t.detach().cpu().contiguous()
            if c.storage_offset() or c.untyped_storage().nbytes() != c.numel() * c.element_size():
                c = c.clone()  # a view of a larger storage: torch.save would write all of it
            done[alias] = c
        out[name] = done[alias]
    return out


def _safetensors(what: str) -> Any:
    try:
        import safetensors.torch
    except ImportError:
        raise UserError(
            f"{what}: .safetensors needs the safetensors package (pip install safetensors); or use a .pt file"
        ) from None
    return safetensors.torch


def _safetensors_bytes(sd: dict[str, Any], what: str) -> bytes:
    """``sd`` in the safetensors format, which stores every tensor apart and refuses any two that share
    memory: a tied weight is written once under each of its names (load_state_dict fills both, the
    same parameter), as a plain ``load_file`` then ``load_state_dict(strict=True)`` needs."""
    st = _safetensors(what)
    extra = [k for k, v in sd.items() if not isinstance(v, torch.Tensor)]
    if extra:
        raise UserError(
            f"{what}: safetensors holds tensors only and the model has other state ({extra[0]!r}, a module's "
            "get_extra_state); write a .pt file"
        )
    seen: set[int] = set()
    tensors = {}
    for name, t in sd.items():
        ptr = t.untyped_storage().data_ptr()
        tensors[name] = t.clone() if ptr in seen else t
        seen.add(ptr)
    return st.save(tensors, metadata={"format": "pt"})  # "pt": how transformers tells torch's layout


def export(source: str, out: str) -> dict[str, Any]:
    """``python -m allreduce_train export SOURCE --out FILE``: the model weights of a run directory (its
    ``checkpoint.pt``) or a checkpoint file as a plain state_dict (:func:`plain_state_dict`) in ``out``,
    written atomically: ``.safetensors`` in that format, any other name by ``torch.save``. Returns what
    was written: path, step (None from a plain state_dict), tensors, bytes."""
    path = os.path.join(source, CHECKPOINT_NAME) if os.path.isdir(source) else source
    if os.path.isdir(source) and not os.path.isfile(path):
        raise UserError(
            f"export {source}: no {CHECKPOINT_NAME} in this directory; give a run directory or a checkpoint file"
        )
    directory = os.path.dirname(os.path.abspath(out))
    if not os.path.isdir(directory):
        raise UserError(f"--out {out}: no directory {directory}; create it or write elsewhere")
    if os.path.isdir(out):
        raise UserError(f"--out {out}: a directory; give a file name, e.g. {os.path.join(out, 'model.pt')}")
    if os.path.exists(out) and os.path.exists(path) and os.path.samefile(out, path):
        raise UserError(f"--out {out}: the checkpoint itself; write the weights to another file")
    sd, step = read_weights(path, "export")
    sd = plain_state_dict(sd)
    if out.endswith(".safetensors"):
        data = _safetensors_bytes(sd, f"--out {out}")
        _write_atomically(out, lambda fh: fh.write(data))
    else:
        _write_atomically(out, lambda fh: torch.save(sd, fh))
    unique = {t.untyped_storage().data_ptr(): t for t in sd.values() if isinstance(t, torch.Tensor)}
    return {
        "path": path,
        "step": step,
        "tensors": sum(isinstance(t, torch.Tensor) for t in sd.values()),
        "bytes": sum(t.numel() * t.element_size() for t in unique.values()),
    }


def _shape(t: torch.Tensor) -> str:
    return "x".join(map(str, t.shape)) or "scalar"


def _few(names: list[str], n: int = 3) -> str:
    return ", ".join(names[:n]) + (f" and {len(names) - n} more" if len(names) > n else "")


def weights_mismatch(model: torch.nn.Module, sd: dict[str, Any]) -> str:
    """How ``sd`` fails to be ``model``'s weights, as part of one line ("" when it fits): the names
    missing from it, those it has in excess, and the shapes that differ (a few of each). A name that
    is another name's tied tensor in the model may be missing (safetensors writers often drop the
    duplicate): it is filled with its twin."""
    own = model.state_dict()
    twins: dict[tuple, list[str]] = {}
    for name, t in own.items():
        if isinstance(t, torch.Tensor):
            twins.setdefault((t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape)), []).append(name)
    group = {name: names for names in twins.values() for name in names}
    missing = [k for k in own if k not in sd and not any(n in sd for n in group.get(k, ()))]
    unexpected = [k for k in sd if k not in own]
    shapes = [
        f"{k} {_shape(sd[k])} in the file, {_shape(own[k])} here"
        for k in own
        if isinstance(sd.get(k), torch.Tensor) and isinstance(own[k], torch.Tensor) and sd[k].shape != own[k].shape
    ]
    parts = []
    if missing:
        parts.append(f"{len(missing)} missing ({_few(missing)})")
    if unexpected:
        parts.append(f"{len(unexpected)} not in this model ({_few(unexpected)})")
    if shapes:
        parts.append(f"{len(shapes)} of another shape ({_few(shapes, 2)})")
    return "; ".join(parts)


def init_weights(model: torch.nn.Module, path: str) -> int | None:
    """``--init-from PATH``: load the weights in ``path`` (:func:`read_weights`) into ``model`` -- weights
    only: the optimizer, the schedule and the step start afresh (fine-tuning). Refused in one line when
    they are another model's. Returns the checkpoint's step (None for a plain state_dict)."""
    sd, step = read_weights(path, "--init-from")
    wrong = weights_mismatch(model, sd)
    if wrong:
        raise UserError(
            f"--init-from {path}: not this model's weights: {wrong}; give weights of the same model "
            "(python -m allreduce_train export RUN_DIR --out FILE writes them from a run)"
        )
    try:
        model.load_state_dict(sd, strict=False)  # strictness checked above, tied names allowed to be missing
    except RuntimeError as e:  # e.g. a value that is no tensor where the model has one
        raise UserError(f"--init-from {path}: does not load into this model ({_first_line(e)})") from None
    return step
