"""Logging to stderr: text, one JSON object per line, or journald's stream format."""

from __future__ import annotations

import datetime
import json
import logging
import os
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


def _priority(levelno: int) -> int:
    """sd-daemon(3) syslog priority: 3 error (and worse), 4 warning, 6 info, 7 debug."""
    if levelno >= logging.ERROR:
        return 3
    if levelno >= logging.WARNING:
        return 4
    if levelno >= logging.INFO:
        return 6
    return 7


class JournaldFormatter(logging.Formatter):
    """``<N>logger: message [k=v ...]``: journald stamps the time and reads the priority
    prefix; a traceback goes on continuation lines with the same prefix so it keeps it."""

    def format(self, record: logging.LogRecord) -> str:
        prefix = f"<{_priority(record.levelno)}>"
        fields = " ".join(f"{k}={v}" for k, v in _extras(record).items())
        line = f"{prefix}{record.name}: {record.getMessage()}"
        if fields:
            line += f" [{fields}]"
        if record.exc_info:
            line += "".join(f"\n{prefix}{t}"
                            for t in self.formatException(record.exc_info).splitlines())
        return line


def stderr_is_journal(env: dict[str, str] | None = None, fd: int = 2) -> bool:
    """systemd's documented check: JOURNAL_STREAM is ``<st_dev>:<st_ino>`` of the stream
    it connected, and only counts if ``fd`` is still that stream (not redirected)."""
    value = (os.environ if env is None else env).get("JOURNAL_STREAM", "")
    dev, sep, ino = value.partition(":")
    if not sep or not dev.isdigit() or not ino.isdigit():
        return False
    try:
        st = os.fstat(fd)
    except OSError:
        return False
    return (st.st_dev, st.st_ino) == (int(dev), int(ino))


def choose_format(fmt: str, env: dict[str, str] | None = None, fd: int = 2) -> str:
    """``text`` (the default) becomes ``journald`` when stderr is the journal; an explicit
    ``json`` is kept (a log shipper may want it there too)."""
    if fmt == "text" and stderr_is_journal(env, fd):
        return "journald"
    return fmt


def setup(level: str, fmt: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    fmt = choose_format(fmt)
    formatter: logging.Formatter = (JSONFormatter() if fmt == "json" else JournaldFormatter()
                                    if fmt == "journald" else TextFormatter())
    handler.setFormatter(formatter)
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # aiohttp and grpc are chatty at debug about their own internals.
    for name in ("aiohttp.access", "asyncio"):
        logging.getLogger(name).setLevel(max(logging.INFO, root.level))
