"""A user's own code named on the command line: ``--model PKG.MOD:FN``, ``--dataset PKG.MOD:FN``,
``--task PKG.MOD:FN``, with keyword arguments from ``--model-arg k=v`` / ``--dataset-arg k=v``.

Everything that can go wrong with a reference to someone else's code -- a module that does not
import, an attribute that is missing or not callable, a callable that raises or returns the wrong
type -- becomes one :class:`ConfigError` naming the flag, the reference and the cause, never a
traceback (the user's own exception is shown by type and message). Every rank resolves the same
reference alike, so every rank fails alike before any rank trains.
"""

from __future__ import annotations

import ast
import importlib
import re
import sys
from collections.abc import Callable
from typing import Any

from .errors import ConfigError

# PKG.MOD:FN, FN possibly dotted (a class's static method, an attribute of an object)
REF_RE = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")


def is_reference(text: str) -> bool:
    """Whether ``text`` names user code (``pkg.mod:fn``) rather than a registered name."""
    return ":" in text


def check_reference(flag: str, text: str) -> None:
    """The syntax of a reference, checked when the configuration is built (importing waits for the run)."""
    if not REF_RE.match(text):
        raise ConfigError(f"{flag} {text!r}: write MODULE:CALLABLE with an importable module, e.g. mypkg.net:build")


def resolve(flag: str, text: str) -> Callable[..., Any]:
    """Import ``pkg.mod:fn`` and return the callable ``fn``."""
    check_reference(flag, text)
    module_name, attr = text.split(":", 1)
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        where = "" if e.name != module_name.split(".")[0] else " (is its directory on PYTHONPATH on every host?)"
        raise ConfigError(f"{flag} {text}: cannot import {module_name}: {e}{where}") from None
    except Exception as e:  # the module itself failed while importing: its own error, one line
        raise ConfigError(f"{flag} {text}: importing {module_name} raised {type(e).__name__}: {e}") from None
    obj: Any = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            names = sorted(n for n in dir(module) if not n.startswith("_") and callable(getattr(module, n, None)))
            hint = f"; callables there: {', '.join(names[:12])}" if names else ""
            raise ConfigError(f"{flag} {text}: module {module_name} ({_where(module)}) has no attribute {attr!r}{hint}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise ConfigError(f"{flag} {text}: {attr} is a {type(obj).__name__}, not a callable")
    return obj


def call(flag: str, text: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)``; an exception it raises becomes one line naming the flag."""
    try:
        return fn(*args, **kwargs)
    except TypeError as e:
        if kwargs and ("argument" in str(e)):
            raise ConfigError(
                f"{flag} {text}: {e} (keyword arguments given: {', '.join(kwargs)}; fix the --*-arg flags)"
            ) from None
        raise ConfigError(f"{flag} {text} raised TypeError: {e}") from None
    except ConfigError:
        raise
    except Exception as e:
        raise ConfigError(f"{flag} {text} raised {type(e).__name__}: {e}") from None


def _where(module: Any) -> str:
    return getattr(module, "__file__", None) or "built in"


def parse_kwargs(flag: str, items: list[str] | tuple[str, ...]) -> dict[str, Any]:
    """``["depth=4", "name=gpt", "p=0.1", "bias=false"]`` -> ``{"depth": 4, "name": "gpt", "p": 0.1, "bias": False}``.

    A value is read as a Python literal (numbers, True/False, None, strings in quotes, tuples)
    where it is one; ``true``/``false`` as booleans; anything else stays a string."""
    out: dict[str, Any] = {}
    for item in items:
        k, eq, v = item.partition("=")
        if not eq or not k.isidentifier():
            raise ConfigError(f"{flag} {item!r}: write KEY=VALUE with a Python identifier as KEY, e.g. {flag} depth=4")
        if k in out:
            raise ConfigError(f"{flag} {k}: given twice")
        out[k] = literal(v)
    return out


def literal(v: str) -> Any:
    if v.lower() in ("true", "false"):
        return v.lower() == "true"
    try:
        return ast.literal_eval(v)
    except (ValueError, SyntaxError):
        return v


def label(text: str) -> str:
    """A short name for run directories and logs: ``mypkg.net:build`` -> ``net.build``."""
    module, _, attr = text.partition(":")
    name = f"{module.rsplit('.', 1)[-1]}.{attr}"
    return re.sub(r"[^\w.-]", "_", name)


def ensure_cwd_importable() -> None:
    """``python -m`` puts the working directory on sys.path; a console script does not. The user's
    package next to where they type should import either way, as with torchrun's scripts."""
    if "" not in sys.path and "." not in sys.path:
        sys.path.insert(0, "")
