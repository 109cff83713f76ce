"""The partial pull of one layer: what the fetcher asks before it downloads a layer whole.

For a zstd:chunked layer (``enable_partial_images``, CRI-O's key) when this node has
files to reuse: one range request for the TOC and the tar-split, the plan (which files
are here), then, when it saves enough (``WORTH``), the missing files' ranges fetched
while the layer is rebuilt and unpacked into a scratch snapshot the fetcher made; the
diff id is checked like a download's. Any answer ``None`` (and a note in the log) sends
the layer down the ordinary path: no range support, no usable TOC, a file or diff id
that does not verify (the scratch snapshot is dropped first). Failures the ordinary path
would meet too (the registry gone, a full disk, a cancelled pull) are raised as they are.

Once a layer is committed, its files are recorded in the file index (``committed``):
where the partial pull put them, or, for a zstd:chunked layer pulled whole, the TOC's
account of them (checked when used).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Any, TypeVar

from pycrid.config.images_schema import ImagesConfig
from pycrid.errors import DataLoss, NotFound
from pycrid.images import mediatypes as oci
from pycrid.images import pull_report
from pycrid.images.auth import Credentials
from pycrid.images.content import ContentStore
from pycrid.images.distribution import RegistryClient
from pycrid.images.layer_paths import clean_name
from pycrid.images.partial import formats
from pycrid.images.partial.file_index import FileIndex
from pycrid.images.partial.formats import Rows
from pycrid.images.partial.layout import FileData, Layout, Unusable
from pycrid.images.partial.materialize import Job, Materialized, materialize
from pycrid.images.partial.plan import Plan, make_plan
from pycrid.images.partial.range_fetch import Fetcher, NoRanges
from pycrid.images.partial.reassemble import LocalMismatch, Ranges
from pycrid.images.reference import Reference
from pycrid.images.snapshots import Kind, Snapshotter
from pycrid.images.threads import ChunkPipe, run_settled, settle
from pycrid.images.unpack import Extracted
from pycrid.tasks import Owner, race

log = logging.getLogger(__name__)

T = TypeVar("T")

#: A layer is pulled partially only when what it must fetch is at most this share of
#: its blob; otherwise one stream of the whole blob is the cheaper way.
WORTH = 0.8
_KEEP = 64  # layers whose files wait to be indexed until they are committed


@dataclass(frozen=True)
class LayerJob:
    ref: Reference
    creds: Credentials | None
    layer: oci.Descriptor
    diff_id: str
    chain_id: str
    has_lower: bool


@dataclass(frozen=True)
class Scratch:
    """The fetcher's scratch snapshot for the layer: made on demand (its directory),
    dropped again when the partial pull gives up."""

    new: Callable[[], Awaitable[str]]
    drop: Callable[[], Awaitable[None]]


class PartialPuller:
    def __init__(self, *, client: RegistryClient, index: FileIndex, snapshotter: Snapshotter,
                 content: ContentStore, config: ImagesConfig, owner: Owner,
                 guard: Callable[[], AbstractAsyncContextManager[None]]) -> None:
        self.client, self.index, self.snapshotter = client, index, snapshotter
        self.content, self.config = content, config
        #: Indexing runs after the pull that committed the layer, off its path, under ``guard``
        #: (no collection meanwhile); a partial attempt waits for what is still indexed.
        self._indexing = owner.child("file index")
        self._guard = guard
        self._executor = ThreadPoolExecutor(max_workers=config.max_concurrent_downloads,
                                            thread_name_prefix="partial")
        #: Held by the worker rebuilding a layer, except while it waits for fetched bytes.
        #: Rebuilding is thousands of small steps in Python (open, read, write a file):
        #: two workers at once only pass the GIL back and forth at every system call, which
        #: took a third more CPU and longer than one after the other.
        self._turn = threading.Lock()
        #: What to index once a layer is committed, by chain id.
        self._pending: OrderedDict[str, Rows | formats.Format] = OrderedDict()
        #: Where fetched bytes are counted (the pull's report and the daemon's metrics; set
        #: by the image service).
        self.count_bytes: Callable[[int], None] | None = None

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)

    async def unpack(self, job: LayerJob, scratch: Scratch) -> tuple[str, Extracted] | None:
        """The layer unpacked into a new scratch snapshot (its directory), or None: take
        the ordinary path."""
        layer = job.layer
        try:
            fmt = formats.detect(layer)
        except Unusable as e:
            return self._declined(job, e)
        if fmt is None:
            return None
        self._remember(job.chain_id, fmt)
        await self.indexed()
        report = pull_report.current()
        if report.nothing_indexed is None:
            report.nothing_indexed = await self._thread(self.index.is_empty)
        if report.nothing_indexed:
            return None  # nothing here to reuse: the ordinary pull, indexed afterwards
        fetcher = Fetcher(self.client, job.ref, layer, job.creds,
                          float(self.config.image_pull_progress_timeout))
        started = time.monotonic()
        try:
            lay = await fmt.layout(fetcher, self._thread)
            plan = await self._thread(make_plan, lay, self.index, self._committed_dir)
        except (Unusable, NoRanges, DataLoss) as e:
            return self._declined(job, e)
        finally:
            self._count(fetcher)
        self._remember(job.chain_id, [(f.digest, clean_name(f.name), f.size) for f in lay.files()])
        if plan.fetch_bytes > WORTH * layer.size:
            return self._declined(job, f"only {plan.reused} of {lay.tar_size} bytes are "
                                       "here already")
        return await self._apply(job, scratch, fetcher, lay, plan, started)

    async def _apply(self, job: LayerJob, scratch: Scratch, fetcher: Fetcher, lay: Layout,
                     plan: Plan, started: float) -> tuple[str, Extracted] | None:
        planned = time.monotonic()
        root = await scratch.new()
        work = Job(lay, plan, root, job.layer.digest, has_lower=job.has_lower,
                   allow_device_nodes=self.config.allow_device_nodes,
                   hard_links=self.config.use_hard_links, diff_id=job.diff_id)
        try:
            got = await self._run(work, fetcher)
        except BaseException as e:
            await scratch.drop()
            if isinstance(e, LocalMismatch):
                await self._thread(self.index.forget, e.source.layer, e.source.path)
            if isinstance(e, (Unusable, NoRanges, DataLoss)):
                return self._declined(job, e)
            raise
        finally:
            self._count(fetcher)
        self._remember(job.chain_id, got.landed)
        report = pull_report.current()
        skipped = max(0, job.layer.size - fetcher.received)
        report.reused += got.reused
        report.skipped += skipped
        report.partial_layers += 1
        report.linked_files += got.linked
        done = time.monotonic()
        log.info("image %s: %s layer %s pulled partially: %d of %d files fetched (%d bytes in "
                 "%d requests), %d bytes of files reused (%d hard links), %d bytes skipped; "
                 "%.0f ms (TOC and plan %.0f ms)", job.ref, fmt_name(lay), job.layer.digest,
                 len(lay.files()) - len(plan.local), len(lay.files()), fetcher.received,
                 fetcher.requests, got.reused, got.linked, skipped,
                 (done - started) * 1000, (planned - started) * 1000)
        return root, got.extracted

    async def _run(self, work: Job, fetcher: Fetcher) -> Materialized:
        """The worker thread rebuilding and unpacking the layer, fed the ranges as they
        arrive; either side failing stops the other, and both have ended on return."""
        loop = asyncio.get_running_loop()
        pipe = ChunkPipe(loop)

        def worker() -> Materialized:
            with self._turn:
                try:
                    return materialize(work, Ranges(lambda: pipe.read(self._turn),
                                                    work.plan.ranges))
                finally:
                    pipe.stop()

        async def feed() -> None:
            try:
                await fetcher.feed(work.plan.ranges, pipe.put)
                pipe.close()
            except BaseException as e:
                pipe.fail(e)
                raise

        done = loop.run_in_executor(self._executor, worker)
        feeding = asyncio.ensure_future(feed())
        try:
            await race(feeding, asyncio.shield(done))
            got = await asyncio.shield(done)
        except BaseException as e:
            pipe.fail(e)
            feeding.cancel()
            await settle(feeding, done)
            raise
        feeding.cancel()  # every byte the worker needed has come
        await settle(feeding)
        return got

    # ---- the file index ------------------------------------------------------------------

    def _committed_dir(self, key: str) -> str | None:
        try:
            if self.snapshotter.stat(key).kind is not Kind.COMMITTED:
                return None
            return self.snapshotter.upper_dir(key)
        except NotFound:
            return None

    def _remember(self, chain_id: str, what: Rows | formats.Format) -> None:
        self._pending[chain_id] = what
        self._pending.move_to_end(chain_id)
        while len(self._pending) > _KEEP:
            self._pending.popitem(last=False)

    def committed(self, chain_id: str, layer: oci.Descriptor) -> None:
        """Layer ``chain_id`` was committed by a pull that has ended: record its files for
        later pulls (those of a layer with a TOC unpacked from its blob, too), in the
        background: no pull waits for it (reading a TOC and writing a thousand rows is a
        tenth of a cold pull of such a layer), the next partial attempt does (``indexed``)."""
        what = self._pending.pop(chain_id, None)
        if what is None:
            try:
                what = formats.detect(layer)
            except Unusable:
                return
            if what is None:
                return
        if not self._indexing.closed:
            self._indexing.spawn(self._index(chain_id, layer, what), f"index {chain_id}")

    async def _index(self, chain_id: str, layer: oci.Descriptor,
                     what: Rows | formats.Format) -> None:
        try:
            async with self._guard():
                if await self._thread(self._committed_dir, chain_id) is None:
                    return  # collected before this could start
                rows = what if isinstance(what, list) else \
                    await self._thread(what.rows, self.content.path(layer.digest))
                await self._thread(self.index.add, chain_id, rows)
        except FileNotFoundError:
            pass  # its blob was collected meanwhile (a failed pull): nothing to reuse
        except Exception as e:  # the layer is fine: later pulls just cannot reuse it
            log.warning("layer %s: its files are not indexed for partial pulls: %s",
                        layer.digest, e)

    async def indexed(self) -> None:
        """Wait for the indexing under way (a failure is logged by its task)."""
        pending = self._indexing.tasks()
        if pending:
            await asyncio.wait(pending)

    # ---- plumbing ------------------------------------------------------------------------

    async def _thread(self, fn: Callable[..., T], *args: Any) -> T:
        return await run_settled(None, functools.partial(fn, *args))

    def _count(self, fetcher: Fetcher) -> None:
        new = fetcher.new_bytes()
        if self.count_bytes is not None and new:  # the pull's report and the metrics
            self.count_bytes(new)

    def _declined(self, job: LayerJob, why: object) -> tuple[str, Extracted] | None:
        log.info("image %s: layer %s is pulled whole: %s", job.ref, job.layer.digest, why)
        return None



def fmt_name(lay: Layout) -> str:
    first = next((p for p in lay.pieces if isinstance(p, FileData)), None)
    return "eStargz" if first is not None and first.codec == "gzip" else "zstd:chunked"
