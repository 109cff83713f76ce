"""Decode TOML tables into typed config dataclasses, naming the key in every error.

A config dataclass declares its keys as fields with defaults; ``field_help``
and ``field_check`` metadata give the comment printed by ``pycrid config
default`` and an extra validation. Decoding is strict about types and lenient
about unknown keys: those are returned so start-up can warn about each by name.
"""

from __future__ import annotations

import dataclasses
import re
import types
import typing
from collections.abc import Callable
from typing import Any, TypeVar

from pycrid.errors import InvalidArgument

T = TypeVar("T")


class ConfigError(InvalidArgument):
    """An invalid config value; the message names the key and the reason."""

    def __init__(self, key: str, reason: str) -> None:
        super().__init__(f"config key {key}: {reason}")
        self.key = key
        self.reason = reason


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


def decode(cls: type[T], data: Any, prefix: str) -> tuple[T, list[str]]:
    """Build ``cls`` from a TOML table; returns the object and the unknown keys (full names)."""
    if not isinstance(data, dict):
        raise ConfigError(prefix, f"must be a table, got {_tname(data)}")
    unknown: list[str] = []
    hints = typing.get_type_hints(cls)
    kwargs: dict[str, Any] = {}
    names = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    for key in data:
        if key not in names:
            unknown.append(key_join(prefix, key))
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        if f.name not in data:
            continue
        key = key_join(prefix, f.name)
        value, sub_unknown = _convert(hints[f.name], data[f.name], key)
        unknown.extend(sub_unknown)
        check = f.metadata.get("check")
        if check is not None:
            reason = check(value)
            if reason:
                raise ConfigError(key, f"{reason} (got {data[f.name]!r})")
        kwargs[f.name] = value
    return cls(**kwargs), unknown


def _tname(v: Any) -> str:
    return {str: "a string", int: "an integer", bool: "a boolean", float: "a number",
            list: "an array", dict: "a table"}.get(type(v), type(v).__name__)


def _convert(tp: Any, value: Any, key: str) -> tuple[Any, list[str]]:
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
        items, unknown = [], []
        for i, item in enumerate(value):
            v, u = _convert(item_tp, item, f"{key}[{i}]")
            items.append(v)
            unknown.extend(u)
        return items, unknown
    if origin is dict:
        _, val_tp = typing.get_args(tp)
        if not isinstance(value, dict):
            raise ConfigError(key, f"must be a table, got {_tname(value)}")
        out, unknown = {}, []
        for k, item in value.items():
            v, u = _convert(val_tp, item, key_join(key, k))
            out[k] = v
            unknown.extend(u)
        return out, unknown
    if origin in (typing.Union, types.UnionType):
        raise TypeError(f"config field {key}: union types are not supported")
    if tp is Any:
        return value, []
    raise TypeError(f"config field {key}: unsupported type {tp!r}")
