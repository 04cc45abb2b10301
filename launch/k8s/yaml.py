"""The YAML the manifests are written in, by a small emitter (launch/ uses the standard library only):
strings that are not plainly safe are written as JSON strings, which YAML reads as double-quoted scalars."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence

# safe unquoted and never read as a number, bool or null: an optional "-"/"--" (flags), then a letter,
# "_" or "/" first; ":" only inside (a ": " or a final ":" would start a mapping)
PLAIN = re.compile(r"^-{0,2}[A-Za-z_/]([A-Za-z0-9_./:-]*[A-Za-z0-9_./-])?$")
YAML_WORDS = {"y", "n", "yes", "no", "on", "off", "true", "false", "null", "~"}


def _scalar(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if not isinstance(value, str):
        raise TypeError(f"cannot write {type(value).__name__} as YAML")
    if PLAIN.match(value) and value.lower() not in YAML_WORDS:
        return value
    return json.dumps(value)  # a JSON string is a valid double-quoted YAML scalar


def _emit(value: dict | list, indent: int, out: list[str]) -> None:
    pad = " " * indent
    if isinstance(value, dict):
        for key, item in value.items():
            if isinstance(item, (dict, list)) and item:
                out.append(f"{pad}{_scalar(key)}:")
                _emit(item, indent + 2 if isinstance(item, dict) else indent, out)
            else:
                out.append(f"{pad}{_scalar(key)}: {_inline(item)}")
    else:
        for item in value:
            if isinstance(item, (dict, list)) and item:
                sub: list[str] = []
                _emit(item, indent + 2, sub)
                out.append(f"{pad}- {sub[0][indent + 2 :]}")
                out += sub[1:]
            else:
                out.append(f"{pad}- {_inline(item)}")


def _inline(value: object) -> str:
    if isinstance(value, dict):
        return "{}"
    if isinstance(value, list):
        return "[]"
    return _scalar(value)


def to_yaml(docs: list[dict], header: Sequence[str] = ()) -> str:
    """YAML documents separated by ``---``, each ``header`` line first as a comment."""
    out = [f"# {line}" for line in header]
    for doc in docs:
        out.append("---")
        _emit(doc, 0, out)
    return "\n".join(out) + "\n"
