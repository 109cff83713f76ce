"""Logging to stderr, as text or as one JSON object per line."""

from __future__ import annotations

import datetime
import json
import logging
import sys
from typing import Any

_STD_ATTRS = set(vars(logging.makeLogRecord({})).keys()) | {"message", "asctime"}


def _extras(record: logging.LogRecord) -> dict[str, Any]:
    return {k: v for k, v in vars(record).items() if k not in _STD_ATTRS and not k.startswith("_")}


def _ts(record: logging.LogRecord) -> str:
    return datetime.datetime.fromtimestamp(record.created, datetime.UTC).isoformat(
        timespec="microseconds").replace("+00:00", "Z")


class TextFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        msg = record.getMessage()
        fields = " ".join(f"{k}={v}" for k, v in _extras(record).items())
        line = f"{_ts(record)} {record.levelname:<7} {record.name}: {msg}"
        if fields:
            line += f" [{fields}]"
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


class JSONFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        obj: dict[str, Any] = {
            "time": _ts(record), "level": record.levelname.lower(), "logger": record.name,
            "msg": record.getMessage(),
        }
        obj.update(_extras(record))
        if record.exc_info:
            obj["error"] = self.formatException(record.exc_info)
        return json.dumps(obj, default=str)


def setup(level: str, fmt: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JSONFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # aiohttp and grpc are chatty at debug about their own internals.
    for name in ("aiohttp.access", "asyncio"):
        logging.getLogger(name).setLevel(max(logging.INFO, root.level))
