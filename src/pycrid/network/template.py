"""Render CNI config templates written in Go's ``text/template`` syntax.

containerd's CRI ``conf_template`` names a Go template, rendered with ``{PodCIDR,
PodCIDRRanges, Routes}`` into the CNI conflist once the kubelet reports the pod CIDR.
pycrid has no Go, so this interprets the subset such templates use: comments, trim
markers, fields, variables, ``if``/``else if``/``else``, ``range``/``else`` and the
functions ``not eq ne len and or index``.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ["TemplateError", "render"]

_WS = " \t\r\n"
# {{ with optional "- " trim marker, the body (strings and comments may hold "}}"), and }}
_ACTION = re.compile(
    r'\{\{(-[ \t\r\n])?((?>"(?:[^"\\\n]|\\.)*"|`[^`]*`|/\*.*?\*/|.)*?)([ \t\r\n]-)?\}\}', re.S
)
_TOKEN = re.compile(
    r'\s+|(?P<str>"(?:[^"\\]|\\.)*"|`[^`]*`)|(?P<num>-?\d+)|(?P<ref>(?:\$\w*)?(?:\.\w+)+|\.|\$\w*)'
    r"|(?P<op>:=|[=(),|])|(?P<ident>[A-Za-z_]\w*)"
)
# function name -> (minimum, maximum) argument count
_FUNCS = {"not": (1, 1), "len": (1, 1), "ne": (2, 2), "eq": (2, 99), "and": (1, 99)}
_FUNCS |= {"or": (1, 99), "index": (1, 99)}
_CONSTS = {"true": True, "false": False, "nil": None}
_Expr = tuple[Any, ...]  # ("lit", value) | ("ref", "." or "$var", path) | ("call", name, args)
_Tok = tuple[str, str]


class TemplateError(ValueError):
    """The template is malformed or cannot be evaluated with the given data."""


@dataclass(frozen=True)
class _Act:
    line: int
    src: str  # the whole action, delimiters included
    toks: list[_Tok]

    def error(self, msg: str) -> TemplateError:
        return TemplateError(f"line {self.line}: {msg} in {self.src}")


@dataclass
class _Node:
    kind: str  # "print", "if" or "range"
    act: _Act
    decls: tuple[str, ...]
    expr: _Expr
    body: list[str | _Node] = field(default_factory=list)
    orelse: list[str | _Node] = field(default_factory=list)


def render(text: str, data: Mapping[str, Any]) -> str:
    """Render ``text`` (Go template syntax, subset) with ``data`` as dot and ``$``."""
    parser = _Parser(_lex(text))
    nodes, end, _ = parser.block()
    if end is not None:
        raise end.error(f"unexpected {{{{{end.toks[0][1]}}}}}")
    out: list[str] = []
    _Exec(data).run(nodes, data, out)
    return "".join(out)


def _lex(text: str) -> list[str | _Act]:
    items: list[str | _Act] = []
    pos, trim = 0, False
    while (start := text.find("{{", pos)) >= 0:
        line = text.count("\n", 0, start) + 1
        if (m := _ACTION.match(text, start)) is None:
            raise TemplateError(f"line {line}: unclosed action {text[start : start + 40]!r}")
        chunk = text[pos:start].lstrip(_WS) if trim else text[pos:start]
        chunk = chunk.rstrip(_WS) if m[1] else chunk
        items += [chunk] if chunk else []
        pos, trim = m.end(), bool(m[3])
        act, body = _Act(line, m[0], []), m[2].strip(_WS)
        if body.startswith("/*"):
            if not body.endswith("*/"):
                raise act.error("text after comment")
            continue
        while body:
            if (tok := _TOKEN.match(body)) is None:
                raise act.error(f"unexpected {body[0]!r}")
            act.toks.extend([(tok.lastgroup, tok[0])] if tok.lastgroup else [])
            body = body[tok.end() :]
        items.append(act)
    chunk = text[pos:].lstrip(_WS) if trim else text[pos:]
    return [*items, chunk] if chunk else items


class _Parser:
    def __init__(self, items: list[str | _Act]) -> None:
        self.items, self.pos, self.scope = items, 0, ["$"]

    def block(self) -> tuple[list[str | _Node], _Act | None, list[_Tok]]:
        """Nodes up to the next ``else``/``end`` (returned with its tokens) or the end."""
        nodes: list[str | _Node] = []
        while self.pos < len(self.items):
            item = self.items[self.pos]
            self.pos += 1
            if isinstance(item, str):
                nodes.append(item)
                continue
            toks = item.toks
            head = toks[0][1] if toks and toks[0][0] == "ident" else ""
            if head in ("else", "end"):
                return nodes, item, toks
            if head in ("if", "range"):
                nodes.append(self.control(head, item, toks[1:]))
            else:
                nodes.append(self.pipe("print", item, toks))
        return nodes, None, []

    def control(self, kind: str, act: _Act, toks: list[_Tok]) -> _Node:
        mark = len(self.scope)
        node = self.pipe(kind, act, toks)
        inner = len(self.scope)
        node.body, end, etoks = self.block()
        del self.scope[inner:]
        if end is not None and etoks[:2] == [("ident", "else"), ("ident", "if")]:
            node.orelse = [self.control("if", end, etoks[2:])]  # it consumes the {{end}}
            del self.scope[mark:]
            return node
        if end is not None and etoks[0][1] == "else":
            if len(etoks) > 1:
                raise end.error("unexpected text after else")
            node.orelse, end, etoks = self.block()
            if end is not None and etoks[0][1] == "else":
                raise end.error(f"extra else in {{{{{kind}}}}} from line {act.line}")
        if end is None:
            raise act.error(f"{{{{{kind}}}}} not closed by {{{{end}}}}")
        if len(etoks) > 1:
            raise end.error("unexpected text after end")
        del self.scope[mark:]
        return node

    def pipe(self, kind: str, act: _Act, toks: list[_Tok]) -> _Node:
        decls: list[str] = []
        if ("op", ":=") in toks:
            split = toks.index(("op", ":="))
            decls = [n for _, n in toks[:split:2]]
            names_ok = all(t == "ref" and re.fullmatch(r"\$\w+", n) for t, n in toks[:split:2])
            if not decls or not names_ok or toks[1:split:2] not in ([], [("op", ",")]):
                raise act.error("bad variable declaration")
            if len(decls) > (2 if kind == "range" else 1):
                raise act.error("too many declarations")
            toks = toks[split + 1 :]
        expr, pos = self.command(act, toks, 0)
        if pos < len(toks):
            raise act.error(f"unexpected {toks[pos][1]!r}")
        self.scope += decls
        return _Node(kind, act, tuple(decls), expr)

    def command(self, act: _Act, toks: list[_Tok], pos: int) -> tuple[_Expr, int]:
        name = toks[pos][1] if pos < len(toks) and toks[pos][0] == "ident" else ""
        if name and name not in _CONSTS and name not in _FUNCS:
            raise act.error(f"function or action {name!r} not supported")
        pos += name in _FUNCS
        args: list[_Expr] = []
        while pos < len(toks) and toks[pos] != ("op", ")"):
            arg, pos = self.operand(act, toks, pos)
            args.append(arg)
        if name in _FUNCS:
            if not _FUNCS[name][0] <= len(args) <= _FUNCS[name][1]:
                raise act.error(f"wrong number of args for {name}: got {len(args)}")
            return ("call", name, args), pos
        if len(args) != 1:
            raise act.error("missing value" if not args else "can't give argument to non-function")
        return args[0], pos

    def operand(self, act: _Act, toks: list[_Tok], pos: int) -> tuple[_Expr, int]:
        kind, text = toks[pos]
        if kind in ("str", "num"):
            try:
                return ("lit", text[1:-1] if text[0] == "`" else ast.literal_eval(text)), pos + 1
            except (ValueError, SyntaxError) as exc:
                raise act.error(f"bad literal {text}") from exc
        if kind == "ident" and text in _CONSTS:
            return ("lit", _CONSTS[text]), pos + 1
        if kind == "ident":
            raise act.error(f"function {text!r} as an argument needs parentheses")
        if kind == "ref":
            base, *path = text.split(".") if text != "." else [""]
            if base and base not in self.scope:
                raise act.error(f"undefined variable {base!r}")
            return ("ref", base or ".", path), pos + 1
        if text == "(":
            expr, pos = self.command(act, toks, pos + 1)
            if pos >= len(toks):
                raise act.error("unclosed left paren")
            return expr, pos + 1
        raise act.error(f"unexpected {text!r}")


def _truth(v: Any) -> bool:
    return bool(v) if v is None or isinstance(v, bool | int | float | Sequence | Mapping) else True


def _format(v: Any) -> str:
    if v is None:
        return "<nil>"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, list | tuple):
        return "[" + " ".join(_format(x) for x in v) + "]"
    if isinstance(v, Mapping):
        return "map[" + " ".join(f"{_format(k)}:{_format(v[k])}" for k in sorted(v)) + "]"
    return str(v)


class _Exec:
    def __init__(self, root: Any) -> None:
        self.vars: list[tuple[str, Any]] = [("$", root)]

    def run(self, nodes: list[str | _Node], dot: Any, out: list[str]) -> None:
        for node in nodes:
            mark = len(self.vars)
            if isinstance(node, str):
                out.append(node)
            elif node.kind == "range":
                self.range(node, dot, out)
            else:
                value = self.eval(node.expr, dot, node.act)
                self.vars += [(name, value) for name in node.decls]
                if node.kind == "print":
                    out += [] if node.decls else [_format(value)]
                    continue  # a declaration in a printing action stays in scope
                self.run(node.body if _truth(value) else node.orelse, dot, out)
            del self.vars[mark:]

    def range(self, node: _Node, dot: Any, out: list[str]) -> None:
        value = self.eval(node.expr, dot, node.act)
        if isinstance(value, Mapping):
            items: list[tuple[Any, Any]] = [(k, value[k]) for k in sorted(value)]
        elif isinstance(value, list | tuple) or value is None:
            items = list(enumerate(value or ()))
        else:
            raise node.act.error(f"can't range over {type(value).__name__}")
        if not items:
            self.run(node.orelse, dot, out)
        mark = len(self.vars)
        for key, elem in items:
            del self.vars[mark:]
            self.vars += zip(node.decls, (key, elem)[2 - len(node.decls) :], strict=True)
            self.run(node.body, elem, out)

    def eval(self, expr: _Expr, dot: Any, act: _Act) -> Any:
        if expr[0] == "lit":
            return expr[1]
        if expr[0] == "call":
            return self.call(expr[1], expr[2], dot, act)
        value = dot
        if expr[1] != ".":
            found = [v for n, v in self.vars if n == expr[1]]
            if not found:  # e.g. a range variable used in the range's else
                raise act.error(f"undefined variable {expr[1]!r}")
            value = found[-1]
        for name in expr[2]:
            if not isinstance(value, Mapping):
                raise act.error(f"can't evaluate field {name} in type {type(value).__name__}")
            if name not in value:
                raise act.error(f"no field or key {name!r}")
            value = value[name]
        return value

    def call(self, name: str, exprs: list[_Expr], dot: Any, act: _Act) -> Any:
        if name in ("and", "or"):
            for expr in exprs:  # short-circuit: the first deciding value, else the last
                if _truth(value := self.eval(expr, dot, act)) == (name == "or"):
                    break
            return value
        args = [self.eval(expr, dot, act) for expr in exprs]
        if name == "not":
            return not _truth(args[0])
        if name == "len":
            if not isinstance(args[0], str | Sequence | Mapping):
                raise act.error(f"len of type {type(args[0]).__name__}")
            return len(args[0].encode() if isinstance(args[0], str) else args[0])
        if name == "index":
            value = args[0]
            for key in args[1:]:
                if isinstance(value, Mapping):
                    value = value.get(key)
                elif isinstance(value, list | tuple) and type(key) is int:
                    if not 0 <= key < len(value):
                        raise act.error(f"index out of range: {key}")
                    value = value[key]
                else:
                    raise act.error(f"can't index {type(value).__name__} with {key!r}")
            return value
        if any(a is not None and not isinstance(a, bool | int | str) for a in args):
            raise act.error("uncomparable value")
        if len({type(a) for a in args}) > 1:
            raise act.error(f"incompatible types for comparison: {args!r}")
        equal = any(args[0] == other for other in args[1:])
        return equal if name == "eq" else not equal
