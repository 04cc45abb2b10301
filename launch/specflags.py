"""Command-line flags generated from dataclass fields: the one generator of the launchers' specs
(``LaunchSpec``, Slurm's, Kubernetes') and of the trainer's configuration (allreduce_train/config.py).

Each field that is a flag is declared with :func:`option`: its default (the one place it lives: the
spec's and the flag's), its help text (``%(default)s`` prints that default) and what argparse needs
beyond the field's type. :func:`add_flags` adds one flag per such field, in field order;
:func:`spec_from_args` builds the spec back from the parsed arguments. A field without ``option``
(e.g. the interpreter a Slurm job runs) has no flag and keeps its default.

The trainer's configuration fields are :func:`option` fields too; :func:`add_flag` adds each one's flag: its
value lands in ``args.<section>.<field>``, None when not given, because the trainer merges the command line
over a TOML file's values and the defaults itself; a bool is ``--x/--no-x`` (either can override the
file) and the help ends with the default.

    nodes: int = option(2, "nodes (default: %(default)s)")                      # --nodes, type int
    np: int = option(1, "ranks", flag=("-np", "--np"))                            # two names
    resume: bool = option(True, "...", flag="--no-resume")                        # store_false
    mca: list[tuple[str, str]] = option([], "...", action="append", nargs=2, parse=pairs)
    min_np: int = option(0, "...", group="elastic restarts")                     # in a help section

Standard library only, like the rest of launch/.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable
from typing import Any, get_type_hints

FLAG = "flag"  # the metadata key that marks a field as a flag (the value: its argparse details)
_FIELD = object()  # option(flag_default=...) not given: the flag's default is the field's


def option(
    default: Any,
    help: str = "",
    *,
    flag: str | tuple[str, ...] = "",
    group: str = "",
    parse: Callable[[Any], Any] | None = None,
    add: Callable[[argparse.ArgumentParser, Any], None] | None = None,
    flag_default: Any = _FIELD,
    **argparse_kwargs: Any,
) -> Any:
    """A spec field that is also a flag.

    ``flag``: its name (or names, e.g. ``("-np", "--np")``) when not ``--`` + the field's name with ``-``
    (``"trainer_args"``, no dashes: the positional arguments after ``--``); ``group``: the title of the
    help section it is listed in (default: the parser's options); ``parse``: turns the parsed value into
    the field's (e.g. a list of ``KEY=VALUE`` into a dict), also applied to the flag's default; ``add``:
    adds the flag itself (``add(parser, default)``, with its own help) where launchers share one (it gets
    the argument group where ``group`` names one); ``flag_default``: the
    flag's own default where it differs in form (``""`` for no JSON object) or the spec's value is
    worked out from other flags (``None``); the rest goes to ``add_argument`` (choices, metavar,
    action, nargs). A repeatable flag (``action="append"``) starts from an empty list."""
    if flag_default is not _FIELD:
        argparse_kwargs["default"] = flag_default
    names = (flag,) if isinstance(flag, str) else tuple(flag)
    meta = {FLAG: {"help": help, "flag": names, "group": group, "parse": parse, "add": add, "kwargs": argparse_kwargs}}
    if isinstance(default, (list, dict)):
        return dataclasses.field(default_factory=lambda: type(default)(default), metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def flag(name: str) -> str:
    """A field's flag when not named otherwise: ``batch_size`` -> ``--batch-size``."""
    return "--" + name.replace("_", "-")


def help_text(f: dataclasses.Field) -> str:
    """An :func:`option` field's help text."""
    return f.metadata[FLAG]["help"]


def choices(f: dataclasses.Field) -> tuple | None:
    """An :func:`option` field's choices (None: any value of its type)."""
    return f.metadata[FLAG]["kwargs"].get("choices")


def trailing(words: list[str]) -> list[str]:
    """The words after the ``--`` that ends a launcher's own flags (argparse keeps it in a remainder)."""
    return words[1:] if words[:1] == ["--"] else list(words)


def trainer_args_option() -> Any:
    """A spec field that is the trainer's arguments after ``--`` (every launcher's last positional)."""
    return option([], "arguments for the trainer, after --", flag="trainer_args", parse=trailing)


def _default(f: dataclasses.Field) -> Any:
    return f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default


def flag_fields(cls: type) -> list[dataclasses.Field]:
    """The fields of ``cls`` that are flags, in their order."""
    return [f for f in dataclasses.fields(cls) if FLAG in f.metadata]


def flag_names(f: dataclasses.Field) -> tuple[str, ...]:
    """The flag's names on the command line (a positional's: its one name, without dashes)."""
    names = f.metadata[FLAG]["flag"]
    return names if names[0] else (flag(f.name),)


def add_flags(parser: argparse.ArgumentParser, cls: type) -> None:
    """One flag per :func:`option` field of a launcher's spec ``cls``, its default the field's, in field order."""
    hints = get_type_hints(cls)
    groups: dict[str, Any] = {}
    for f in flag_fields(cls):
        meta = f.metadata[FLAG]
        default = _default(f)
        where: Any = parser
        if meta["group"]:
            where = groups.get(meta["group"]) or groups.setdefault(
                meta["group"], parser.add_argument_group(meta["group"])
            )
        if meta["add"]:
            meta["add"](where, default)
            continue
        kwargs = dict(meta["kwargs"])
        kwargs["help"] = meta["help"]
        names = flag_names(f)
        name = names[0]
        if not name.startswith("-"):  # the trainer's arguments after --
            where.add_argument(name, nargs=argparse.REMAINDER, **kwargs)
            continue
        typ = hints[f.name]
        if typ is bool:
            if default and not name.startswith("--no-"):  # store_false under a positive name would invert it
                raise TypeError(f"{cls.__name__}.{f.name}: a bool that defaults to True needs flag='--no-...'")
            kwargs["action"] = "store_false" if default else "store_true"
        elif kwargs.get("action") == "append":
            default = []  # what the flag collects; ``parse`` makes the field's value of it
        elif typ in (int, float):
            kwargs.setdefault("type", typ)
        kwargs.setdefault("default", default)  # a flag whose default is worked out elsewhere passes its own
        where.add_argument(*names, dest=f.name, **kwargs)  # --no-resume sets resume


def add_flag(
    where: Any, cls: type, f: dataclasses.Field, *, section: str, prefix: str = "", hints: dict | None = None
) -> None:
    """A configuration field's flag on ``where`` (a parser or an argument group): ``--`` + the field's
    name, after ``prefix`` (an engine's section: ``--ps-servers``); its value in ``args.<section>.<field>``,
    None when not given; the help ends with the field's default. A ``list`` field is a repeatable
    ``KEY=VALUE``, a bool ``--x/--no-x``, anything else its type (shown as its choices, or its name)."""
    typ = (hints or get_type_hints(cls))[f.name]
    name = f"{prefix}_{f.name}" if prefix else f.name
    kwargs: dict[str, Any] = {
        "dest": f"{section}.{f.name}",
        "default": None,
        "help": f"{help_text(f)} (default: {_default(f)!r})",
    }
    if typ is list:
        where.add_argument(flag(name), action="append", metavar="KEY=VALUE", **kwargs)
    elif typ is bool:
        where.add_argument(flag(name), action=argparse.BooleanOptionalAction, **kwargs)
    else:
        metavar = name.upper()
        if choices(f):  # shown in --help as {a,b}
            kwargs["choices"] = choices(f)
            metavar = "{" + ",".join(map(str, kwargs["choices"])) + "}"
        where.add_argument(flag(name), type=typ, metavar=metavar, **kwargs)


def spec_kwargs(cls: type, args: argparse.Namespace) -> dict[str, Any]:
    """The :func:`option` fields' values from parsed arguments (each through its ``parse``)."""
    out = {}
    for f in flag_fields(cls):
        parse = f.metadata[FLAG]["parse"]
        value = getattr(args, f.name)
        out[f.name] = parse(value) if parse else value
    return out


def spec_from_args(cls: type, args: argparse.Namespace, **given: Any) -> Any:
    """``cls`` built from parsed arguments; ``given`` values (worked out from several flags) win."""
    return cls(**{**spec_kwargs(cls, args), **given})
