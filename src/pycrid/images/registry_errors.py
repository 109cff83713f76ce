"""What a registry's non-success answer means: an error kind, and the registry's own words.

The distribution spec's error body (``{"errors": [{"code", "message"}]}``) is read when
there is one; its codes decide the kind as much as the HTTP status does.
"""

from __future__ import annotations

import contextlib
import json
from typing import Any, NoReturn

import aiohttp

from pycrid.errors import (
    DataLoss,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    RegistryUnavailable,
    Unauthenticated,
    Unavailable,
)
from pycrid.images.hosts import RegistryHost
from pycrid.images.reference import Reference

_ERROR_BODY_MAX = 64 << 10


async def fail(
    resp: aiohttp.ClientResponse, h: RegistryHost, ref: Reference, what: str,
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
        raise RegistryUnavailable(
            f"registry {h.host} failed with HTTP {status} for {thing}{suffix}")
    if status == 400 and {"NAME_INVALID", "TAG_INVALID", "DIGEST_INVALID"} & set(codes):
        raise InvalidArgument(f"registry {h.host} refused {thing} as invalid{suffix}")
    raise Unavailable(f"registry {h.host} answered HTTP {status} for {thing}{suffix}")



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

