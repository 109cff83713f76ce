"""Fetching an image's signatures, where registries.d says they are.

Sigstore attachments come through the registry client itself, so the image's mirrors,
``hosts.toml``, TLS and credentials apply: the ``sha256-<hex>.sig`` tag of the image's
repository (missing: no signatures), an OCI manifest whose layers are the signatures.
A lookaside is read from ``file://`` or ``http(s)://`` until the first missing
``signature-N`` (containers/image's rule); an https lookaside uses the CA of its
host's ``hosts.toml`` when there is one. Every fetch has a limit (4 MiB a signature,
128 of them: containers/image's) and a deadline.
"""

from __future__ import annotations

import asyncio
import json
import os
import ssl
from urllib.parse import unquote, urlsplit

import aiohttp

from pycrid.errors import NotFound, PycridError
from pycrid.images.auth import Credentials
from pycrid.images.distribution import RegistryClient
from pycrid.images.hosts import RegistryHosts
from pycrid.images.mediatypes import MT_OCI_MANIFEST, Descriptor, sha256_digest
from pycrid.images.policy import payload as pl
from pycrid.images.policy.names import Named
from pycrid.images.policy.registries_d import RegistriesD, signature_url
from pycrid.images.reference import Reference

MAX_SIGNATURE = 4 << 20
MAX_SIGNATURES = 128


class SignatureFetchError(PycridError):
    """The signatures could not be read (the message says from where and why)."""


class SignatureSource:
    def __init__(self, client: RegistryClient, hosts: RegistryHosts | None,
                 timeout: float = 30.0) -> None:
        self.client = client
        self.hosts = hosts
        self.timeout = timeout
        self._session: aiohttp.ClientSession | None = None

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def fetch(self, ref: Reference, digest: str, creds: Credentials | None,
                    config: RegistriesD) -> list[pl.Signature]:
        """Every signature of the manifest ``digest`` of ``ref``'s repository."""
        named = Named.of(ref)
        sigs = await self._lookaside(config.lookaside(named), digest)
        if config.use_sigstore_attachments(named):
            sigs += await self._attachments(ref, digest, creds)
        return sigs

    # ---- sigstore attachments ----------------------------------------------------------

    async def _attachments(self, ref: Reference, digest: str, creds: Credentials | None
                           ) -> list[pl.Signature]:
        tag = digest.replace(":", "-", 1) + ".sig"
        sig_ref = Reference(ref.domain, ref.path, tag=tag)
        try:
            desc = await self.client.resolve(sig_ref, creds)
        except NotFound:
            return []
        if desc.media_type != MT_OCI_MANIFEST:
            raise SignatureFetchError(f"the sigstore attachment {sig_ref} is a "
                                      f"{desc.media_type or 'document of no media type'}, "
                                      "not an OCI image manifest")
        data = await self.client.fetch_manifest(sig_ref, desc, creds)
        try:
            layers = [Descriptor.from_json(x) for x in json.loads(data)["layers"]]
        except (ValueError, KeyError, TypeError, PycridError) as e:
            raise SignatureFetchError(f"the sigstore attachment {sig_ref} is not a valid "
                                      f"manifest: {e}") from None
        if len(layers) > MAX_SIGNATURES:
            raise SignatureFetchError(f"the sigstore attachment {sig_ref} has {len(layers)} "
                                      f"layers, more than the {MAX_SIGNATURES} allowed")
        out: list[pl.Signature] = []
        for layer in layers:
            if layer.size > MAX_SIGNATURE:
                raise SignatureFetchError(
                    f"signature {layer.digest} in {sig_ref} is {layer.size} bytes, more than "
                    f"the {MAX_SIGNATURE} allowed")
            body = await asyncio.wait_for(self._blob(sig_ref, layer, creds), self.timeout)
            if sha256_digest(body) != layer.digest:
                raise SignatureFetchError(f"signature {layer.digest} in {sig_ref}: digest "
                                          f"mismatch ({sha256_digest(body)})")
            out.append(pl.Sigstore(layer.media_type, body, dict(layer.annotations)))
        return out

    async def _blob(self, ref: Reference, desc: Descriptor, creds: Credentials | None) -> bytes:
        body = b""
        async with self.client.fetch_blob(ref, desc, creds) as chunks:
            async for chunk in chunks:
                body += chunk
                if len(body) > desc.size:
                    raise SignatureFetchError(f"signature {desc.digest} of {ref} is longer "
                                              f"than its {desc.size} bytes")
        return body

    # ---- lookaside ---------------------------------------------------------------------

    async def _lookaside(self, base: str, digest: str) -> list[pl.Signature]:
        out: list[pl.Signature] = []
        for i in range(1, MAX_SIGNATURES + 1):
            url = signature_url(base, digest, i)
            try:
                if url.startswith("file://"):
                    blob = await asyncio.to_thread(_read_file, unquote(urlsplit(url).path))
                else:
                    blob = await asyncio.wait_for(self._get(url), self.timeout)
            except TimeoutError:
                raise SignatureFetchError(f"lookaside {url} did not answer within "
                                          f"{self.timeout:g}s") from None
            if blob is None:
                return out
            try:
                out.append(pl.from_blob(blob))
            except pl.InvalidSignature as e:
                raise SignatureFetchError(f"parsing signature {url}: {e}") from None
        raise SignatureFetchError(f"lookaside {base} has more than {MAX_SIGNATURES} "
                                  f"signatures of {digest}; assuming a server error")

    async def _get(self, url: str) -> bytes | None:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(cookie_jar=aiohttp.DummyCookieJar())
        try:
            async with self._session.get(url, ssl=self._ssl(url)) as resp:
                if resp.status == 404:
                    return None
                if resp.status != 200:
                    raise SignatureFetchError(f"reading signature from {url}: HTTP "
                                              f"{resp.status}")
                # read(n) returns what has arrived, up to n: read until the end or the limit.
                body = b""
                while len(body) <= MAX_SIGNATURE:
                    chunk = await resp.content.read(MAX_SIGNATURE + 1 - len(body))
                    if not chunk:
                        break
                    body += chunk
        except aiohttp.ClientError as e:
            raise SignatureFetchError(f"reading signature from {url}: {type(e).__name__}: "
                                      f"{e}") from None
        if len(body) > MAX_SIGNATURE:
            raise SignatureFetchError(f"signature {url} is larger than {MAX_SIGNATURE} bytes")
        return body

    def _ssl(self, url: str) -> ssl.SSLContext | bool:
        parts = urlsplit(url)
        if parts.scheme != "https" or self.hosts is None:
            return True
        for h in self.hosts.hosts_for(parts.netloc):
            if h.ssl is not None and h.host == parts.netloc:
                return h.ssl
        return True


def _read_file(path: str) -> bytes | None:
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_SIGNATURE + 1)
    except FileNotFoundError:
        return None
    except OSError as e:
        raise SignatureFetchError(f"reading signature {path}: {os.strerror(e.errno or 0)}"
                                  ) from None
    if len(data) > MAX_SIGNATURE:
        raise SignatureFetchError(f"signature {path} is larger than {MAX_SIGNATURE} bytes")
    return data
