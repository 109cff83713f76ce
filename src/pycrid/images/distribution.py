"""A client of the OCI distribution API: resolve a reference, fetch manifests and blobs.

Each call tries the registry's endpoints in order (mirrors, then the server; see
``hosts``), answers one authentication challenge per endpoint, and turns every
failure into an error kind whose message names the image and the registry: a
person reading ``crictl pull`` output should know what to fix without a packet
capture. Resolving an image already present costs one HEAD when the registry
cooperates; a manifest fetched by GET while resolving is kept for the fetch that
follows, so it is not downloaded twice.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import ssl
from collections import OrderedDict
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from typing import Any, NoReturn, TypeVar

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
from pycrid.images.auth import Authorizer, Credentials, parse_www_authenticate
from pycrid.images.hosts import CAP_PULL, CAP_RESOLVE, RegistryHost, RegistryHosts
from pycrid.images.manifest import detect_media_type
from pycrid.images.mediatypes import Descriptor
from pycrid.images.reference import Reference

log = logging.getLogger(__name__)

T = TypeVar("T")

MAX_MANIFEST_SIZE = 4 << 20
_ERROR_BODY_MAX = 64 << 10
_CHUNK = 1 << 20
_KEEP_MANIFESTS = 16
_GENERIC_TYPES = frozenset({"", "application/json", "application/octet-stream", "text/plain"})


class _TLSHandshakeFailed(Exception):
    """Internal: https to a loopback host failed in a way plain http may fix."""


class RegistryClient:
    def __init__(
        self, hosts: RegistryHosts, *, user_agent: str = "pycrid/0.1", timeout: float = 30.0
    ) -> None:
        self.hosts = hosts
        self.user_agent = user_agent
        self.timeout = timeout
        # One session; each request names its host's SSL context, and aiohttp pools
        # connections per (host, port, context), so TLS configs never mix.
        self._session: aiohttp.ClientSession | None = None
        self._auth = Authorizer(user_agent=user_agent, timeout=timeout)
        self._plain_http: set[str] = set()  # loopback hosts found to speak http only
        self._manifests: OrderedDict[str, bytes] = OrderedDict()

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    def _get_session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                headers={"User-Agent": self.user_agent},
                # A registry's storage redirect must not pick up our cookies or env proxies
                # by surprise; auth headers are dropped by aiohttp on cross-origin redirects.
                cookie_jar=aiohttp.DummyCookieJar(),
                # Blob bodies are handed to unpack threads: a larger read buffer means
                # larger chunks (fewer loop iterations and hand-overs) when they lag.
                read_bufsize=_CHUNK,
            )
        return self._session

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
                    await self._fail(resp, h, ref, "manifest")
            async with self._open(h, ref, "GET", url, headers, creds, limits) as resp:
                if resp.status != 200:
                    await self._fail(resp, h, ref, "manifest")
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
                    await self._fail(resp, h, ref, "manifest", desc.digest)
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

    # ---- blobs -------------------------------------------------------------------------

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
        limits = aiohttp.ClientTimeout(total=None, sock_connect=self.timeout,
                                       sock_read=self.timeout)

        async def one(h: RegistryHost) -> tuple[aiohttp.ClientResponse, RegistryHost]:
            url = _url(h, ref, f"blobs/{desc.digest}")
            resp = await self._request(h, ref, "GET", url, headers, creds, limits)
            if resp.status == 200 or (offset and resp.status == 206):
                return resp, h
            try:
                await self._fail(resp, h, ref, "blob", desc.digest)
            finally:
                resp.release()

        resp, host = await self._each_host(ref, CAP_PULL, one)
        # A registry that ignored the Range answers 200 with the whole blob: skip ahead.
        skip = offset if resp.status == 200 else 0
        chunks = self._chunks(resp, host, ref, desc, offset, skip)
        try:
            yield chunks
        finally:
            await chunks.aclose()
            resp.close()

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
        resp = await self._request(h, ref, method, url, headers, creds, limits)
        try:
            yield resp
        finally:
            resp.release()

    async def _request(
        self, h: RegistryHost, ref: Reference, method: str, url: str, headers: dict[str, str],
        creds: Credentials | None, limits: aiohttp.ClientTimeout,
    ) -> aiohttp.ClientResponse:
        """Send one request, trying plain http for a loopback host whose TLS fails."""
        if h.http_fallback and h.host in self._plain_http:
            h, url = _plain(h, url)
        try:
            return await self._authorized(h, ref, method, url, headers, creds, limits)
        except _TLSHandshakeFailed:
            ph, purl = _plain(h, url)
            log.info("registry %s does not speak TLS; using plain http", h.host)
            resp = await self._authorized(ph, ref, method, purl, headers, creds, limits)
            self._plain_http.add(h.host)
            return resp

    async def _authorized(
        self, h: RegistryHost, ref: Reference, method: str, url: str, headers: dict[str, str],
        creds: Credentials | None, limits: aiohttp.ClientTimeout,
    ) -> aiohttp.ClientResponse:
        """Send with what we know of the host's auth; on 401 answer the challenge once."""
        scope = f"repository:{ref.path}:pull"
        sent = await self._auth_header(h, ref, scope, creds)
        resp = await self._send(h, ref, method, url, headers, sent, limits)
        if resp.status != 401:
            return resp
        challenges = parse_www_authenticate(resp.headers.getall("WWW-Authenticate", []))
        resp.release()
        if creds is not None and creds.registry_token:
            raise Unauthenticated(f"image '{ref}': registry {h.host} rejected the registry token")
        if self._auth.remember(h.host, challenges) is None:
            raise Unauthenticated(
                f"image '{ref}': registry {h.host} requires authentication with a scheme "
                "pycrid does not support" if challenges else
                f"image '{ref}': registry {h.host} answered 401 without a challenge")
        if sent is not None:
            self._auth.forget(h.host, scope, creds)
        auth = await self._auth_header(h, ref, scope, creds)
        if auth is None:
            raise Unauthenticated(
                f"image '{ref}': registry {h.host} requires credentials, and none were given")
        if auth == sent and auth.startswith("Basic "):
            raise _rejected(h, ref, creds)
        resp = await self._send(h, ref, method, url, headers, auth, limits)
        if resp.status == 401:
            resp.release()
            raise _rejected(h, ref, creds)
        return resp

    async def _auth_header(
        self, h: RegistryHost, ref: Reference, scope: str, creds: Credentials | None
    ) -> str | None:
        try:
            return await self._auth.header(self._get_session(), h.host, scope, creds, h.ssl)
        except PycridError as e:
            raise type(e)(f"image '{ref}': {e}") from None

    async def _send(
        self, h: RegistryHost, ref: Reference, method: str, url: str, headers: dict[str, str],
        auth: str | None, limits: aiohttp.ClientTimeout,
    ) -> aiohttp.ClientResponse:
        hdrs = dict(h.headers)
        hdrs.update(headers)
        if auth is not None:
            hdrs["Authorization"] = auth
        ssl_arg: ssl.SSLContext | bool = h.ssl if h.ssl is not None else True
        try:
            return await self._get_session().request(
                method, url, headers=hdrs, ssl=ssl_arg, timeout=limits,
                allow_redirects=method == "GET")
        except TimeoutError:
            raise DeadlineExceeded(
                f"image '{ref}': registry {h.host} did not answer within {self.timeout:g}s"
            ) from None
        except aiohttp.ClientConnectorCertificateError as e:
            raise Unavailable(
                f"image '{ref}': TLS certificate problem with registry {h.host}: "
                f"{_cert_reason(e)} (configure its CA in hosts.toml, or skip_verify)"
            ) from None
        except aiohttp.ClientSSLError as e:
            if h.http_fallback:
                raise _TLSHandshakeFailed() from e
            raise Unavailable(
                f"image '{ref}': TLS handshake with registry {h.host} failed (a certificate "
                f"or protocol problem): {_os_reason(e)}") from None
        except aiohttp.ClientConnectorDNSError:
            raise Unavailable(
                f"image '{ref}': cannot resolve the registry host name {h.host}") from None
        except aiohttp.ClientConnectorError as e:
            raise Unavailable(
                f"image '{ref}': cannot connect to registry {h.host}: {_os_reason(e)}") from None
        except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError) as e:
            if h.http_fallback and h.scheme == "https":
                raise _TLSHandshakeFailed() from e
            raise Unavailable(
                f"image '{ref}': registry {h.host} closed the connection "
                f"({type(e).__name__}); if it requires a client certificate, check the "
                "client certificate configured in hosts.toml") from None
        except aiohttp.TooManyRedirects:
            raise Unavailable(f"image '{ref}': registry {h.host} redirected too often") from None
        except aiohttp.ClientError as e:
            raise Unavailable(
                f"image '{ref}': request to registry {h.host} failed: {type(e).__name__}"
            ) from None

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

    async def _fail(
        self, resp: aiohttp.ClientResponse, h: RegistryHost, ref: Reference, what: str,
        digest: str = "",
    ) -> NoReturn:
        """Raise the error kind for a non-success answer, reading the registry's error body."""
        codes: list[str] = []
        detail = ""
        if resp.method != "HEAD":
            with contextlib.suppress(Exception):
                codes, detail = _error_codes(await resp.content.read(_ERROR_BODY_MAX))
        status = resp.status
        thing = f"{what} {digest} of image '{ref}'" if digest else f"image '{ref}'"
        suffix = f": {detail}" if detail else ""
        if status == 404 or {"MANIFEST_UNKNOWN", "NAME_UNKNOWN", "BLOB_UNKNOWN"} & set(codes):
            raise NotFound(f"{thing} not found in registry {h.host}{suffix}")
        if status == 403 or "DENIED" in codes:
            raise PermissionDenied(f"registry {h.host} denied access to {thing}{suffix}")
        if status == 401 or "UNAUTHORIZED" in codes:
            raise Unauthenticated(f"registry {h.host} requires credentials for {thing}{suffix}")
        if status == 429 or "TOOMANYREQUESTS" in codes:
            raise Unavailable(f"registry {h.host} is rate limiting requests for {thing}{suffix}")
        if status == 416:
            raise DataLoss(f"registry {h.host} cannot serve the requested range of {thing}")
        if 500 <= status:
            raise Unavailable(f"registry {h.host} failed with HTTP {status} for {thing}{suffix}")
        if status == 400 and {"NAME_INVALID", "TAG_INVALID", "DIGEST_INVALID"} & set(codes):
            raise InvalidArgument(f"registry {h.host} refused {thing} as invalid{suffix}")
        raise Unavailable(f"registry {h.host} answered HTTP {status} for {thing}{suffix}")


async def _empty() -> AsyncIterator[bytes]:
    return
    yield


def _rejected(h: RegistryHost, ref: Reference, creds: Credentials | None) -> Unauthenticated:
    if creds:
        return Unauthenticated(f"image '{ref}': registry {h.host} rejected the credentials")
    return Unauthenticated(
        f"image '{ref}': registry {h.host} requires credentials, and none were given")


def _url(h: RegistryHost, ref: Reference, tail: str) -> str:
    url = f"{h.url}/{ref.path}/{tail}"
    if h.is_mirror and h.host != ref.domain:
        # Lets a mirror serving several upstreams know which one is meant (containerd's ns=).
        url += f"?ns={ref.domain}"
    return url


def _plain(h: RegistryHost, url: str) -> tuple[RegistryHost, str]:
    if url.startswith("https://"):
        url = "http://" + url[len("https://"):]
    return dataclasses.replace(h, url="http://" + h.url.split("://", 1)[1], ssl=None,
                               http_fallback=False), url


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


def _error_codes(body: bytes) -> tuple[list[str], str]:
    """Codes and a short message from a distribution error body ``{"errors": [...]}``."""
    doc: Any = json.loads(body)
    errors = doc.get("errors") if isinstance(doc, dict) else None
    if not isinstance(errors, list):
        return [], ""
    codes, messages = [], []
    for e in errors:
        if isinstance(e, dict):
            code, msg = e.get("code"), e.get("message")
            if isinstance(code, str):
                codes.append(code.upper())
            if isinstance(msg, str) and msg:
                messages.append(msg[:200])
    return codes, "; ".join(messages[:3])


def _os_reason(e: aiohttp.ClientOSError) -> str:
    os_error = getattr(e, "os_error", None)
    if isinstance(os_error, OSError):
        if os_error.errno:
            return os.strerror(os_error.errno).lower()
        if os_error.strerror:
            return os_error.strerror
    return str(e.strerror or e) or type(e).__name__


def _cert_reason(e: aiohttp.ClientConnectorCertificateError) -> str:
    err = e.certificate_error
    reason = getattr(err, "verify_message", "") or getattr(err, "reason", "") or str(err)
    return str(reason)
