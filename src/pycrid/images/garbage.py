"""Garbage collection: content and snapshots no image refers to, swept apart from pulls.

The garbage collector and pulls never overlap: a collection asked for while
pulls are in flight (a remove, or a pull that failed) runs when the last of
them ends, and a pull waits for a running collection to finish. So a blob or
snapshot that a pull has just found present is never swept from under it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Collection

from pycrid.images.content import ContentStore
from pycrid.images.snapshots import Kind, Snapshotter
from pycrid.store.image_records import ImageStore
from pycrid.tasks import Owner


class GarbageCollector:
    """Sweeps what no image holds, and keeps pulls and sweeps from overlapping."""

    def __init__(self, *, store: ImageStore, content: ContentStore, snapshotter: Snapshotter,
                 owner: Owner, prune: Callable[[Collection[str]], object] | None = None) -> None:
        self.store = store
        self.content = content
        self.snapshotter = snapshotter
        #: Owns the collection that runs when the last pull ends (it outlives that pull).
        self._owner = owner
        #: Told the committed snapshots that remain after a sweep (the file index keeps
        #: only theirs).
        self._prune = prune
        self._pulls = 0
        self._gc_pending = False
        self._no_gc_running = asyncio.Event()
        self._no_gc_running.set()
        self._gc_lock = asyncio.Lock()

    @contextlib.asynccontextmanager
    async def pulling(self) -> AsyncIterator[None]:
        """Around the part of a pull that finds or writes blobs and snapshots: waits for a
        running collection, and runs the collections asked for meanwhile when the last
        pull ends."""
        await self._no_gc_running.wait()
        self._pulls += 1  # no await since the wait: a collection cannot start in between
        try:
            yield
        except BaseException:
            # Verified blobs and snapshots of a failed pull are garbage unless an image
            # refers to them.
            self._gc_pending = True
            raise
        finally:
            self._pulls -= 1
            if self._pulls == 0 and self._gc_pending and not self._owner.closed:
                # Shielded: a cancelled pull does not cancel the collection it started.
                await asyncio.shield(self._owner.spawn(self._collect(), "collect after pulls"))

    async def _collect(self) -> None:
        with contextlib.suppress(Exception):
            await self.gc()

    async def gc(self) -> tuple[int, int]:
        """Delete content and snapshots no image refers to; deferred while pulls run.

        Returns (blobs removed, snapshots removed); (0, 0) when deferred.
        """
        async with self._gc_lock:
            if self._pulls:
                self._gc_pending = True
                return 0, 0
            self._gc_pending = False
            keep_content: set[str] = set()
            keep_snaps: set[str] = set()
            for img in self.store.list():
                keep_content |= img.content()
                keep_snaps |= set(img.chain)
            self._no_gc_running.clear()
            try:
                return await asyncio.to_thread(self._sweep, keep_content, keep_snaps)
            finally:
                self._no_gc_running.set()

    def _sweep(self, keep_content: set[str], keep_snaps: set[str]) -> tuple[int, int]:
        blobs = 0
        for digest in self.content.digests() - keep_content:
            self.content.delete(digest)
            blobs += 1
        snaps = 0
        # Children before parents: repeat while something was removed.
        while True:
            infos = [i for i in self.snapshotter.walk() if i.kind is Kind.COMMITTED]
            parents = {i.parent for i in self.snapshotter.walk() if i.parent}
            doomed = [i.key for i in infos if i.key not in keep_snaps and i.key not in parents]
            if not doomed:
                if self._prune is not None:
                    self._prune({i.key for i in infos})
                return blobs, snaps
            for key in doomed:
                self.snapshotter.remove(key)
                snaps += 1
