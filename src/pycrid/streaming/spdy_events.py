"""What a SPDY/3.1 connection reports to its caller: one event per frame that matters.

A vocabulary of its own so the asyncio shell and the tests can match on events without
the connection's state machine.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class StreamOpened:
    stream_id: int
    headers: dict[str, str]
    fin: bool
    associated_id: int


@dataclass(frozen=True)
class StreamReplied:
    stream_id: int
    headers: dict[str, str]
    fin: bool


@dataclass(frozen=True)
class HeadersReceived:
    stream_id: int
    headers: dict[str, str]
    fin: bool


@dataclass(frozen=True)
class DataReceived:
    stream_id: int
    data: bytes
    fin: bool


@dataclass(frozen=True)
class StreamReset:
    stream_id: int
    status: int


@dataclass(frozen=True)
class PingReceived:
    ping_id: int


@dataclass(frozen=True)
class PingAcknowledged:
    ping_id: int


@dataclass(frozen=True)
class SettingsReceived:
    settings: dict[int, int]


@dataclass(frozen=True)
class WindowUpdated:
    stream_id: int
    delta: int


@dataclass(frozen=True)
class GoAwayReceived:
    last_stream_id: int
    status: int


Event = (
    StreamOpened
    | StreamReplied
    | HeadersReceived
    | DataReceived
    | StreamReset
    | PingReceived
    | PingAcknowledged
    | SettingsReceived
    | WindowUpdated
    | GoAwayReceived
)
