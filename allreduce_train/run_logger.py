"""Rank-0 side effects behind one gate: TensorBoard, the progress bar, metrics.json.

Only the process with global rank 0 gets a real :class:`RunLogger`; every other rank gets a
:class:`NullLogger` with the same methods that do nothing, so the training loop has no
``if rank == 0`` branches. Figures handed to a logger are already global (reduced over workers).
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from typing import Any


class NullLogger:
    """The logger of every rank but global rank 0."""

    def scalars(self, step: int, values: dict[str, float]) -> None:
        pass

    def text(self, tag: str, text: str) -> None:
        pass

    def hparams(self, hparams: dict[str, Any], metrics: dict[str, float]) -> None:
        pass

    def progress(self, n: int, **postfix: Any) -> None:
        pass

    def message(self, msg: str) -> None:
        pass

    def write_json(self, name: str, data: dict[str, Any]) -> None:
        pass

    def close(self) -> None:
        pass


class RunLogger(NullLogger):
    def __init__(self, run_dir: str, total_steps: int, initial_step: int, tensorboard: bool, progress: bool) -> None:
        self.run_dir = run_dir
        self.writer = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self.writer = SummaryWriter(log_dir=run_dir)
        self.bar = None
        if progress:
            from tqdm import tqdm

            self.bar = tqdm(
                total=total_steps,
                initial=initial_step,
                unit="step",
                dynamic_ncols=True,
                disable=not sys.stderr.isatty() and os.environ.get("ALLREDUCE_TRAIN_PROGRESS") != "1",
            )

    def scalars(self, step: int, values: dict[str, float]) -> None:
        if self.writer:
            for tag, v in values.items():
                self.writer.add_scalar(tag, v, step)

    def text(self, tag: str, text: str) -> None:
        if self.writer:
            self.writer.add_text(tag, text)

    def hparams(self, hparams: dict[str, Any], metrics: dict[str, float]) -> None:
        if self.writer:
            clean = {k: v if isinstance(v, (int, float, str, bool)) else str(v) for k, v in hparams.items()}
            self.writer.add_hparams(clean, metrics, run_name=".")

    def progress(self, n: int, **postfix: Any) -> None:
        if self.bar:
            self.bar.update(n)
            if postfix:
                self.bar.set_postfix(postfix, refresh=False)

    def message(self, msg: str) -> None:
        if self.bar and not self.bar.disable:
            self.bar.write(msg)
        else:
            print(msg, flush=True)

    def write_json(self, name: str, data: dict[str, Any]) -> None:
        path = os.path.join(self.run_dir, name)
        tmp = path + ".tmp"
        with open(tmp, "w") as fh:
            json.dump(data, fh, indent=2, sort_keys=True)
            fh.write("\n")
        os.replace(tmp, path)

    def close(self) -> None:
        if self.bar:
            self.bar.close()
        if self.writer:
            self.writer.close()


def config_text(cfg: Any) -> str:
    """The run's configuration as TensorBoard text (a Markdown code block of its JSON)."""
    return "```\n" + json.dumps(cfg.to_dict(), indent=2) + "\n```"


def flat_hparams(cfg: Any) -> dict[str, Any]:
    """The configuration as TensorBoard HParams: ``section.field`` -> value."""
    return {f"{sec}.{k}": v for sec, d in dataclasses.asdict(cfg).items() for k, v in d.items()}
