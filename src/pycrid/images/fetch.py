"""Fetch one image into the content store and the snapshots: the streaming half of a pull.

The manifest is fetched (choosing this platform in an index), then the config and the
layers. Layers download concurrently (bounded by ``max_concurrent_downloads``), each
unpacked while it downloads into a scratch snapshot of its own, side by side, in
worker threads; each is committed under its chain id, on top of its parent, once its
blob and diff id are verified and the layers below it are committed. So images
sharing layers share both content and snapshots.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import logging
import secrets
import time
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol, TypeVar

from pycrid.config.images_schema import ImagesConfig
from pycrid.errors import AlreadyExists, DataLoss, NotFound, PycridError
from pycrid.faults import failpoint
from pycrid.host import space
from pycrid.images import manifest as mf
from pycrid.images.auth import Credentials
from pycrid.images.content import ContentStore
from pycrid.images.distribution import RegistryClient
from pycrid.images.heap import PullBuffers
from pycrid.images.mediatypes import INDEX_TYPES, Descriptor, Platform, verify_bytes
from pycrid.images.partial.puller import LayerJob, PartialPuller, Scratch
from pycrid.images.reference import Reference
from pycrid.images.snapshots import TEMP_PREFIX, Kind, Snapshotter
from pycrid.images.threads import run_settled, settle
from pycrid.images.unpack import (
    Extracted,
    check_layer_type,
    extract,
    inherit_dirs,
    needs_lowers,
)
from pycrid.store.image_records import ImageRecord

log = logging.getLogger(__name__)

T = TypeVar("T")



def chain_ids(diff_ids: list[str]) -> list[str]:
    """The OCI chain id of each layer prefix: what snapshots are keyed by."""
    out: list[str] = []
    for d in diff_ids:
        out.append(d if not out else
                   "sha256:" + hashlib.sha256(f"{out[-1]} {d}".encode()).hexdigest())
    return out


def _most_telling(eg: BaseExceptionGroup[BaseException]) -> BaseException:
    """The error to report from a failed group of downloads: ours before anything else."""
    leaves: list[BaseException] = []

    def walk(e: BaseException) -> None:
        if isinstance(e, BaseExceptionGroup):
            for sub in e.exceptions:
                walk(sub)
        else:
            leaves.append(e)

    walk(eg)
    for e in leaves:
        if isinstance(e, PycridError):
            return e
    return leaves[0]


class PullMetrics(Protocol):
    """Where pulls are counted (pycrid.metrics.Metrics)."""

    def pull_done(self, ok: bool, seconds: float) -> None: ...

    def pull_bytes(self, n: int) -> None: ...

    def pull_saved(self, reused: int, skipped: int) -> None: ...



class ImageFetcher:
    """Fetches images for the image service: the registry client, the stores written to,
    and the worker threads that unpack."""

    def __init__(
        self,
        *,
        content: ContentStore,
        snapshotter: Snapshotter,
        client: RegistryClient,
        config: ImagesConfig,
        platform: Platform,
        metrics: PullMetrics | None = None,
        partial: PartialPuller | None = None,
    ) -> None:
        self.content = content
        self.snapshotter = snapshotter
        self.client = client
        self.config = config
        self.platform = platform
        # The threads that hash, decompress and untar layers as they download: a pool of
        # the service's own, so long unpacks never hold up the loop's default executor.
        # Layers of concurrent pulls beyond its size wait (and so does their download).
        self._unpackers = ThreadPoolExecutor(
            max_workers=4 * config.max_concurrent_downloads, thread_name_prefix="unpack")
        #: Pull bytes are counted here when set (by the image service).
        self.metrics = metrics
        # Freed buffers stay in the C heap while pulls run, and go back after the last.
        self._buffers = PullBuffers(self._unpackers)
        #: Asked first for each layer: a partial pull (None: every layer whole).
        self.partial = partial

    def close(self) -> None:
        self._unpackers.shutdown(wait=False, cancel_futures=True)

    async def fetch(
        self, ref: Reference, target: Descriptor, creds: Credentials | None
    ) -> ImageRecord:
        """The image ``target`` (an index or a manifest) names: its blobs stored, its layers
        committed as snapshots; the record returned is not stored yet."""
        writes: list[asyncio.Future[None]] = []
        with self._buffers.pulling(), space.writing(f"image {ref}", self.content.root):
            try:
                rec = await self._fetch_all(ref, target, creds, writes)
            finally:
                await settle(*writes)
            for w in writes:
                w.result()  # the manifest and config are stored before the image is recorded
        return rec

    async def _blob(
        self, ref: Reference, desc: Descriptor, creds: Credentials | None, what: str,
        writes: list[asyncio.Future[None]], limit: int = 4 << 20,
    ) -> bytes:
        """A small blob (manifest, index, config): from the store, else fetched, verified,
        and stored by a thread (its fsync need not hold up the layers), which the caller
        awaits through ``writes`` before it records the image."""
        if desc.size > limit:
            raise DataLoss(f"{what} {desc.digest} of {ref} is {desc.size} bytes; limit {limit}")
        if self.content.exists(desc.digest):
            return self.content.read(desc.digest)
        if what == "config":
            data = b""
            async with self.client.fetch_blob(ref, desc, creds) as chunks:
                async for chunk in chunks:
                    data += chunk
                    if len(data) > desc.size:
                        break
        else:
            data = await self.client.fetch_manifest(ref, desc, creds)
        if self.metrics is not None:
            self.metrics.pull_bytes(len(data))
        verify_bytes(data, desc.digest, f"{what} of image {ref}")
        writes.append(asyncio.get_running_loop().run_in_executor(
            None, self.content.write, desc.digest, data))
        return data


    async def _fetch_all(
        self, ref: Reference, target: Descriptor, creds: Credentials | None,
        writes: list[asyncio.Future[None]],
    ) -> ImageRecord:
        desc = target
        data = await self._blob(ref, desc, creds, "manifest", writes)
        media_type = mf.detect_media_type(data, desc.media_type)
        if media_type in INDEX_TYPES:
            desc = mf.select_platform(mf.parse_index(data), self.platform, str(ref))
            data = await self._blob(ref, desc, creds, "manifest", writes)
        manifest = mf.parse_manifest(data)
        config_bytes = await self._blob(ref, manifest.config, creds, "config", writes)
        config = mf.parse_image_config(config_bytes)
        if len(config.diff_ids) != len(manifest.layers):
            raise DataLoss(
                f"image {ref}: manifest lists {len(manifest.layers)} layers but its config "
                f"has {len(config.diff_ids)} diff ids")
        chain = chain_ids(config.diff_ids)
        for layer in manifest.layers:
            check_layer_type(layer.media_type)
        failpoint("pull.manifest")
        try:
            await self._download_and_unpack(ref, creds, manifest.layers, config.diff_ids, chain)
        except BaseExceptionGroup as eg:
            raise _most_telling(eg) from None
        failpoint("pull.unpacked")  # every layer committed, no image record yet
        size = manifest.config.size + len(data) + sum(x.size for x in manifest.layers)
        return ImageRecord(
            id=manifest.config.digest, target=target.digest, manifest=desc.digest,
            layers=tuple(x.digest for x in manifest.layers), chain=tuple(chain),
            size=size, user=config.user, created_at=time.time(),
        )

    async def _download_and_unpack(
        self, ref: Reference, creds: Credentials | None, layers: list[Descriptor],
        diff_ids: list[str], chain: list[str],
    ) -> None:
        """Every layer not already unpacked: downloaded and unpacked side by side, committed
        bottom up."""
        sem = asyncio.Semaphore(self.config.max_concurrent_downloads)
        committed = [asyncio.Event() for _ in layers]
        fetched: list[int] = []
        try:
            async with asyncio.TaskGroup() as tg:
                for i, layer in enumerate(layers):
                    if self._has_snapshot(chain[i]):
                        committed[i].set()  # unpacked already: the blob is not needed again
                        continue
                    fetched.append(i)
                    tg.create_task(self._layer(
                        ref, creds, sem, layer, diff_ids[i], chain[:i + 1],
                        below=committed[i - 1] if i else None, done=committed[i]))
        finally:
            if self.partial is not None:
                # The layers this pull committed are indexed for later partial pulls once
                # it has ended (also when it failed): in the background, not competing with
                # the pull's own unpacking for the cores (a partial attempt waits for it).
                for i in fetched:
                    if committed[i].is_set():
                        self.partial.committed(chain[i], layers[i])

    def _has_snapshot(self, key: str) -> bool:
        try:
            return self.snapshotter.stat(key).kind is Kind.COMMITTED
        except NotFound:
            return False

    async def _layer(
        self, ref: Reference, creds: Credentials | None, sem: asyncio.Semaphore,
        layer: Descriptor, diff_id: str, chain: list[str], *, below: asyncio.Event | None,
        done: asyncio.Event,
    ) -> None:
        """One layer: stream it into a scratch snapshot with no parent, then, once the layers
        below are committed, commit it under its chain id on top of them. Any failure or
        cancellation removes the scratch snapshot (and the download its ingest file)."""
        chain_id = chain[-1]
        parent = chain[-2] if len(chain) > 1 else None
        key = ""

        def opener() -> contextlib.AbstractAsyncContextManager[AsyncIterator[bytes]]:
            return self.client.fetch_blob(ref, layer, creds)

        async def scratch() -> str:
            """A new scratch snapshot (its directory) for the layer."""
            nonlocal key
            key = f"{TEMP_PREFIX}{secrets.token_hex(6)}-{chain_id}"
            await self._settled(self.snapshotter.prepare, key, None)
            return self.snapshotter.upper_dir(key)

        async def drop() -> None:
            nonlocal key
            await self._discard(key)
            key = ""

        async def unpack(lowers: list[str] | None = None) -> tuple[str, Extracted]:
            """Into a new scratch snapshot: the blob as it downloads, or from the store."""
            root = await scratch()
            got = await self.content.ingest(
                layer.digest, layer.size, opener,
                functools.partial(extract, root=root, name=layer.digest,
                                  has_lower=parent is not None, lowers=lowers or (),
                                  allow_device_nodes=self.config.allow_device_nodes,
                                  verified=True),
                progress_timeout=float(self.config.image_pull_progress_timeout),
                executor=self._unpackers)
            if got.downloaded and self.metrics is not None:
                self.metrics.pull_bytes(got.size)
            if got.result.diff_id != diff_id:
                raise DataLoss(f"layer {layer.digest}: diffID mismatch: config says "
                               f"{diff_id}, content is {got.result.diff_id}")
            return root, got.result

        async def partially() -> tuple[str, Extracted] | None:
            if self.partial is None or self.content.exists(layer.digest):
                return None
            job = LayerJob(ref, creds, layer, diff_id, chain_id, has_lower=parent is not None)
            return await self.partial.unpack(job, Scratch(scratch, drop))

        try:
            async with sem:
                root, unpacked = await partially() or await unpack()
            failpoint("pull.downloaded")  # a verified blob in the content store
            if below is not None:
                await below.wait()
            if parent is not None and unpacked.implicit:
                lowers = [self.snapshotter.upper_dir(c) for c in reversed(chain[:-1])]
                if await self._settled(needs_lowers, root, unpacked.implicit, lowers):
                    # Rare (hand-made layers): names go through the layers below, which
                    # are committed now; unpack again from the verified blob with them.
                    await self._discard(key)
                    root, unpacked = await unpack(lowers)
                await self._settled(inherit_dirs, root, unpacked.implicit, lowers)
            failpoint("pull.unpacking")  # unpacked and verified, scratch not yet committed
            try:
                await self._settled(self.snapshotter.commit, chain_id, key, parent=parent)
            except AlreadyExists:
                await self._discard(key)  # another pull committed the same tree first
        except BaseException as e:
            if key:
                await self._discard(key)
            if space.is_no_space(e):  # written both to the content store and the snapshot
                raise space.no_space(e, f"layer {layer.digest} of image {ref} (blob and "
                                     "unpacked files)", self.content.root) from None
            raise
        done.set()

    async def _settled(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """A short blocking call (snapshotter, metadata) in the default executor, finished
        before a cancellation goes on."""
        return await run_settled(None, functools.partial(fn, *args, **kwargs))

    async def _discard(self, key: str) -> None:
        """Remove a scratch snapshot without hiding why the unpack failed; ``cleanup()`` at
        start-up catches what this cannot."""
        def remove() -> None:
            with contextlib.suppress(NotFound):
                self.snapshotter.remove(key)

        try:
            await self._settled(remove)
        except Exception:
            log.exception("cannot remove scratch snapshot %s of a failed unpack", key)
