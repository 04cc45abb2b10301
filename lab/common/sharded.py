"""The sharded concept (``--strategy sharded --shard-stage S``, ZeRO stages 1-3) in the lab's method lists.

Every lab tool names a sharded method as its ring method on the same engine plus one suffix, ``-zero1``,
``-zero2`` or ``-zero3`` (bench ``trainer-mpi-zero2``, scaling ``allreduce-mpi-zero2``, time-to-accuracy
``ring-mpi-zero2``; the cost model's and recommend's label is ``zero2``): the engine is the ring's
(``--allreduce-engine``), what the suffix changes is who holds which part of the model. A tool offers a
(stage, engine) only where the trainer accepts it: :func:`refusal` asks the trainer's own configuration
(allreduce_train/config.py ``COMBINATIONS``, and its list of strategies), so the lab never builds a job the
trainer would refuse, and offers none while the trainer has no sharded strategy.
"""

from __future__ import annotations

import contextlib
import functools
import io

STAGES = (1, 2, 3)


def suffix(stage: int) -> str:
    """``-zero1``, ``-zero2``, ``-zero3``: what a sharded method's name adds to its ring method's."""
    return f"-zero{stage}"


def flags(stage: int, engine: str = "") -> tuple[str, ...]:
    """The trainer's flags of sharded stage ``stage`` on ``engine`` (``""``: the trainer's default engine)."""
    on = ("--allreduce-engine", engine) if engine else ()
    return ("--strategy", "sharded", *on, "--shard-stage", str(stage))


@functools.cache
def refusal(argv: tuple[str, ...]) -> str | None:
    """The trainer's one line refusing the train flags ``argv`` (on a registered model), None where it accepts
    them; a flag or value the trainer does not know (a strategy it lacks) is refused with its parser's line."""
    from allreduce_train.cli import make_parser
    from allreduce_train.config import build_config
    from allreduce_train.errors import UserError

    said = io.StringIO()
    try:
        with contextlib.redirect_stderr(said):
            build_config(make_parser().parse_args(["train", "--model", "lenet5", *argv]))
    except SystemExit:  # argparse: an unknown flag or choice
        return said.getvalue().strip().splitlines()[-1] if said.getvalue().strip() else "refused by the parser"
    except UserError as e:
        return str(e)
    return None


def accepted(stage: int, engine: str = "", extra: tuple[str, ...] = ()) -> bool:
    """Whether the trainer runs sharded ``stage`` on ``engine`` with ``extra`` flags (:func:`refusal`)."""
    return refusal((*flags(stage, engine), *extra)) is None
