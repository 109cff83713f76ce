"""Decode TOML tables into typed config dataclasses, naming the key in every error.

A config dataclass declares its keys as fields with defaults; ``field_help``
and ``field_check`` metadata give the comment printed by ``pycrid config
default`` and an extra validation. Decoding is strict about types, and returns
the keys it does not know, so that start-up refuses each by name (loader.py) after
every other mistake in the file has been found too.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import re
import types
import typing
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar

from pycrid.errors import InvalidArgument

T = TypeVar("T")


class ConfigError(InvalidArgument):
    """Invalid config values: the message names every key with its reason, so one start
    shows every mistake in the file. ``key``/``reason`` are the first one's."""

    def __init__(self, key: str, reason: str) -> None:
        super().__init__(f"config key {key}: {reason}")
        self.key = key
        self.reason = reason
        self.problems: list[tuple[str, str]] = [(key, reason)]
        #: Unknown keys of the tables that failed (decoding stops short of returning them).
        self.unknown: list[UnknownKey] = []

    @classmethod
    def combine(cls, errors: Sequence[ConfigError], notes: Sequence[str] = ()) -> ConfigError:
        """One error carrying every problem of ``errors``, in order; ``notes`` (warnings
        about the same file) are added to the message."""
        problems = [p for e in errors for p in e.problems]
        combined = cls(*problems[0])
        combined.problems = problems
        if len(problems) > 1:
            text = f"{len(problems)} errors:" + "".join(
                f"\n  config key {k}: {r}" for k, r in problems)
        else:
            text = str(combined)
        text += "".join(f"\n  also: {n}" for n in notes)
        combined.args = (text,)
        return combined


@dataclasses.dataclass(frozen=True)
class UnknownKey:
    """A key no field matches; its error names the closest known key."""

    key: str
    suggestion: str = ""

    def error(self, release: str) -> ConfigError:
        hint = f"; did you mean `{self.suggestion}`?" if self.suggestion else ""
        return ConfigError(self.key, f"not a key of pycrid {release}{hint}")


def closest(name: str, known: Iterable[str]) -> str:
    """The known name a typo most likely meant, or ""."""
    found = difflib.get_close_matches(name, list(known), n=1, cutoff=0.6)
    return found[0] if found else ""


class Duration(float):
    """Seconds, written in TOML the Go way ("5s", "1m30s", "250ms") or as a number of seconds."""

    _UNITS: typing.ClassVar[dict[str, float]] = {
        "ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0,
    }
    _PART = re.compile(r"(\d+(?:\.\d+)?)(ns|us|µs|ms|s|m|h)")

    @classmethod
    def parse(cls, text: str) -> Duration:
        s = text.strip()
        if s in ("0", ""):
            return cls(0.0)
        pos, total = 0, 0.0
        for m in cls._PART.finditer(s):
            if m.start() != pos:
                break
            total += float(m.group(1)) * cls._UNITS[m.group(2)]
            pos = m.end()
        if pos != len(s) or pos == 0:
            raise ValueError(f"{text!r} is not a duration (examples: \"5s\", \"1m30s\", \"250ms\")")
        return cls(total)

    def __str__(self) -> str:
        secs = float(self)
        if secs == 0:
            return "0s"
        if secs < 1:
            return f"{round(secs * 1000)}ms"
        out, rest = "", secs
        for unit, size in (("h", 3600.0), ("m", 60.0)):
            if rest >= size:
                n = int(rest // size)
                out += f"{n}{unit}"
                rest -= n * size
        if rest or not out:
            out += f"{rest:g}s"
        return out


def field_help(f: dataclasses.Field[Any]) -> str:
    return str(f.metadata.get("help", ""))


def cfg(default: Any, help: str, check: Callable[[Any], str | None] | None = None) -> Any:
    """A config field: default, the comment shown by ``config default``, an optional check.

    ``check`` returns a reason string when the value is invalid.
    """
    meta = {"help": help, "check": check}
    if isinstance(default, list | dict):
        container: list[Any] | dict[Any, Any] = default
        return dataclasses.field(default_factory=lambda: container.copy(), metadata=meta)
    if dataclasses.is_dataclass(default):
        factory = type(default)
        return dataclasses.field(default_factory=factory, metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def abs_or_empty(v: Any) -> str | None:
    return None if v == "" or os.path.isabs(v) else "must be an absolute path or empty"


def one_of(*choices: str) -> Callable[[Any], str | None]:
    def check(v: Any) -> str | None:
        return None if v in choices else f"must be one of {', '.join(map(repr, choices))}"

    return check


def at_least(n: float) -> Callable[[Any], str | None]:
    def check(v: Any) -> str | None:
        return None if v >= n else f"must be at least {n:g}"

    return check


def key_join(prefix: str, name: str) -> str:
    if re.fullmatch(r"[A-Za-z0-9_-]+", name):
        return f"{prefix}.{name}" if prefix else name
    return f'{prefix}."{name}"' if prefix else f'"{name}"'


def decode(cls: type[T], data: Any, prefix: str) -> tuple[T, list[UnknownKey]]:
    """Build ``cls`` from a TOML table; returns the object and the unknown keys. Every
    invalid value in the table is reported, in one ConfigError."""
    if not isinstance(data, dict):
        raise ConfigError(prefix, f"must be a table, got {_tname(data)}")
    unknown: list[UnknownKey] = []
    errors: list[ConfigError] = []
    hints = typing.get_type_hints(cls)
    kwargs: dict[str, Any] = {}
    names = [f.name for f in dataclasses.fields(cls)]  # type: ignore[arg-type]
    for key in data:
        if key not in names:
            unknown.append(UnknownKey(key_join(prefix, key), closest(key, names)))
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        if f.name not in data:
            continue
        key = key_join(prefix, f.name)
        try:
            value, sub_unknown = _convert(hints[f.name], data[f.name], key)
        except ConfigError as e:
            errors.append(e)
            unknown.extend(e.unknown)
            continue
        unknown.extend(sub_unknown)
        check = f.metadata.get("check")
        if check is not None:
            reason = check(value)
            if reason:
                errors.append(ConfigError(key, f"{reason} (got {data[f.name]!r})"))
                continue
        kwargs[f.name] = value
    if errors:
        raise _failed(errors, unknown)
    return cls(**kwargs), unknown


def _convert_items(tp: Any, items: list[tuple[str, Any]]) -> tuple[list[Any], list[UnknownKey]]:
    """Each item converted; every bad one reported."""
    out: list[Any] = []
    unknown: list[UnknownKey] = []
    errors: list[ConfigError] = []
    for key, item in items:
        try:
            v, u = _convert(tp, item, key)
        except ConfigError as e:
            errors.append(e)
            unknown.extend(e.unknown)
            continue
        out.append(v)
        unknown.extend(u)
    if errors:
        raise _failed(errors, unknown)
    return out, unknown


def _failed(errors: list[ConfigError], unknown: list[UnknownKey]) -> ConfigError:
    err = ConfigError.combine(errors)
    err.unknown = unknown
    return err


def _tname(v: Any) -> str:
    return {str: "a string", int: "an integer", bool: "a boolean", float: "a number",
            list: "an array", dict: "a table"}.get(type(v), type(v).__name__)


def _convert(tp: Any, value: Any, key: str) -> tuple[Any, list[UnknownKey]]:
    origin = typing.get_origin(tp)
    if dataclasses.is_dataclass(tp):
        return decode(tp, value, key)  # type: ignore[arg-type]
    if tp is Duration:
        if isinstance(value, bool):
            raise ConfigError(key, "must be a duration such as \"5s\", got a boolean")
        if isinstance(value, int | float):
            if value < 0:
                raise ConfigError(key, "must not be negative")
            return Duration(value), []
        if isinstance(value, str):
            try:
                return Duration.parse(value), []
            except ValueError as e:
                raise ConfigError(key, str(e)) from None
        raise ConfigError(key, f"must be a duration such as \"5s\", got {_tname(value)}")
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(key, f"must be true or false, got {_tname(value)}")
        return value, []
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(key, f"must be an integer, got {_tname(value)}")
        return value, []
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(key, f"must be a number, got {_tname(value)}")
        return float(value), []
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(key, f"must be a string, got {_tname(value)}")
        return value, []
    if origin is list:
        (item_tp,) = typing.get_args(tp)
        if not isinstance(value, list):
            raise ConfigError(key, f"must be an array, got {_tname(value)}")
        return _convert_items(item_tp, [(f"{key}[{i}]", v) for i, v in enumerate(value)])
    if origin is dict:
        _, val_tp = typing.get_args(tp)
        if not isinstance(value, dict):
            raise ConfigError(key, f"must be a table, got {_tname(value)}")
        converted, unknown = _convert_items(
            val_tp, [(key_join(key, k), v) for k, v in value.items()])
        return dict(zip(value, converted, strict=True)), unknown
    if origin in (typing.Union, types.UnionType):
        raise TypeError(f"config field {key}: union types are not supported")
    if tp is Any:
        return value, []
    raise TypeError(f"config field {key}: unsupported type {tp!r}")
