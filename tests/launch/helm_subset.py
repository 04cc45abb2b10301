"""Render a helm chart with the subset of Go templates (text/template + sprig) the project's chart uses.

There is no helm binary here, so tests/launch/test_k8s.py renders deploy/helm/allreduce-train with
this: actions with ``{{-``/``-}}`` trimming and comments; ``if``/``else if``/``else``, ``range``
over lists and maps (keys sorted, as Go does), ``define``/``include``, variables (``:=``, ``=``,
``$``), pipelines and parentheses; the functions below. It mimics helm where a chart could
silently go wrong: values are read the way helm reads them (every number a float64, so that
``printf "%d"`` or ``eq`` on a raw number fails as it does in helm), a missing map key is nil and
a field of nil is an error, comparisons of different kinds are errors, values are checked against
values.schema.json. Anything outside the subset raises :class:`TemplateError` instead of guessing.
"""

from __future__ import annotations

import copy
import json
import math
import re
from decimal import Decimal
from pathlib import Path
from typing import Any

import jsonschema
import yaml


class TemplateError(Exception):
    pass


class Fail(TemplateError):
    """The chart's own ``fail``: a message meant for the user."""


# -- lexing and parsing ---------------------------------------------------------------------

ACTION = re.compile(r"\{\{(-\s)?(.*?)(\s-)?\}\}", re.S)
TOKEN = re.compile(r"""\s*(?:
    (?P<str>"(?:[^"\\]|\\.)*")
  | (?P<raw>`[^`]*`)
  | (?P<num>-?\d+(?:\.\d+)?)
  | (?P<decl>:=)
  | (?P<assign>=)
  | (?P<punct>[()|,])
  | (?P<var>\$[A-Za-z0-9_]*(?:\.[A-Za-z0-9_]+)*)
  | (?P<field>(?:\.[A-Za-z0-9_]+)+|\.)
  | (?P<ident>[A-Za-z_][A-Za-z0-9_]*)
)""", re.X)
KEYWORDS = {"if", "else", "end", "range", "define", "with", "template", "block"}


def tokenize(src: str) -> list[tuple[str, str]]:
    out, pos = [], 0
    src = src.strip()
    while pos < len(src):
        m = TOKEN.match(src, pos)
        if not m or m.end() == pos:
            raise TemplateError(f"cannot read {src[pos:]!r} in {{{{ {src} }}}}")
        kind = m.lastgroup
        out.append((kind, m.group(kind)))
        pos = m.end()
    return out


def lex(text: str) -> list[tuple[str, str]]:
    """[("text", s) | ("action", s)], with the trim markers applied to the neighbouring text."""
    items: list[tuple[str, str]] = []
    pos, trim_next = 0, False
    while True:
        m = ACTION.search(text, pos)
        chunk = text[pos:m.start()] if m else text[pos:]
        if trim_next:
            chunk = chunk.lstrip()
        if m and m.group(1):
            chunk = chunk.rstrip()
        if chunk:
            items.append(("text", chunk))
        if not m:
            return items
        body = m.group(2)
        if body.startswith("/*"):
            # Go ends a comment at its first */, which must close the action
            if body.find("*/") != len(body.rstrip()) - 2:
                raise TemplateError(f"comment must end with */ right before }}}}: {body[:40]!r}")
        else:
            items.append(("action", body))
        trim_next = bool(m.group(3))
        pos = m.end()


class Node:
    pass


class Text(Node):
    def __init__(self, s: str):
        self.s = s


class Action(Node):
    def __init__(self, pipe: "Pipeline"):
        self.pipe = pipe


class If(Node):
    def __init__(self):
        self.branches: list[tuple[Pipeline, list[Node]]] = []
        self.otherwise: list[Node] = []


class Range(Node):
    def __init__(self, pipe: "Pipeline"):
        self.pipe = pipe
        self.body: list[Node] = []
        self.otherwise: list[Node] = []


class Pipeline:
    def __init__(self, tokens: list[tuple[str, str]]):
        self.decl: list[str] = []
        self.op = ""
        for i, (kind, _) in enumerate(tokens):
            if kind in ("decl", "assign"):
                self.decl = [v for k, v in tokens[:i] if k == "var"]
                self.op = tokens[i][1]
                tokens = tokens[i + 1:]
                break
        self.cmds = split_pipe(tokens)


def split_pipe(tokens: list[tuple[str, str]]) -> list[list]:
    """Commands separated by | at depth 0; parenthesized groups become nested Pipelines."""
    cmds: list[list] = [[]]
    i = 0
    while i < len(tokens):
        kind, val = tokens[i]
        if kind == "punct" and val == "(":
            depth, j = 1, i + 1
            while depth:
                if j >= len(tokens):
                    raise TemplateError("unbalanced parentheses")
                depth += {"(": 1, ")": -1}.get(tokens[j][1], 0) if tokens[j][0] == "punct" else 0
                j += 1
            cmds[-1].append(("pipe", Pipeline(tokens[i + 1:j - 1])))
            i = j
            continue
        if kind == "punct" and val == "|":
            cmds.append([])
        elif kind == "punct":
            raise TemplateError(f"unexpected {val!r}")
        else:
            cmds[-1].append((kind, val))
        i += 1
    if any(not c for c in cmds):
        raise TemplateError("empty command in pipeline")
    return cmds


def parse(items: list[tuple[str, str]], defines: dict[str, list[Node]]) -> list[Node]:
    root: list[Node] = []
    stack: list[tuple[Node | None, list[Node]]] = [(None, root)]
    for kind, body in items:
        current = stack[-1][1]
        if kind == "text":
            current.append(Text(body))
            continue
        tokens = tokenize(body)
        word = tokens[0][1] if tokens[0][0] == "ident" else ""
        if word == "if":
            node = If()
            node.branches.append((Pipeline(tokens[1:]), []))
            current.append(node)
            stack.append((node, node.branches[0][1]))
        elif word == "range":
            node = Range(Pipeline(tokens[1:]))
            current.append(node)
            stack.append((node, node.body))
        elif word == "define":
            name = json.loads(tokens[1][1])
            defines[name] = []
            stack.append((Text(name), defines[name]))
        elif word == "else":
            owner = stack[-1][0]
            stack.pop()
            if len(tokens) > 1 and tokens[1][1] == "if" and isinstance(owner, If):
                owner.branches.append((Pipeline(tokens[2:]), []))
                stack.append((owner, owner.branches[-1][1]))
            elif isinstance(owner, (If, Range)):
                stack.append((owner, owner.otherwise))
            else:
                raise TemplateError("else outside if/range")
        elif word == "end":
            if len(stack) == 1:
                raise TemplateError("end without a block")
            stack.pop()
        elif word in KEYWORDS:
            raise TemplateError(f"{{{{ {word} }}}} is outside the subset")
        else:
            current.append(Action(Pipeline(tokens)))
    if len(stack) != 1:
        raise TemplateError("a block has no {{ end }}")
    return root


# -- values as helm sees them ---------------------------------------------------------------

def helmify(value: Any) -> Any:
    """helm reads values through JSON: every number is a float64."""
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, dict):
        return {str(k): helmify(v) for k, v in value.items()}
    if isinstance(value, list):
        return [helmify(v) for v in value]
    raise TemplateError(f"unsupported value {value!r}")


def go_str(value: Any) -> str:
    """fmt.Sprint: how {{ x }} and sprig's strval print a value."""
    if value is None:
        return "<no value>"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):  # Go's %v: shortest digits, exponent form outside [1e-4, 1e6)
        if value == 0:
            return "0"
        if -4 <= math.floor(math.log10(abs(value))) < 6:
            text = repr(value)
            return text[:-2] if text.endswith(".0") else text
        sign, digits, exp = Decimal(repr(value)).normalize().as_tuple()
        exp10 = exp + len(digits) - 1
        mant = str(digits[0]) + ("." + "".join(map(str, digits[1:])) if len(digits) > 1 else "")
        return f"{'-' if sign else ''}{mant}e{'+' if exp10 >= 0 else '-'}{abs(exp10):02d}"
    if isinstance(value, (int, str)):
        return str(value)
    raise TemplateError(f"cannot print {type(value).__name__} {value!r}")


def truth(value: Any) -> bool:
    if value is None or value is False:
        return False
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return value != 0
    if isinstance(value, (str, list, dict)):
        return len(value) > 0
    return True


def kind_of(value: Any) -> str:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int"
    if isinstance(value, float):
        return "float64"
    if isinstance(value, str):
        return "string"
    return type(value).__name__


def comparable(a: Any, b: Any, op: str) -> None:
    if kind_of(a) != kind_of(b):
        raise TemplateError(f"{op}: incompatible types for comparison ({kind_of(a)} and {kind_of(b)})")


def to_int(value: Any) -> int:
    if isinstance(value, bool) or value is None:
        return int(bool(value))
    if isinstance(value, (int, float)):
        return int(value)
    if isinstance(value, str):
        try:
            return int(float(value))
        except ValueError:
            return 0
    raise TemplateError(f"int of {value!r}")


def go_printf(fmt: str, *args: Any) -> str:
    out, i, args = [], 0, list(args)
    while i < len(fmt):
        c = fmt[i]
        if c != "%":
            out.append(c)
            i += 1
            continue
        verb = fmt[i + 1]
        i += 2
        if verb == "%":
            out.append("%")
            continue
        arg = args.pop(0)
        if verb == "d":
            if kind_of(arg) != "int":
                raise TemplateError(f"printf %d of a {kind_of(arg)} prints %!d({kind_of(arg)}={go_str(arg)})")
            out.append(str(arg))
        elif verb in "sv":
            out.append(go_str(arg))
        elif verb == "q":
            out.append(json.dumps(go_str(arg), ensure_ascii=False))
        else:
            raise TemplateError(f"printf verb %{verb} is outside the subset")
    return "".join(out)


def _fail(msg: str) -> None:
    raise Fail(msg)


def _required(msg: str, value: Any) -> Any:
    if value is None or value == "":
        raise Fail(msg)
    return value


def _default(default: Any, value: Any = None) -> Any:
    return value if truth(value) else default


def _cmp(op: str, fn):
    def compare(a, b):
        comparable(a, b, op)
        return fn(a, b)
    return compare


def _eq(a: Any, *others: Any) -> bool:
    for b in others:
        comparable(a, b, "eq")
        if a == b:
            return True
    return False


def _dict(*kv: Any) -> dict:
    return {go_str(kv[i]): kv[i + 1] for i in range(0, len(kv), 2)}


FUNCS = {
    "quote": lambda *a: " ".join(json.dumps(go_str(x), ensure_ascii=False) for x in a if x is not None),
    "squote": lambda *a: " ".join(f"'{go_str(x)}'" for x in a if x is not None),
    "toString": go_str,
    "int": to_int,
    "mul": lambda *a: math.prod(to_int(x) for x in a),
    "add": lambda *a: sum(to_int(x) for x in a),
    "sub": lambda a, b: to_int(a) - to_int(b),
    "printf": go_printf,
    "indent": lambda n, s: "\n".join(" " * to_int(n) + line for line in s.split("\n")),
    "nindent": lambda n, s: "\n" + "\n".join(" " * to_int(n) + line for line in s.split("\n")),
    "trim": lambda s: s.strip(),
    "trimPrefix": lambda p, s: s[len(p):] if s.startswith(p) else s,
    "trimSuffix": lambda p, s: s[:-len(p)] if p and s.endswith(p) else s,
    "hasPrefix": lambda p, s: s.startswith(p),
    "hasSuffix": lambda p, s: s.endswith(p),
    "hasKey": lambda d, k: k in d,
    "list": lambda *a: list(a),
    "dict": _dict,
    "default": _default,
    "empty": lambda v: not truth(v),
    "required": _required,
    "fail": _fail,
    "eq": _eq,
    "ne": lambda a, b: not _eq(a, b),
    "lt": _cmp("lt", lambda a, b: a < b),
    "le": _cmp("le", lambda a, b: a <= b),
    "gt": _cmp("gt", lambda a, b: a > b),
    "ge": _cmp("ge", lambda a, b: a >= b),
    "not": lambda v: not truth(v),
    "and": lambda *a: next((x for x in a if not truth(x)), a[-1]),
    "or": lambda *a: next((x for x in a if truth(x)), a[-1]),
    "len": len,
    "lower": str.lower,
    "upper": str.upper,
}


# -- evaluation -----------------------------------------------------------------------------

class Renderer:
    def __init__(self, defines: dict[str, list[Node]]):
        self.defines = defines

    def run(self, nodes: list[Node], dot: Any, scopes: list[dict]) -> str:
        out: list[str] = []
        scopes = scopes + [{}]
        for node in nodes:
            if isinstance(node, Text):
                out.append(node.s)
            elif isinstance(node, Action):
                value = self.pipeline(node.pipe, dot, scopes)
                if not node.pipe.decl:
                    out.append(go_str(value))
            elif isinstance(node, If):
                for pipe, body in node.branches:
                    if truth(self.pipeline(pipe, dot, scopes + [{}])):
                        out.append(self.run(body, dot, scopes))
                        break
                else:
                    out.append(self.run(node.otherwise, dot, scopes))
            elif isinstance(node, Range):
                out.append(self.range(node, dot, scopes))
        return "".join(out)

    def range(self, node: Range, dot: Any, scopes: list[dict]) -> str:
        pipe = node.pipe
        value = self.pipeline(pipe, dot, scopes, cmds=pipe.cmds)
        if isinstance(value, dict):
            pairs = [(k, value[k]) for k in sorted(value)]
        elif isinstance(value, list):
            pairs = list(enumerate(value))
        elif value is None:
            pairs = []
        else:
            raise TemplateError(f"range over {kind_of(value)}")
        if not pairs:
            return self.run(node.otherwise, dot, scopes)
        out = []
        for key, item in pairs:
            names = pipe.decl
            frame = {}
            if len(names) == 1:
                frame[names[0]] = item
            elif len(names) == 2:
                frame[names[0]], frame[names[1]] = key, item
            out.append(self.run(node.body, item, scopes + [frame]))
        return "".join(out)

    def pipeline(self, pipe: Pipeline, dot: Any, scopes: list[dict], cmds: list | None = None) -> Any:
        value, first = None, True
        for cmd in (pipe.cmds if cmds is None else cmds):
            value = self.command(cmd, dot, scopes, None if first else [value])
            first = False
        if cmds is None and pipe.decl:
            name = pipe.decl[0]
            if pipe.op == ":=":
                scopes[-1][name] = value
            else:
                for scope in reversed(scopes):
                    if name in scope:
                        scope[name] = value
                        break
                else:
                    raise TemplateError(f"undefined variable {name}")
        return value

    def command(self, cmd: list, dot: Any, scopes: list[dict], piped: list | None) -> Any:
        kind, val = cmd[0]
        if kind == "ident" and val not in ("true", "false", "nil"):
            args = [self.operand(a, dot, scopes) for a in cmd[1:]] + (piped or [])
            if val == "include":
                name, data = args
                if name not in self.defines:
                    raise TemplateError(f"no template {name!r}")
                return self.run(self.defines[name], data, [{"$": data}])
            if val not in FUNCS:
                raise TemplateError(f"function {val!r} is outside the subset")
            try:
                return FUNCS[val](*args)
            except (TypeError, KeyError, IndexError, AttributeError) as e:
                raise TemplateError(f"{val}: {e}") from None
        if len(cmd) > 1 or piped:
            raise TemplateError(f"{val!r} is not a function")
        return self.operand(cmd[0], dot, scopes)

    def operand(self, token: tuple, dot: Any, scopes: list[dict]) -> Any:
        kind, val = token
        if kind == "pipe":
            return self.pipeline(val, dot, scopes, cmds=val.cmds)
        if kind == "str":
            return json.loads(val)
        if kind == "raw":
            return val[1:-1]
        if kind == "num":
            return float(val) if "." in val else int(val)
        if kind == "ident":
            return {"true": True, "false": False, "nil": None}[val]
        if kind == "field":
            return self.walk(dot, val.split(".")[1:] if val != "." else [], val)
        if kind == "var":
            name, *path = val.split(".")
            for scope in reversed(scopes):
                if name in scope:
                    return self.walk(scope[name], path, val)
            raise TemplateError(f"undefined variable {name}")
        raise TemplateError(f"unexpected {val!r}")

    @staticmethod
    def walk(value: Any, path: list[str], text: str) -> Any:
        for i, key in enumerate(path):
            if value is None:
                raise TemplateError(f"{text}: nil pointer evaluating .{'.'.join(path[:i + 1])}")
            if not isinstance(value, dict):
                raise TemplateError(f"{text}: can't evaluate field {key} in type {kind_of(value)}")
            value = value.get(key)
        return value


# -- the chart ------------------------------------------------------------------------------

def merge(base: dict, override: dict) -> dict:
    out = copy.deepcopy(base)
    for key, value in override.items():
        out[key] = merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def render_chart(chart: Path, release: str, values: dict | None = None, namespace: str = "default") -> str:
    """``helm template RELEASE CHART --set ...``: every rendered template, as one YAML stream."""
    merged = merge(yaml.safe_load((chart / "values.yaml").read_text()) or {}, values or {})
    schema = chart / "values.schema.json"
    if schema.exists():
        try:
            jsonschema.validate(merged, json.loads(schema.read_text()))
        except jsonschema.ValidationError as e:
            path = ".".join(str(p) for p in e.absolute_path)
            raise Fail(f"values don't meet the specifications of the schema: {path}: {e.message}") from None
    meta = yaml.safe_load((chart / "Chart.yaml").read_text())
    top = {"Values": helmify(merged), "Release": {"Name": release, "Namespace": namespace, "Service": "Helm"},
           "Chart": {k[:1].upper() + k[1:]: v for k, v in meta.items()}}
    defines: dict[str, list[Node]] = {}
    templates = sorted((chart / "templates").glob("*"))
    parsed = [(t, parse(lex(t.read_text()), defines)) for t in templates]
    renderer = Renderer(defines)
    docs = []
    for path, nodes in parsed:
        if path.name.startswith("_") or path.suffix not in (".yaml", ".yml"):
            continue
        text = renderer.run(nodes, top, [{"$": top}])
        if text.strip():
            docs.append(f"---\n# Source: {chart.name}/templates/{path.name}\n{text.strip()}\n")
    return "".join(docs)
