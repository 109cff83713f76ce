"""Single-use tokens that stand for pending stream requests (sans-IO).

The Exec, Attach and PortForward RPCs return only a URL; the request itself
waits here under a random token until the client (the kubelet, or crictl)
connects to that URL. Like the kubelet/containerd request cache a token is
8 URL-safe base64 characters, lives for a minute, works once, and at most
1000 may be outstanding, so unused URLs cannot pile up.

Not thread-safe: it is meant to be used from the daemon's event loop.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable
from typing import Final, Generic, TypeVar

T = TypeVar("T")

#: Characters in a token: 6 random bytes in unpadded URL-safe base64.
TOKEN_LENGTH: Final = 8
_TOKEN_BYTES: Final = TOKEN_LENGTH * 6 // 8
_MAX_TRIES: Final = 10


class TooManyRequests(Exception):
    """Too many stream URLs handed out and not yet used or expired."""

    def __init__(self) -> None:
        super().__init__("maximum number of in-flight stream requests exceeded")


class TokenCache(Generic[T]):
    """Pending requests by token; each token expires after ``ttl`` seconds.

    A token is valid until ``ttl`` has fully passed (at exactly ``ttl`` it
    still works, as in the kubelet). Entries are kept in insertion order,
    which with a fixed ttl and a monotonic clock is also expiry order, so
    expired entries are dropped from the front without a scan.
    """

    __slots__ = ("_clock", "_entries", "_max_outstanding", "_ttl")

    def __init__(
        self,
        ttl: float = 60.0,
        max_outstanding: int = 1000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if ttl <= 0:
            raise ValueError(f"ttl must be positive, got {ttl}")
        if max_outstanding < 1:
            raise ValueError(f"max_outstanding must be at least 1, got {max_outstanding}")
        self._ttl = ttl
        self._max_outstanding = max_outstanding
        self._clock = clock
        self._entries: dict[str, tuple[T, float]] = {}

    def insert(self, request: T) -> str:
        """Store ``request`` and return the token that will fetch it once.

        Raises TooManyRequests when ``max_outstanding`` unexpired tokens exist.
        """
        now = self._clock()
        self._evict_expired(now)
        if len(self._entries) >= self._max_outstanding:
            raise TooManyRequests()
        token = self._unique_token()
        self._entries[token] = (request, now + self._ttl)
        return token

    def consume(self, token: str) -> T | None:
        """The request behind ``token``, or None if unknown, used or expired."""
        entry = self._entries.pop(token, None)
        if entry is None:
            return None
        request, expires = entry
        if self._clock() > expires:
            return None
        return request

    def __len__(self) -> int:
        """Unexpired, unused tokens."""
        self._evict_expired(self._clock())
        return len(self._entries)

    def _evict_expired(self, now: float) -> None:
        while self._entries:
            token, (_, expires) = next(iter(self._entries.items()))
            if now <= expires:
                return
            del self._entries[token]

    def _unique_token(self) -> str:
        # 48 random bits make a clash unlikely but not impossible.
        for _ in range(_MAX_TRIES):
            token = secrets.token_urlsafe(_TOKEN_BYTES)
            if token not in self._entries:
                return token
        raise RuntimeError("failed to generate a unique stream token")
