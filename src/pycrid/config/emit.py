"""Write config back as TOML: the defaults with their comments, or a migrated file.

The standard library reads TOML but does not write it; the shapes our config
uses (strings, numbers, booleans, durations, arrays, nested tables) are few, so
a small writer is simpler than another dependency.
"""

from __future__ import annotations

import dataclasses
import json
import math
from typing import Any

from pycrid.config.decode import Duration, field_help, key_join


def scalar(value: Any) -> str:
    """One TOML value on a line."""
    if isinstance(value, Duration):
        return json.dumps(str(value))
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isinf(value) or math.isnan(value):
            raise ValueError("cannot write inf/nan to TOML")
        return repr(value)
    if isinstance(value, str):
        # JSON string escapes are valid TOML basic-string escapes.
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, list):
        return "[" + ", ".join(scalar(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{key_join('', k)} = {scalar(v)}" for k, v in value.items()) + "}"
    raise TypeError(f"cannot write {type(value).__name__} to TOML")


def _is_table(value: Any) -> bool:
    return dataclasses.is_dataclass(value) or isinstance(value, dict)


def _items(obj: Any) -> list[tuple[str, Any, str]]:
    """(key, value, comment) for a dataclass instance or a dict."""
    if dataclasses.is_dataclass(obj):
        # Only declared keys (made with ``cfg``, so they carry a comment) are config keys;
        # ``Config.plugins`` holds the decoded sections and is written per plugin instead.
        return [(f.name, getattr(obj, f.name), field_help(f)) for f in dataclasses.fields(obj)
                if "help" in f.metadata]
    return [(k, v, "") for k, v in obj.items()]


def emit_table(obj: Any, prefix: str = "") -> str:
    """Render a table: its plain keys first, then each sub-table under its own header."""
    lines: list[str] = []
    subtables: list[tuple[str, Any, str]] = []
    for key, value, comment in _items(obj):
        if _is_table(value) and (
            dataclasses.is_dataclass(value) or _has_table(value) or prefix == "" or not value
        ):
            subtables.append((key, value, comment))
            continue
        if comment:
            lines.extend(f"# {c}" for c in comment.splitlines())
        lines.append(f"{key_join('', key)} = {scalar(value)}")
    for key, value, comment in subtables:
        full = key_join(prefix, key)
        lines.append("")
        if comment:
            lines.extend(f"# {c}" for c in comment.splitlines())
        lines.append(f"[{full}]")
        body = emit_table(value, full)
        if body:
            lines.append(body)
    return "\n".join(lines).strip("\n")


def _has_table(d: dict[str, Any]) -> bool:
    return any(_is_table(v) for v in d.values())
