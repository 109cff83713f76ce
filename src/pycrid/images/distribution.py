"""A client of the OCI distribution API: resolve a reference, fetch manifests and blobs.

Each call tries the registry's endpoints in order (mirrors, then the server; see
``hosts``), answers one authentication challenge per endpoint, and turns every
failure into an error kind whose message names the image and the registry: a
person reading ``crictl pull`` output should know what to fix without a packet
capture. Resolving an image already present costs one HEAD when the registry
cooperates; a manifest fetched by GET while resolving is kept for the fetch that
follows, so it is not downloaded twice. The requests themselves (auth, TLS, transport
errors) are ``registry_http``'s; what a refusal means is ``registry_errors``'.
"""

from __future__ import annotations

import contextlib
import logging
from collections import OrderedDict
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

import aiohttp
from multidict import CIMultiDictProxy

from pycrid.errors import (
    DataLoss,
    DeadlineExceeded,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    PycridError,
    Unauthenticated,
    Unavailable,
)
from pycrid.images import mediatypes as oci
from pycrid.images.auth import Credentials
from pycrid.images.hosts import CAP_PULL, CAP_RESOLVE, RegistryHost, RegistryHosts
from pycrid.images.manifest import detect_media_type
from pycrid.images.mediatypes import Descriptor
from pycrid.images.reference import Reference
from pycrid.images.registry_errors import fail
from pycrid.images.registry_http import RegistryHTTP

log = logging.getLogger(__name__)

T = TypeVar("T")

MAX_MANIFEST_SIZE = 4 << 20
_KEEP_MANIFESTS = 16
_GENERIC_TYPES = frozenset({"", "application/json", "application/octet-stream", "text/plain"})


class RegistryClient:
    def __init__(
        self, hosts: RegistryHosts, *, user_agent: str = "pycrid/0.1", timeout: float = 30.0
    ) -> None:
        self.hosts = hosts
        self.user_agent = user_agent
        self.timeout = timeout
        self._http = RegistryHTTP(user_agent=user_agent, timeout=timeout)
        self._manifests: OrderedDict[str, bytes] = OrderedDict()

    async def close(self) -> None:
        await self._http.close()

    # ---- public API --------------------------------------------------------------------

    async def resolve(self, ref: Reference, creds: Credentials | None) -> Descriptor:
        """The descriptor ``ref`` points at (an index or a manifest), from a HEAD if possible."""

        async def one(h: RegistryHost) -> Descriptor:
            url = _url(h, ref, f"manifests/{ref.object}")
            headers = {"Accept": ", ".join(oci.ACCEPT_MANIFESTS)}
            limits = aiohttp.ClientTimeout(total=self.timeout)
            async with self._open(h, ref, "HEAD", url, headers, creds, limits) as resp:
                if resp.status == 200:
                    desc = _desc_from_head(resp.headers, ref)
                    if desc is not None:
                        return desc
                elif resp.status != 405:
                    await fail(resp, h, ref, "manifest")
            async with self._open(h, ref, "GET", url, headers, creds, limits) as resp:
                if resp.status != 200:
                    await fail(resp, h, ref, "manifest")
                body = await self._read_manifest(resp, h, ref)
            return self._desc_from_body(body, resp.headers, h, ref)

        return await self._each_host(ref, CAP_RESOLVE if ref.digest is None else CAP_PULL, one)

    async def fetch_manifest(
        self, ref: Reference, desc: Descriptor, creds: Credentials | None
    ) -> bytes:
        """The manifest or index ``desc`` names, verified against its digest."""
        cached = self._manifests.pop(desc.digest, None)
        if cached is not None:
            return cached
        if desc.size > MAX_MANIFEST_SIZE:
            raise DataLoss(f"image '{ref}': manifest {desc.digest} is {desc.size} bytes, "
                           f"more than the {MAX_MANIFEST_SIZE} allowed")

        async def one(h: RegistryHost) -> bytes:
            url = _url(h, ref, f"manifests/{desc.digest}")
            accept = [desc.media_type] if desc.media_type else []
            accept += [t for t in oci.ACCEPT_MANIFESTS if t not in accept]
            limits = aiohttp.ClientTimeout(total=self.timeout)
            async with self._open(h, ref, "GET", url, {"Accept": ", ".join(accept)}, creds,
                                  limits) as resp:
                if resp.status != 200:
                    await fail(resp, h, ref, "manifest", desc.digest)
                body = await self._read_manifest(resp, h, ref)
            got = oci.sha256_digest(body)
            if got != desc.digest:
                raise DataLoss(f"image '{ref}': registry {h.host} sent a manifest whose digest "
                               f"is {got}, not the requested {desc.digest}")
            return body

        return await self._each_host(ref, CAP_PULL, one)

    def fetch_blob(
        self, ref: Reference, desc: Descriptor, creds: Credentials | None, offset: int = 0
    ) -> contextlib.AbstractAsyncContextManager[AsyncIterator[bytes]]:
        """The blob's bytes from ``offset`` on, as chunks; not verified (the store does that),
        but a stream that ends before ``desc.size`` bytes raises DataLoss."""
        return self._blob(ref, desc, creds, offset)

    def blob_ranges(
        self, ref: Reference, desc: Descriptor, creds: Credentials | None, ranges: str
    ) -> contextlib.AbstractAsyncContextManager[RangeAnswer]:
        """One GET of blob ``desc`` with ``Range: <ranges>`` (a partial pull): the answer
        as it comes (206, or 200 when the registry ignores ranges; the caller reads and
        checks the body it needs, and closes the rest away)."""
        return self._ranges(ref, desc, creds, ranges)

    # ---- blobs -------------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def _ranges(
        self, ref: Reference, desc: Descriptor, creds: Credentials | None, ranges: str
    ) -> AsyncIterator[RangeAnswer]:
        resp, host = await self._get_blob(ref, desc, creds, {"Accept": "*/*", "Range": ranges},
                                          lambda status: status in (200, 206))
        try:
            yield RangeAnswer(resp.status, resp.headers.get("Content-Type", ""),
                              resp.headers.get("Content-Range", ""),
                              self._answer(resp, host, ref, desc))
        finally:
            resp.close()

    async def _answer(self, resp: aiohttp.ClientResponse, h: RegistryHost, ref: Reference,
                      desc: Descriptor) -> AsyncGenerator[bytes, None]:
        try:
            async for chunk, _ in resp.content.iter_chunks():
                if chunk:
                    yield chunk
        except TimeoutError:
            raise DeadlineExceeded(f"image '{ref}': registry {h.host} sent nothing for "
                                   f"{self.timeout:g}s of ranges of blob {desc.digest}") from None
        except (aiohttp.ClientPayloadError, aiohttp.ClientConnectionError) as e:
            raise DataLoss(f"image '{ref}': connection to registry {h.host} broke while "
                           f"sending ranges of blob {desc.digest} ({type(e).__name__})") from None

    @contextlib.asynccontextmanager
    async def _blob(
        self, ref: Reference, desc: Descriptor, creds: Credentials | None, offset: int
    ) -> AsyncIterator[AsyncIterator[bytes]]:
        if offset < 0 or offset > desc.size:
            raise InvalidArgument(f"blob {desc.digest}: offset {offset} outside 0..{desc.size}")
        if offset == desc.size and offset:
            yield _empty()  # nothing left to fetch; a Range past the end would be refused
            return
        headers = {"Accept": "*/*"}
        if offset:
            headers["Range"] = f"bytes={offset}-"
        resp, host = await self._get_blob(
            ref, desc, creds, headers,
            lambda status: status == 200 or bool(offset and status == 206))
        # A registry that ignored the Range answers 200 with the whole blob: skip ahead.
        skip = offset if resp.status == 200 else 0
        chunks = self._chunks(resp, host, ref, desc, offset, skip)
        try:
            yield chunks
        finally:
            await chunks.aclose()
            resp.close()

    async def _get_blob(
        self, ref: Reference, desc: Descriptor, creds: Credentials | None,
        headers: dict[str, str], ok: Callable[[int], bool],
    ) -> tuple[aiohttp.ClientResponse, RegistryHost]:
        """GET blob ``desc`` from the first host that answers with a status ``ok`` takes
        (its response open, and the host); any other answer is that host's failure."""
        limits = aiohttp.ClientTimeout(total=None, sock_connect=self.timeout,
                                       sock_read=self.timeout)

        async def one(h: RegistryHost) -> tuple[aiohttp.ClientResponse, RegistryHost]:
            url = _url(h, ref, f"blobs/{desc.digest}")
            resp = await self._http.request(h, ref, "GET", url, headers, creds, limits)
            if ok(resp.status):
                return resp, h
            try:
                await fail(resp, h, ref, "blob", desc.digest)
            finally:
                resp.release()

        return await self._each_host(ref, CAP_PULL, one)

    async def _chunks(
        self, resp: aiohttp.ClientResponse, h: RegistryHost, ref: Reference, desc: Descriptor,
        offset: int, skip: int,
    ) -> AsyncGenerator[bytes, None]:
        want = desc.size - offset
        got = 0
        try:
            # Chunks as received, not joined: the unpack thread joins what it takes.
            async for chunk, _ in resp.content.iter_chunks():
                if not chunk:
                    continue  # the end of a chunked-encoding chunk
                if skip:
                    cut = min(skip, len(chunk))
                    chunk, skip = chunk[cut:], skip - cut
                    if not chunk:
                        continue
                got += len(chunk)
                yield chunk
        except TimeoutError:
            raise DeadlineExceeded(
                f"image '{ref}': registry {h.host} sent nothing for {self.timeout:g}s while "
                f"downloading blob {desc.digest} ({offset + got} of {desc.size} bytes)"
            ) from None
        except (aiohttp.ClientPayloadError, aiohttp.ClientConnectionError) as e:
            raise DataLoss(
                f"image '{ref}': connection to registry {h.host} broke after "
                f"{offset + got} of {desc.size} bytes of blob {desc.digest} "
                f"({type(e).__name__})") from None
        if got < want:
            raise DataLoss(
                f"image '{ref}': registry {h.host} ended blob {desc.digest} after "
                f"{offset + got} of {desc.size} bytes")

    # ---- plumbing ----------------------------------------------------------------------

    async def _each_host(
        self, ref: Reference, capability: str, op: Callable[[RegistryHost], Awaitable[T]]
    ) -> T:
        """Run ``op`` against each endpoint with ``capability`` until one succeeds."""
        hosts = [h for h in self.hosts.hosts_for(ref.domain) if h.can(capability)]
        if not hosts:
            raise Unavailable(f"image '{ref}': no registry host configured for {ref.domain} "
                              f"may {capability}")
        for i, h in enumerate(hosts):
            try:
                return await op(h)
            except (NotFound, Unavailable, DeadlineExceeded, Unauthenticated, PermissionDenied,
                    DataLoss) as e:
                if i == len(hosts) - 1:
                    raise
                log.info("image %s: %s failed (%s); trying the next host", ref, h.host, e)
        raise AssertionError("unreachable")

    @contextlib.asynccontextmanager
    async def _open(
        self, h: RegistryHost, ref: Reference, method: str, url: str, headers: dict[str, str],
        creds: Credentials | None, limits: aiohttp.ClientTimeout,
    ) -> AsyncIterator[aiohttp.ClientResponse]:
        resp = await self._http.request(h, ref, method, url, headers, creds, limits)
        try:
            yield resp
        finally:
            resp.release()

    async def _read_manifest(
        self, resp: aiohttp.ClientResponse, h: RegistryHost, ref: Reference
    ) -> bytes:
        if resp.content_length is not None and resp.content_length > MAX_MANIFEST_SIZE:
            raise DataLoss(f"image '{ref}': registry {h.host} offers a manifest of "
                           f"{resp.content_length} bytes, more than the {MAX_MANIFEST_SIZE} "
                           "allowed")
        try:
            body = await resp.content.read(MAX_MANIFEST_SIZE + 1)
            while len(body) <= MAX_MANIFEST_SIZE:
                more = await resp.content.read(MAX_MANIFEST_SIZE + 1 - len(body))
                if not more:
                    break
                body += more
        except TimeoutError:
            raise DeadlineExceeded(
                f"image '{ref}': registry {h.host} stalled while sending a manifest") from None
        except (aiohttp.ClientPayloadError, aiohttp.ClientConnectionError) as e:
            raise DataLoss(f"image '{ref}': connection to registry {h.host} broke while "
                           f"reading a manifest ({type(e).__name__})") from None
        if len(body) > MAX_MANIFEST_SIZE:
            raise DataLoss(f"image '{ref}': registry {h.host} sent a manifest larger than "
                           f"{MAX_MANIFEST_SIZE} bytes")
        if resp.content_length is not None and len(body) != resp.content_length:
            raise DataLoss(f"image '{ref}': registry {h.host} sent {len(body)} bytes of a "
                           f"{resp.content_length}-byte manifest")
        return body

    def _desc_from_body(
        self, body: bytes, headers: CIMultiDictProxy[str], h: RegistryHost, ref: Reference
    ) -> Descriptor:
        digest = oci.sha256_digest(body)
        claimed = headers.get("Docker-Content-Digest", "")
        if claimed.startswith("sha256:") and claimed != digest:
            raise DataLoss(f"image '{ref}': registry {h.host} says the manifest is {claimed} "
                           f"but its bytes hash to {digest}")
        if ref.digest is not None and ref.digest != digest:
            raise DataLoss(f"image '{ref}': registry {h.host} sent a manifest whose digest is "
                           f"{digest}")
        try:
            media_type = detect_media_type(body, headers.get("Content-Type", ""))
        except PycridError as e:
            raise type(e)(f"image '{ref}' from registry {h.host}: {e}") from None
        self._manifests[digest] = body
        while len(self._manifests) > _KEEP_MANIFESTS:
            self._manifests.popitem(last=False)
        return Descriptor(media_type=media_type, digest=digest, size=len(body))

@dataclass(frozen=True)
class RangeAnswer:
    """A registry's answer to a Range request: ``status`` 206 (the ranges, as
    ``content_type`` multipart/byteranges or one ``content_range``) or 200 (ranges
    ignored: the whole blob)."""

    status: int
    content_type: str
    content_range: str
    chunks: AsyncIterator[bytes]


async def _empty() -> AsyncIterator[bytes]:
    return
    yield


def _url(h: RegistryHost, ref: Reference, tail: str) -> str:
    url = f"{h.url}/{ref.path}/{tail}"
    if h.is_mirror and h.host != ref.domain:
        # Lets a mirror serving several upstreams know which one is meant (containerd's ns=).
        url += f"?ns={ref.domain}"
    return url


def _desc_from_head(headers: CIMultiDictProxy[str], ref: Reference) -> Descriptor | None:
    """A descriptor from HEAD headers alone, or None when they are not enough."""
    digest = headers.get("Docker-Content-Digest", "") or (ref.digest or "")
    media_type = headers.get("Content-Type", "").split(";", 1)[0].strip()
    length = headers.get("Content-Length", "")
    if (media_type in _GENERIC_TYPES or media_type not in oci.INDEX_TYPES | oci.MANIFEST_TYPES
            or not length.isdigit()):
        return None
    try:
        oci.validate_digest(digest)
    except InvalidArgument:
        return None
    if ref.digest is not None and digest != ref.digest:
        raise DataLoss(f"image '{ref}': the registry resolved it to {digest}")
    size = int(length)
    if size > MAX_MANIFEST_SIZE:
        raise DataLoss(f"image '{ref}': the manifest is {size} bytes, more than the "
                       f"{MAX_MANIFEST_SIZE} allowed")
    return Descriptor(media_type=media_type, digest=digest, size=size)


