"""The image service: pull, list, status, remove, and the garbage collection behind remove.

This is the core of the CRI ImageService; the gRPC edge only translates. A pull
resolves the reference (one manifest request), stops there when that target is
already present, and otherwise has ``fetch`` bring in the manifest, the config and
the layers (streamed, unpacked side by side). ``garbage`` keeps collections and pulls
from overlapping.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from pycrid.config.images_schema import ImagesConfig
from pycrid.errors import InvalidArgument, NotFound, SignatureValidationFailed
from pycrid.images import pull_report
from pycrid.images.auth import Credentials
from pycrid.images.content import ContentStore
from pycrid.images.distribution import RegistryClient
from pycrid.images.fetch import ImageFetcher, PullMetrics
from pycrid.images.garbage import GarbageCollector
from pycrid.images.mediatypes import Platform, host_platform
from pycrid.images.partial.file_index import FileIndex
from pycrid.images.partial.puller import PartialPuller
from pycrid.images.policy.enforcer import SignaturePolicy, check_names
from pycrid.images.pull_report import PullReport
from pycrid.images.reference import Reference, parse_reference
from pycrid.images.snapshots import Snapshotter
from pycrid.store.image_records import ImageRecord, ImageStore
from pycrid.tasks import Owner

log = logging.getLogger(__name__)



@dataclass(frozen=True)
class ImageView:
    """What the CRI reports of an image."""

    record: ImageRecord
    repo_tags: list[str]
    repo_digests: list[str]
    pinned: bool
    uid: int | None
    username: str



def user_of(user: str) -> tuple[int | None, str]:
    """The CRI's uid/username from an image's ``User`` (``uid``, ``uid:gid``, ``name``...)."""
    u = user.split(":", 1)[0]
    if not u:
        return None, ""
    if u.isdigit():
        return int(u), ""
    return None, u


class ImageService:
    def __init__(
        self,
        *,
        store: ImageStore,
        content: ContentStore,
        snapshotter: Snapshotter,
        client: RegistryClient,
        config: ImagesConfig,
        metrics: PullMetrics | None = None,
        owner: Owner | None = None,
        files: FileIndex | None = None,
    ) -> None:
        self.store = store
        self.content = content
        self.snapshotter = snapshotter
        self.client = client
        self.config = config
        #: The platform an index is resolved to (this machine's).
        self.platform: Platform = host_platform()
        #: Whether an image may be used (None: every image may); set by the wiring.
        self.policy: SignaturePolicy | None = None
        self._sandbox_ref = parse_reference(config.sandbox_image)
        #: The service's background tasks (a collection that outlives the pull that
        #: asked for it); closed with the service.
        self.owner = owner if owner is not None else Owner("images")
        self._collector = GarbageCollector(
            store=store, content=content, snapshotter=snapshotter, owner=self.owner,
            prune=files.retain if files is not None else None)
        #: Partial pulls, when on and the daemon keeps a file index (None: whole layers).
        #: Its indexing after a pull holds off collections as a pull does.
        self.partial = PartialPuller(
            client=client, index=files, snapshotter=snapshotter, content=content,
            config=config, owner=self.owner, guard=self._collector.pulling,
        ) if files is not None and config.enable_partial_images else None
        reported = _Reported(metrics)
        if self.partial is not None:
            self.partial.count_bytes = reported.pull_bytes
        self._fetcher = ImageFetcher(content=content, snapshotter=snapshotter, client=client,
                                     config=config, platform=self.platform,
                                     metrics=reported, partial=self.partial)
        #: The daemon's pull counts, bytes and durations (None: not recorded).
        self.metrics = metrics
        #: Annotation keys of an index or manifest, by digest (what a digest holds never
        #: changes): asked at every CreateContainer, read once.
        self._annotation_keys: dict[str, frozenset[str]] = {}
        #: What the last pull of each image present cost (memory only; for the metrics).
        self.pull_reports: dict[str, PullReport] = {}

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

    def annotated(self, rec: ImageRecord, key: str) -> bool:
        """Whether the image's index or manifest carries the annotation ``key``."""
        for digest in dict.fromkeys((rec.target, rec.manifest)):
            keys = self._annotation_keys.get(digest)
            if keys is None:
                try:
                    doc = json.loads(self.content.read(digest))
                except (NotFound, ValueError):
                    continue
                found = doc.get("annotations") if isinstance(doc, dict) else None
                keys = frozenset(found) if isinstance(found, dict) else frozenset()
                self._annotation_keys[digest] = keys
            if key in keys:
                return True
        return False

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
        if self.policy is not None:
            await self.policy.close()
        await self.client.close()
        self._fetcher.close()
        if self.partial is not None:
            await self.partial.indexed()  # a few milliseconds a layer: not lost at a stop
            self.partial.close()
        await self.owner.aclose()

    # ---- pull ----------------------------------------------------------------------------

    async def pull(self, image: str, creds: Credentials | None,
                   namespace: str = "") -> ImageRecord:
        """Pull ``image`` for a pod of ``namespace`` (its signature policy applies)."""
        started = time.monotonic()
        ok = False
        with pull_report.reporting() as report:
            try:
                rec = await self._pull(image, creds, namespace)
                ok = True
            finally:
                seconds = time.monotonic() - started
                if self.metrics is not None:
                    self.metrics.pull_done(ok, seconds)
                    self.metrics.pull_saved(report.reused, report.skipped)
        if report.fetched or report.reused:
            self.pull_reports[rec.id] = report
            log.info("pulled image %s (%s) in %.2fs: %d bytes fetched, %d bytes reused from "
                     "this node, %d bytes skipped (%d layers pulled partially, %d files "
                     "shared by hard link)", image, rec.id, seconds, report.fetched,
                     report.reused, report.skipped, report.partial_layers,
                     report.linked_files)
        return rec

    async def _pull(self, image: str, creds: Credentials | None, namespace: str
                    ) -> ImageRecord:
        ref = parse_reference(image)
        if ref.digest is not None:
            have = self.store.by_name(f"{ref.name}@{ref.digest}")
            if have is not None:
                # Content addressed and present: nothing to ask the registry (the policy
                # is asked with the signatures kept from its pull).
                if self.policy is not None:
                    await self.policy.check_run(image, have.target, namespace, creds)
                return self.store.put(have, {str(ref)} if ref.tag else set())
        async with self._collector.pulling():
            desc = await self.client.resolve(ref, creds)
            accepted: list[bytes] = []
            if self.policy is not None:  # before anything is fetched: a refusal leaves nothing
                accepted = await self.policy.check_pull(ref, desc.digest, creds, namespace)
            existing = self.store.by_target(desc.digest)
            if existing is not None and self._complete(existing):
                rec = self.store.put(existing, self._names_for(ref, desc.digest))
            else:
                rec = await self._fetcher.fetch(ref, desc, creds)
                rec = self.store.put(rec, self._names_for(ref, desc.digest))
            if self.policy is not None:
                self.policy.keep(desc.digest, accepted)
            return rec

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

    # ---- remove and garbage collection ----------------------------------------------------

    async def remove(self, ref_or_id: str) -> bool:
        """Remove an image and every name it has; False when there was no such image."""
        rec = self.resolve_local(ref_or_id)
        if rec is None:
            return False
        self.store.delete(rec.id)
        if self.policy is not None:
            self.policy.forget({img.target for img in self.store.list()})
        self.pull_reports.pop(rec.id, None)
        await self.gc()
        return True

    async def check_run(self, rec: ImageRecord, names: list[str], namespace: str) -> None:
        """Refuse (SignatureValidationFailed) unless the signature policy of ``namespace``
        lets a container run from ``rec`` under the first of ``names`` that is a reference
        (the kubelet's ``user_specified_image``); with none, under every name the image
        has (CRI-O refuses then; an image without names is refused)."""
        if self.policy is None:
            return
        asked = check_names(names)[:1] or sorted(rec.names)
        if not asked and self.policy.policy_for(namespace) is not None:
            raise SignatureValidationFailed(
                f"image {rec.id} has no name to check against the signature policy")
        for name in asked:
            await self.policy.check_run(name, rec.target, namespace)

    def policy_info(self) -> dict[str, object]:
        return self.policy.describe() if self.policy is not None else {}

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

        Returns (blobs removed, snapshots removed); (0, 0) when deferred. The indexing
        that follows a pull (a few milliseconds a layer) is waited for, not deferred to.
        """
        if self.partial is not None:
            await self.partial.indexed()
        return await self._collector.gc()


class _Reported:
    """The daemon's pull metrics (if any), plus the current pull's report."""

    def __init__(self, inner: PullMetrics | None) -> None:
        self._inner = inner

    def pull_done(self, ok: bool, seconds: float) -> None:
        if self._inner is not None:
            self._inner.pull_done(ok, seconds)

    def pull_bytes(self, n: int) -> None:
        pull_report.current().fetched += n
        if self._inner is not None:
            self._inner.pull_bytes(n)

    def pull_saved(self, reused: int, skipped: int) -> None:
        if self._inner is not None:
            self._inner.pull_saved(reused, skipped)
