"""Requests to a registry host: one session, authentication, and transport failures
told in words.

Every request answers one authentication challenge (a 401 with ``WWW-Authenticate``),
falls back to plain http for a loopback host whose TLS fails, and turns every transport
failure into an error kind whose message names the image and the registry.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import ssl

import aiohttp

from pycrid.errors import (
    DeadlineExceeded,
    PycridError,
    RegistryUnavailable,
    Unauthenticated,
    Unavailable,
)
from pycrid.images.auth import Authorizer, Credentials, parse_www_authenticate
from pycrid.images.hosts import RegistryHost
from pycrid.images.reference import Reference

log = logging.getLogger(__name__)

_CHUNK = 1 << 20


class _TLSHandshakeFailed(Exception):
    """Internal: https to a loopback host failed in a way plain http may fix."""


class RegistryHTTP:
    """The session and what was learnt of each host: its auth, whether it speaks TLS."""

    def __init__(self, *, user_agent: str, timeout: float) -> None:
        self.user_agent = user_agent
        self.timeout = timeout
        # One session; each request names its host's SSL context, and aiohttp pools
        # connections per (host, port, context), so TLS configs never mix.
        self._session: aiohttp.ClientSession | None = None
        self._auth = Authorizer(user_agent=user_agent, timeout=timeout)
        self._plain_http: set[str] = set()  # loopback hosts found to speak http only

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

    async def request(
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
            raise RegistryUnavailable(
                f"image '{ref}': cannot resolve the registry host name {h.host}") from None
        except aiohttp.ClientConnectorError as e:
            raise RegistryUnavailable(
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

def _rejected(h: RegistryHost, ref: Reference, creds: Credentials | None) -> Unauthenticated:
    if creds:
        return Unauthenticated(f"image '{ref}': registry {h.host} rejected the credentials")
    return Unauthenticated(
        f"image '{ref}': registry {h.host} requires credentials, and none were given")


def _plain(h: RegistryHost, url: str) -> tuple[RegistryHost, str]:
    if url.startswith("https://"):
        url = "http://" + url[len("https://"):]
    return dataclasses.replace(h, url="http://" + h.url.split("://", 1)[1], ssl=None,
                               http_fallback=False), url


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
