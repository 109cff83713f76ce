"""The image service: pull, list, status, remove, and the garbage collection behind remove.

This is the core of the CRI ImageService; the gRPC edge only translates. A pull
resolves the reference (one manifest request), stops there when that target is
already present, and otherwise fetches the manifest (choosing this platform in
an index), the config and the layers. Layers download concurrently (bounded by
``max_concurrent_downloads``), each unpacked while it downloads into a scratch
snapshot of its own, side by side, in worker threads; each is committed under
its chain id, on top of its parent, once its blob and diff id are verified and
the layers below it are committed. So images sharing layers share both content
and snapshots.
The garbage collector and pulls never overlap: a collection asked for while
pulls are in flight (a remove, or a pull that failed) runs when the last of
them ends, and a pull waits for a running collection to finish. So a blob or
snapshot that a pull has just found present is never swept from under it.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import json
import logging
import secrets
import time
from collections.abc import AsyncIterator, Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from pycrid.config.schema import ImagesConfig
from pycrid.errors import AlreadyExists, DataLoss, InvalidArgument, NotFound, PycridError
from pycrid.faults import failpoint
from pycrid.images import manifest as mf
from pycrid.images.auth import Credentials
from pycrid.images.content import ContentStore
from pycrid.images.distribution import RegistryClient
from pycrid.images.mediatypes import INDEX_TYPES, Descriptor, Platform, host_platform, verify_bytes
from pycrid.images.reference import Reference, parse_reference
from pycrid.images.snapshots import TEMP_PREFIX, Kind, Snapshotter
from pycrid.images.threads import run_settled, settle
from pycrid.images.unpack import (
    Extracted,
    check_layer_type,
    extract,
    inherit_dirs,
    needs_lowers,
)
from pycrid.store.image_records import ImageRecord, ImageStore

log = logging.getLogger(__name__)

T = TypeVar("T")


def chain_ids(diff_ids: list[str]) -> list[str]:
    """The OCI chain id of each layer prefix: what snapshots are keyed by."""
    out: list[str] = []
    for d in diff_ids:
        out.append(d if not out else
                   "sha256:" + hashlib.sha256(f"{out[-1]} {d}".encode()).hexdigest())
    return out


@dataclass(frozen=True)
class ImageView:
    """What the CRI reports of an image."""

    record: ImageRecord
    repo_tags: list[str]
    repo_digests: list[str]
    pinned: bool
    uid: int | None
    username: str


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


def user_of(user: str) -> tuple[int | None, str]:
    """The CRI's uid/username from an image's ``User`` (``uid``, ``uid:gid``, ``name``...)."""
    u = user.split(":", 1)[0]
    if not u:
        return None, ""
    if u.isdigit():
        return int(u), ""
    return None, u


class PullMetrics(Protocol):
    """Where pulls are counted (pycrid.metrics.Metrics)."""

    def pull_done(self, ok: bool, seconds: float) -> None: ...

    def pull_bytes(self, n: int) -> None: ...


class ImageService:
    def __init__(
        self,
        *,
        store: ImageStore,
        content: ContentStore,
        snapshotter: Snapshotter,
        client: RegistryClient,
        config: ImagesConfig,
        platform: Platform | None = None,
    ) -> None:
        self.store = store
        self.content = content
        self.snapshotter = snapshotter
        self.client = client
        self.config = config
        self.platform = platform or host_platform()
        self._sandbox_ref = parse_reference(config.sandbox_image)
        self._pulls = 0
        self._gc_pending = False
        self._no_gc_running = asyncio.Event()
        self._no_gc_running.set()
        self._gc_lock = asyncio.Lock()
        # The threads that hash, decompress and untar layers as they download: a pool of
        # the service's own, so long unpacks never hold up the loop's default executor.
        # Layers of concurrent pulls beyond its size wait (and so does their download).
        self._unpackers = ThreadPoolExecutor(
            max_workers=4 * config.max_concurrent_downloads, thread_name_prefix="unpack")
        #: Set by the daemon: pull counts, bytes and durations.
        self.metrics: PullMetrics | None = None

    # ---- lookups -------------------------------------------------------------------------

    def resolve_local(self, ref_or_id: str) -> ImageRecord | None:
        """Find an image by id (full or ``sha256:`` prefix), or by any reference to it."""
        s = ref_or_id.strip()
        if not s:
            raise InvalidArgument("image reference is empty")
        if s.startswith("sha256:") or (len(s) >= 12 and all(c in "0123456789abcdef" for c in s)):
            full = s if s.startswith("sha256:") else "sha256:" + s
            img = self.store.get(full)
            if img is not None:
                return img
            if len(full) < 64 + 7:
                found = self.store.by_id_prefix(full)
                if len(found) == 1:
                    return found[0]
            if s.startswith("sha256:") or len(s) == 64:
                return None  # an id (a bare 64-hex string is never a repository name)
        ref = parse_reference(s)
        return self.store.by_name(str(ref))

    def view(self, rec: ImageRecord) -> ImageView:
        tags = sorted(n for n in rec.names if "@" not in n)
        digests = sorted(n for n in rec.names if "@" in n)
        uid, username = user_of(rec.user)
        sandbox = self.store.by_name(str(self._sandbox_ref))
        return ImageView(
            record=rec, repo_tags=tags, repo_digests=digests,
            pinned=sandbox is not None and sandbox.id == rec.id,
            uid=uid, username=username,
        )

    def list_images(self, filter_ref: str = "") -> list[ImageView]:
        if filter_ref:
            rec = self.resolve_local(filter_ref)
            return [self.view(rec)] if rec else []
        return [self.view(r) for r in self.store.list()]

    def status(self, ref_or_id: str) -> ImageView | None:
        rec = self.resolve_local(ref_or_id)
        return self.view(rec) if rec else None

    def verbose_info(self, rec: ImageRecord) -> dict[str, Any]:
        """ImageStatus verbose info: the image config and where it lives (containerd's shape)."""
        try:
            config = json.loads(self.content.read(rec.id))
        except (NotFound, ValueError):
            config = None
        return {
            "imageSpec": config,
            "chainID": rec.chain[-1] if rec.chain else "",
            "manifestDigest": rec.manifest,
            "target": rec.target,
            "snapshotter": self.snapshotter.name,
        }

    async def fs_usage(self) -> tuple[int, int, str]:
        """(bytes, inodes, mountpoint) of the image filesystem, for ImageFsInfo."""
        u = await asyncio.to_thread(self.snapshotter.fs_usage)
        return u.size, u.inodes, self.snapshotter.root

    # ---- lifetime ------------------------------------------------------------------------

    async def recover(self) -> None:
        """Start-up: drop what a crash left half-done (ingests, scratch snapshots, orphans)."""
        leftovers = self.content.cleanup()
        leftovers += await asyncio.to_thread(self.snapshotter.cleanup)
        blobs, snaps = await self.gc()
        if leftovers or blobs or snaps:
            log.info("image store recovered: removed %d leftovers, %d unreferenced blobs, "
                     "%d unreferenced snapshots", len(leftovers), blobs, snaps)

    async def close(self) -> None:
        await self.client.close()
        self._unpackers.shutdown(wait=False, cancel_futures=True)

    # ---- pull ----------------------------------------------------------------------------

    async def pull(self, image: str, creds: Credentials | None) -> ImageRecord:
        if self.metrics is None:
            return await self._pull(image, creds)
        started = time.monotonic()
        ok = False
        try:
            rec = await self._pull(image, creds)
            ok = True
            return rec
        finally:
            self.metrics.pull_done(ok, time.monotonic() - started)

    async def _pull(self, image: str, creds: Credentials | None) -> ImageRecord:
        ref = parse_reference(image)
        if ref.digest is not None:
            have = self.store.by_name(f"{ref.name}@{ref.digest}")
            if have is not None:
                # Content addressed and present: nothing to ask the registry.
                return self.store.put(have, {str(ref)} if ref.tag else set())
        await self._no_gc_running.wait()
        self._pulls += 1  # no await since the wait: a collection cannot start in between
        try:
            desc = await self.client.resolve(ref, creds)
            existing = self.store.by_target(desc.digest)
            if existing is not None and self._complete(existing):
                return self.store.put(existing, self._names_for(ref, desc.digest))
            rec = await self._fetch_and_unpack(ref, desc, creds)
            return self.store.put(rec, self._names_for(ref, desc.digest))
        except BaseException:
            # Verified blobs and snapshots of a failed pull are garbage unless an image
            # refers to them.
            self._gc_pending = True
            raise
        finally:
            self._pulls -= 1
            if self._pulls == 0 and self._gc_pending:
                with contextlib.suppress(Exception):
                    await asyncio.shield(self.gc())

    def _names_for(self, ref: Reference, target: str) -> set[str]:
        names = {f"{ref.name}@{target}"}
        if ref.tag:
            names.add(f"{ref.name}:{ref.tag}")
        return names

    def _complete(self, rec: ImageRecord) -> bool:
        if not all(self.content.exists(d) for d in (rec.manifest, rec.id)):
            return False
        try:
            self.snapshotter.stat(rec.chain[-1])
        except NotFound:
            return False
        return True

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

    async def _fetch_and_unpack(
        self, ref: Reference, target: Descriptor, creds: Credentials | None
    ) -> ImageRecord:
        writes: list[asyncio.Future[None]] = []
        try:
            rec = await self._fetch_all(ref, target, creds, writes)
        finally:
            await settle(*writes)
        for w in writes:
            w.result()  # the manifest and config are stored before the image is recorded
        return rec

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
        async with asyncio.TaskGroup() as tg:
            for i, layer in enumerate(layers):
                if self._has_snapshot(chain[i]):
                    committed[i].set()  # unpacked already: the blob is not needed again
                    continue
                tg.create_task(self._layer(
                    ref, creds, sem, layer, diff_ids[i], chain[:i + 1],
                    below=committed[i - 1] if i else None, done=committed[i]))

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

        async def unpack(lowers: list[str] | None = None) -> tuple[str, Extracted]:
            """Into a new scratch snapshot: the blob as it downloads, or from the store."""
            nonlocal key
            key = f"{TEMP_PREFIX}{secrets.token_hex(6)}-{chain_id}"
            await self._settled(self.snapshotter.prepare, key, None)
            root = self.snapshotter.upper_dir(key)
            got = await self.content.ingest(
                layer.digest, layer.size, opener,
                functools.partial(extract, root=root, name=layer.digest,
                                  has_lower=parent is not None, lowers=lowers or (),
                                  allow_device_nodes=self.config.allow_device_nodes),
                progress_timeout=float(self.config.image_pull_progress_timeout),
                executor=self._unpackers)
            if got.downloaded and self.metrics is not None:
                self.metrics.pull_bytes(got.size)
            if got.result.diff_id != diff_id:
                raise DataLoss(f"layer {layer.digest}: diffID mismatch: config says "
                               f"{diff_id}, content is {got.result.diff_id}")
            return root, got.result

        try:
            async with sem:
                root, unpacked = await unpack()
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
        except BaseException:
            if key:
                await self._discard(key)
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

    # ---- remove and garbage collection ----------------------------------------------------

    async def remove(self, ref_or_id: str) -> bool:
        """Remove an image and every name it has; False when there was no such image."""
        rec = self.resolve_local(ref_or_id)
        if rec is None:
            return False
        self.store.delete(rec.id)
        await self.gc()
        return True

    async def release(self, chain_ids: Iterable[str]) -> None:
        """Snapshots built on ``chain_ids`` (a container's rootfs, its image volumes) are
        gone: collect the chains no image holds any more. The collector keeps a chain
        while anything is built on it, so an image removed while a container still used
        it (containerd's leases do the same) goes only now."""
        held = {c for img in self.store.list() for c in img.chain}
        if any(c not in held for c in chain_ids):
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
                return blobs, snaps
            for key in doomed:
                self.snapshotter.remove(key)
                snaps += 1
