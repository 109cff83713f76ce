"""JSON read the way containers/image reads security configuration: nothing is ignored.

A duplicated key, a key nobody asked for, a value of the wrong type is an error that
names where it was (``transports.docker["example.com"][0].keyPath``), never a silently
dropped field: a typo in a policy must not weaken it.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Iterable
from typing import Any


class StrictJSONError(ValueError):
    """The document breaks a rule; the message says where."""


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise StrictJSONError(f"duplicate key {key!r}")
        out[key] = value
    return out


def _no_constants(name: str) -> Any:
    raise StrictJSONError(f"{name} is not JSON")


def loads(data: bytes | str) -> Any:
    """Parse ``data``; duplicate keys and NaN/Infinity are errors."""
    try:
        return json.loads(data, object_pairs_hook=_no_duplicates, parse_constant=_no_constants)
    except StrictJSONError:
        raise
    except (ValueError, UnicodeDecodeError) as e:
        raise StrictJSONError(f"not valid JSON: {e}") from None


def obj(value: Any, where: str, *, known: Iterable[str], required: Iterable[str] = ()
        ) -> dict[str, Any]:
    """``value`` as an object with only ``known`` keys and every ``required`` one."""
    if not isinstance(value, dict):
        raise StrictJSONError(f"{where}: a JSON object expected, got {_kind(value)}")
    allowed = set(known)
    for key in value:
        if key not in allowed:
            raise StrictJSONError(f"{where}: unknown key {key!r}")
    for key in required:
        if key not in value:
            raise StrictJSONError(f"{where}: key {key!r} missing")
    return value


def string(value: Any, where: str) -> str:
    if not isinstance(value, str):
        raise StrictJSONError(f"{where}: a string expected, got {_kind(value)}")
    return value


def strings(value: Any, where: str) -> tuple[str, ...]:
    if not isinstance(value, list):
        raise StrictJSONError(f"{where}: a list of strings expected, got {_kind(value)}")
    return tuple(string(v, f"{where}[{i}]") for i, v in enumerate(value))


def base64_bytes(value: Any, where: str) -> bytes:
    """A Go ``[]byte`` field: standard base64 (line breaks allowed, as encoding/json does)."""
    text = string(value, where).replace("\r", "").replace("\n", "")
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise StrictJSONError(f"{where}: not valid base64") from None


def base64_list(value: Any, where: str) -> tuple[bytes, ...]:
    if not isinstance(value, list):
        raise StrictJSONError(f"{where}: a list of base64 strings expected, got {_kind(value)}")
    return tuple(base64_bytes(v, f"{where}[{i}]") for i, v in enumerate(value))


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean"}.get(
        type(value), "a number")
