"""containerd's filter expressions, for Containers.List (``ctr containers ls`` sends them).

One expression is selectors joined by ``,`` (all must match); a request's several
expressions match when any one does. A selector is a field path (``id``, ``image``,
``runtime.name``, ``snapshotter``, ``labels.<key>``; a part with dots or dashes is
quoted: ``labels."io.cri-containerd.kind"``) alone (the field is present), or followed
by ``==``, ``!=`` or ``~=`` (a regular expression) and a value, bare or double-quoted.
Pure: strings in, predicates out.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from pycrid.errors import InvalidArgument

#: A field of an object by path, or None when it has none.
Fields = Callable[[Sequence[str]], str | None]

_QUOTED = re.compile(r'"(?:[^"\\]|\\.)*"')
_FIELD = re.compile(r"[A-Za-z][A-Za-z0-9_]*")
_OP = re.compile(r"==|!=|~=")
_BARE_VALUE = re.compile(r"[^\s,]+")


@dataclass(frozen=True)
class Selector:
    path: tuple[str, ...]
    #: "" (present), "==", "!=" or "~="
    op: str = ""
    value: str = ""

    def matches(self, fields: Fields) -> bool:
        got = fields(self.path)
        if self.op == "":
            return got is not None
        if self.op == "==":
            return got == self.value
        if self.op == "!=":
            return got != self.value
        return got is not None and re.search(self.value, got) is not None


def _unquote(text: str) -> str:
    return re.sub(r"\\(.)", r"\1", text[1:-1])


class _Scanner:
    def __init__(self, text: str) -> None:
        self.text = text
        self.pos = 0

    def fail(self, why: str) -> InvalidArgument:
        return InvalidArgument(f"filter {self.text!r}: {why}")

    def _skip_space(self) -> None:
        while self.pos < len(self.text) and self.text[self.pos].isspace():
            self.pos += 1

    def take(self, pattern: re.Pattern[str]) -> str | None:
        self._skip_space()
        m = pattern.match(self.text, self.pos)
        if m is None:
            return None
        self.pos = m.end()
        return m.group()

    def literal(self, char: str) -> bool:
        self._skip_space()
        if self.text.startswith(char, self.pos):
            self.pos += 1
            return True
        return False

    @property
    def done(self) -> bool:
        return not self.text[self.pos:].strip()

    def field(self) -> str:
        quoted = self.take(_QUOTED)
        if quoted is not None:
            return _unquote(quoted)
        name = self.take(_FIELD)
        if name is None:
            rest = self.text[self.pos:].strip()
            raise self.fail(f"a field name was expected at {rest[:20]!r}" if rest
                            else "a field name is missing")
        return name

    def value(self, op: str) -> str:
        quoted = self.take(_QUOTED)
        if quoted is not None:
            return _unquote(quoted)
        bare = self.take(_BARE_VALUE)
        if bare is None:
            raise self.fail(f"{op} needs a value")
        return bare


def parse(text: str) -> list[Selector]:
    """One expression: its selectors, all of which must match."""
    sc = _Scanner(text)
    selectors = []
    while True:
        path = [sc.field()]
        while sc.literal("."):
            path.append(sc.field())
        op = sc.take(_OP) or ""
        value = sc.value(op) if op else ""
        if op == "~=":
            try:
                re.compile(value)
            except re.error as e:
                raise sc.fail(f"{value!r} is not a regular expression: {e}") from None
        selectors.append(Selector(tuple(path), op, value))
        if sc.done:
            return selectors
        if not sc.literal(","):
            raise sc.fail(f"',' or the end expected at {sc.text[sc.pos:].strip()[:20]!r}")


def matcher(expressions: Sequence[str]) -> Callable[[Fields], bool]:
    """A predicate over an object's fields: true when any expression matches (all of
    its selectors do); no expressions match everything. Bad syntax: InvalidArgument."""
    parsed = [parse(e) for e in expressions]
    if not parsed:
        return lambda fields: True
    return lambda fields: any(all(s.matches(fields) for s in sel) for sel in parsed)


def container_fields(*, id: str, image: str, runtime: str, snapshotter: str,
                     labels: Mapping[str, str]) -> Fields:
    """The field paths containerd's filters reach on a container record."""
    def get(path: Sequence[str]) -> str | None:
        if not path:
            return None
        head, rest = path[0], path[1:]
        if head == "labels" and rest:
            return labels.get(".".join(rest))
        if head == "runtime" and list(rest) == ["name"]:
            return runtime
        if rest:
            return None
        plain = {"id": id, "image": image, "snapshotter": snapshotter}.get(head)
        return plain if plain else None

    return get


__all__ = ["Fields", "Selector", "container_fields", "matcher", "parse"]
