"""Fetching byte ranges of a blob through the registry client (same hosts, mirrors, auth
and TLS as any pull), on the event loop.

``fetch_span`` reads one range into memory (the TOC and tar-split). ``feed`` hands the
bytes of many ranges, in order, to a worker thread: several ranges per request where the
registry answers ``multipart/byteranges``, one per request where it answers only one
(object stores behind a redirect often do), whatever it left out asked for again. A
registry that ignores ranges altogether (``200``) is ``NoRanges``: the layer is then
downloaded whole.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable

from pycrid.errors import DataLoss, DeadlineExceeded
from pycrid.images.auth import Credentials
from pycrid.images.distribution import RangeAnswer, RegistryClient
from pycrid.images.mediatypes import Descriptor
from pycrid.images.partial.ranges import (
    Multipart,
    Part,
    Range,
    Router,
    boundary_of,
    content_range,
    range_header,
    request_batches,
)
from pycrid.images.reference import Reference


class NoRanges(Exception):
    """The registry answered a range request with the whole blob."""


class Fetcher:
    """Range requests for one blob, counting what came over the wire."""

    def __init__(self, client: RegistryClient, ref: Reference, desc: Descriptor,
                 creds: Credentials | None, progress_timeout: float = 0) -> None:
        self._client, self._ref, self._desc, self._creds = client, ref, desc, creds
        self._timeout = progress_timeout
        #: Body bytes received (what the registry sent for this blob).
        self.received = 0
        self.requests = 0
        #: False once the registry answered several ranges with the whole blob.
        self.multi = True
        self._counted = 0

    def new_bytes(self) -> int:
        """Bytes received since the last call (counted as they come)."""
        n, self._counted = self.received - self._counted, self.received
        return n

    async def fetch_span(self, span: Range) -> bytes:
        """The bytes ``span`` of the blob, in memory."""
        out = bytearray()

        async def keep(b: bytes) -> bool:
            out.extend(b)
            return True

        await self._one([span], keep)
        if len(out) != span[1] - span[0]:
            raise DataLoss(f"the registry sent {len(out)} bytes of {span[1] - span[0]}")
        return bytes(out)

    async def feed(self, ranges: list[Range], put: Callable[[bytes], Awaitable[bool]]) -> None:
        """The bytes of ``ranges``, in order, to ``put`` (which returns False when its
        reader has stopped: then so does this)."""
        for batch in request_batches(ranges):
            pending = batch
            while pending:
                ask = pending if self.multi else pending[:1]
                try:
                    left = await self._one(ask, put)
                except NoRanges:
                    if len(ask) == 1:
                        raise
                    self.multi = False  # the registry answers one range at a time
                    continue
                if left is None:
                    return
                if left == ask:
                    raise DataLoss("the registry answered none of the ranges asked for")
                pending = left + pending[len(ask):]

    async def _one(self, ask: list[Range],
                   put: Callable[[bytes], Awaitable[bool]]) -> list[Range] | None:
        """One request; what it left out (None: ``put`` refused more)."""
        router = Router(ask)
        self.requests += 1
        async with self._client.blob_ranges(self._ref, self._desc, self._creds,
                                            range_header(ask)) as answer:
            if answer.status != 206:
                raise NoRanges(f"the registry answered {answer.status} to a range request")
            boundary = boundary_of(answer.content_type)
            mp = Multipart(boundary, self._desc.size) if boundary is not None else None
            if mp is None:
                router.part(Part(*content_range(answer.content_range, self._desc.size)))
            async for chunk in self._chunks(answer):
                for ev in mp.feed(chunk) if mp is not None else [chunk]:
                    if isinstance(ev, Part):
                        router.part(ev)
                        continue
                    for b in router.data(ev):
                        if not await put(b):
                            return None
            if mp is not None and not mp.done:
                raise DataLoss("the registry's multipart answer ended early")
        return router.remaining()

    async def _chunks(self, answer: RangeAnswer) -> AsyncIterator[bytes]:
        """The body, with the pull's progress timeout (0: none) between chunks."""
        loop = asyncio.get_running_loop()

        def due() -> float | None:
            return loop.time() + self._timeout if self._timeout > 0 else None

        try:
            async with asyncio.timeout(due()) as deadline:
                async for chunk in answer.chunks:
                    self.received += len(chunk)
                    deadline.reschedule(None)
                    yield chunk
                    deadline.reschedule(due())
        except TimeoutError:
            raise DeadlineExceeded(f"blob {self._desc.digest}: no data received for "
                                   f"{self._timeout:g}s") from None
        finally:
            with contextlib.suppress(Exception):
                await answer.chunks.aclose()  # type: ignore[attr-defined]
