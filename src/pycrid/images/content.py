"""The content store: blobs by digest on disk, written only after their digest checks out.

Layout (containerd's): ``<root>/blobs/sha256/<hex>`` for committed blobs and
``<root>/ingest/`` for downloads in progress. A blob becomes visible by an
atomic rename after its size and sha256 are verified, so a reader never sees
partial or wrong content. Concurrent requests for one digest share a single
download (the second waits for the first), which is how two pulls of images
sharing a layer fetch that layer once.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
import secrets
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

from pycrid.errors import DataLoss, DeadlineExceeded, NotFound
from pycrid.images.oci import validate_digest

log = logging.getLogger(__name__)

#: Opens a stream of a blob's bytes (the registry client's ``fetch_blob``).
BlobOpener = Callable[[], contextlib.AbstractAsyncContextManager[AsyncIterator[bytes]]]


@dataclass(frozen=True)
class IngestStats:
    digest: str
    size: int
    #: False when the blob was already present or another task fetched it for us.
    downloaded: bool


class ContentStore:
    def __init__(self, root: str) -> None:
        self.root = root
        self._blobs = os.path.join(root, "blobs", "sha256")
        self._ingest = os.path.join(root, "ingest")
        os.makedirs(self._blobs, mode=0o700, exist_ok=True)
        os.makedirs(self._ingest, mode=0o700, exist_ok=True)
        self._inflight: dict[str, asyncio.Event] = {}

    def path(self, digest: str) -> str:
        return os.path.join(self._blobs, validate_digest(digest).split(":", 1)[1])

    def exists(self, digest: str) -> bool:
        return os.path.exists(self.path(digest))

    def size(self, digest: str) -> int:
        try:
            return os.stat(self.path(digest)).st_size
        except FileNotFoundError:
            raise NotFound(f"content {digest} not found") from None

    def read(self, digest: str) -> bytes:
        try:
            with open(self.path(digest), "rb") as f:
                return f.read()
        except FileNotFoundError:
            raise NotFound(f"content {digest} not found") from None

    def write(self, digest: str, data: bytes) -> None:
        """Store small, already-in-memory content (manifests, configs) after verifying it."""
        got = "sha256:" + hashlib.sha256(data).hexdigest()
        if got != digest:
            raise DataLoss(f"content {digest}: digest mismatch (got {got})")
        if self.exists(digest):
            return
        tmp = self._tmp_path(digest)
        try:
            with open(tmp, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.rename(tmp, self.path(digest))
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)

    def delete(self, digest: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path(digest))

    def digests(self) -> set[str]:
        return {"sha256:" + name for name in os.listdir(self._blobs) if len(name) == 64}

    def usage(self) -> tuple[int, int]:
        """(bytes, inodes) used by committed blobs."""
        total = count = 0
        with os.scandir(self._blobs) as it:
            for entry in it:
                total += entry.stat(follow_symlinks=False).st_blocks * 512
                count += 1
        return total, count

    def cleanup(self) -> list[str]:
        """Drop leftovers of downloads a crash interrupted (start-up only)."""
        removed = []
        for name in os.listdir(self._ingest):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(self._ingest, name))
            removed.append(name)
        return removed

    def _tmp_path(self, digest: str) -> str:
        return os.path.join(self._ingest, f"{digest.split(':', 1)[1]}.{secrets.token_hex(4)}")

    async def ingest(
        self, digest: str, size: int, open_blob: BlobOpener, *, progress_timeout: float = 0
    ) -> IngestStats:
        """Make sure blob ``digest`` of ``size`` bytes is present, downloading it if needed.

        ``progress_timeout`` (seconds, 0 = none) cancels a download that receives no
        bytes for that long. A failed download leaves nothing in the store.
        """
        validate_digest(digest)
        while True:
            if self.exists(digest):
                return IngestStats(digest, size, downloaded=False)
            busy = self._inflight.get(digest)
            if busy is None:
                break
            # Someone else is fetching it: wait, then look again. If their download
            # failed we try with our own stream.
            await busy.wait()
        done = asyncio.Event()
        self._inflight[digest] = done
        try:
            await self._download(digest, size, open_blob, progress_timeout)
            return IngestStats(digest, size, downloaded=True)
        finally:
            del self._inflight[digest]
            done.set()

    async def _download(
        self, digest: str, size: int, open_blob: BlobOpener, progress_timeout: float
    ) -> None:
        tmp = self._tmp_path(digest)
        h = hashlib.sha256()
        written = 0
        try:
            # Chunks are written and hashed on the loop (page-cache writes of network-sized
            # chunks are short); the fsync that can stall goes to a thread.
            f = await asyncio.to_thread(open, tmp, "wb")
            with f:
                async with open_blob() as chunks:
                    it = aiter(chunks)
                    while True:
                        try:
                            if progress_timeout > 0:
                                chunk = await asyncio.wait_for(anext(it), progress_timeout)
                            else:
                                chunk = await anext(it)
                        except StopAsyncIteration:
                            break
                        except TimeoutError:
                            raise DeadlineExceeded(
                                f"blob {digest}: no data received for {progress_timeout:g}s"
                            ) from None
                        written += len(chunk)
                        if written > size:
                            raise DataLoss(
                                f"blob {digest}: registry sent more than the {size} bytes "
                                "the manifest declares")
                        h.update(chunk)
                        f.write(chunk)
                if written != size:
                    raise DataLoss(f"blob {digest}: got {written} of {size} bytes")
                got = "sha256:" + h.hexdigest()
                if got != digest:
                    raise DataLoss(f"blob {digest}: digest mismatch (content hashes to {got})")
                f.flush()
                await asyncio.to_thread(os.fsync, f.fileno())
            os.rename(tmp, self.path(digest))
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
