"""Repeated protobuf fields whose entries are identified by a key (a mount's destination,
an rlimit's type, ...): copy, drop and replace entries by key, removal markers included."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from google.protobuf.internal.containers import RepeatedCompositeFieldContainer
from google.protobuf.message import Message

from pycrid.nri import api

_M = TypeVar("_M", bound=Message)


def clone(message: _M) -> _M:
    copy = type(message)()
    copy.CopyFrom(message)
    return copy


def drop_keys(
    entries: RepeatedCompositeFieldContainer[_M], key_of: Callable[[_M], str], keys: set[str]
) -> None:
    """Remove the entries (values or removal markers) whose key is in ``keys``."""
    if not keys:
        return
    kept = [clone(e) for e in entries if api.clear_removal_marker(key_of(e)) not in keys]
    del entries[:]
    entries.extend(kept)


def put_keyed(
    entries: RepeatedCompositeFieldContainer[_M], key_of: Callable[[_M], str], entry: _M
) -> None:
    """Add ``entry``, replacing any entry with the same key."""
    drop_keys(entries, key_of, {key_of(entry)})
    entries.append(entry)

