"""The content store: verified writes, shared in-flight downloads, nothing left on failure."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from pycrid.errors import DataLoss, DeadlineExceeded
from pycrid.images.content import ContentStore

DATA = os.urandom(300_000)
DIGEST = "sha256:" + hashlib.sha256(DATA).hexdigest()


class Source:
    """A blob stream with a switch for each way a registry can fail us."""

    def __init__(self, data: bytes = DATA, *, stop_at: int | None = None,
                 stall: float = 0) -> None:
        self.data, self.stop_at, self.stall = data, stop_at, stall
        self.opened = 0

    @contextlib.asynccontextmanager
    async def open(self) -> AsyncIterator[AsyncIterator[bytes]]:
        self.opened += 1

        async def chunks() -> AsyncIterator[bytes]:
            end = len(self.data) if self.stop_at is None else self.stop_at
            for i in range(0, end, 65536):
                await asyncio.sleep(0)
                yield self.data[i:min(i + 65536, end)]
            if self.stall:
                await asyncio.sleep(self.stall)

        yield chunks()


def leftovers(store: ContentStore) -> list[str]:
    return os.listdir(os.path.join(store.root, "ingest"))


async def test_ingest_verifies_and_stores(tmp_path: Path) -> None:
    store = ContentStore(str(tmp_path))
    src = Source()
    stats = await store.ingest(DIGEST, len(DATA), src.open)
    assert stats.downloaded
    assert store.read(DIGEST) == DATA
    assert store.digests() == {DIGEST}
    again = await store.ingest(DIGEST, len(DATA), src.open)
    assert not again.downloaded
    assert src.opened == 1


async def test_concurrent_ingests_share_one_download(tmp_path: Path) -> None:
    store = ContentStore(str(tmp_path))
    src = Source()
    results = await asyncio.gather(*(store.ingest(DIGEST, len(DATA), src.open) for _ in range(5)))
    assert src.opened == 1
    assert sum(r.downloaded for r in results) == 1
    assert store.read(DIGEST) == DATA


@pytest.mark.parametrize(
    ("source", "size", "message"),
    [
        (Source(stop_at=1000), len(DATA), "got 1000 of"),
        (Source(DATA[:-1] + b"x"), len(DATA), "digest mismatch"),
        (Source(DATA + b"extra"), len(DATA), "more than"),
    ],
)
async def test_bad_streams_leave_nothing(tmp_path: Path, source: Source, size: int,
                                         message: str) -> None:
    store = ContentStore(str(tmp_path))
    with pytest.raises(DataLoss, match=message):
        await store.ingest(DIGEST, size, source.open)
    assert store.digests() == set()
    assert leftovers(store) == []


async def test_stalled_stream_times_out(tmp_path: Path) -> None:
    store = ContentStore(str(tmp_path))
    with pytest.raises(DeadlineExceeded, match="no data received"):
        await store.ingest(DIGEST, len(DATA), Source(stop_at=70000, stall=5).open,
                           progress_timeout=0.2)
    assert store.digests() == set()
    assert leftovers(store) == []


async def test_waiter_retries_after_first_download_fails(tmp_path: Path) -> None:
    store = ContentStore(str(tmp_path))
    bad, good = Source(stop_at=10), Source()
    first = asyncio.create_task(store.ingest(DIGEST, len(DATA), bad.open))
    await asyncio.sleep(0)
    second = asyncio.create_task(store.ingest(DIGEST, len(DATA), good.open))
    with pytest.raises(DataLoss):
        await first
    assert (await second).downloaded
    assert store.read(DIGEST) == DATA


def test_write_rejects_wrong_digest(tmp_path: Path) -> None:
    store = ContentStore(str(tmp_path))
    with pytest.raises(DataLoss):
        store.write(DIGEST, b"not it")
    store.write(DIGEST, DATA)
    assert store.size(DIGEST) == len(DATA)


def test_cleanup_removes_partial_ingests(tmp_path: Path) -> None:
    store = ContentStore(str(tmp_path))
    Path(store.root, "ingest", "abc.1234").write_bytes(b"partial")
    assert store.cleanup() == ["abc.1234"]
    assert leftovers(store) == []
