"""Registry authentication: the credentials the kubelet hands over, challenges, tokens.

A registry answers 401 with a ``WWW-Authenticate`` challenge: ``Basic`` wants the
username and password on every request; ``Bearer`` names a token service (realm)
that trades credentials (or nothing, for public images) for a short-lived token
scoped to one repository. Tokens are cached per host, scope and credentials, so a
second pull from the same repository goes straight to the registry.

Secrets never appear in a message, a log line or a repr.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import logging
import ssl
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from pycrid.errors import DeadlineExceeded, InvalidArgument, Unauthenticated, Unavailable

log = logging.getLogger(__name__)

#: Token lifetime when the token service does not say (the Docker token spec's default).
DEFAULT_TOKEN_TTL = 60.0
#: Refresh this long before a token expires, so a request never carries a stale one.
_EXPIRY_MARGIN = 5.0
_CLIENT_ID = "pycrid"
#: The clock token lifetimes are measured on (a name of its own, so tests can move it).
_clock = time.monotonic


@dataclass
class Credentials:
    """What the CRI's ``AuthConfig`` carries; ``repr`` shows which fields are set, never values."""

    username: str = field(default="", repr=False)
    password: str = field(default="", repr=False)
    identity_token: str = field(default="", repr=False)
    registry_token: str = field(default="", repr=False)

    @classmethod
    def from_cri(
        cls, username: str = "", password: str = "", auth: str = "",
        identity_token: str = "", registry_token: str = "",
    ) -> Credentials:
        """Build from AuthConfig fields; ``auth`` is base64 ``user:password`` and wins."""
        if auth:
            try:
                raw = base64.b64decode(auth.strip(), validate=True).decode("utf-8")
            except (binascii.Error, ValueError):
                raise InvalidArgument(
                    "auth config: 'auth' is not valid base64 of 'username:password'") from None
            user, sep, pw = raw.partition(":")
            if not sep:
                raise InvalidArgument(
                    "auth config: 'auth' decodes to a value without ':' "
                    "(want base64 of 'username:password')")
            username, password = user, pw
        return cls(username=username, password=password,
                   identity_token=identity_token, registry_token=registry_token)

    @property
    def has_basic(self) -> bool:
        return bool(self.username or self.password)

    def __bool__(self) -> bool:
        return bool(self.username or self.password or self.identity_token or self.registry_token)

    def fingerprint(self) -> str:
        """A cache key that tells credentials apart without keeping them readable."""
        h = hashlib.sha256()
        for part in (self.username, self.password, self.identity_token, self.registry_token):
            h.update(part.encode())
            h.update(b"\0")
        return h.hexdigest()[:32]

    def __repr__(self) -> str:
        set_ = [n for n in ("username", "password", "identity_token", "registry_token")
                if getattr(self, n)]
        return f"Credentials(set={set_})"


# ---- WWW-Authenticate ------------------------------------------------------------------


@dataclass(frozen=True)
class Challenge:
    scheme: str  # lowercased: "basic", "bearer", ...
    params: Mapping[str, str]  # parameter names lowercased

    @property
    def realm(self) -> str:
        return self.params.get("realm", "")


_TCHAR = frozenset("!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")
_TOKEN68 = _TCHAR | frozenset("/=")


class _Scanner:
    """A cursor over one header value (RFC 9110 §11.6.1 grammar, leniently)."""

    def __init__(self, s: str) -> None:
        self.s, self.i = s, 0

    def ws(self) -> None:
        while self.i < len(self.s) and self.s[self.i] in " \t":
            self.i += 1

    def peek(self) -> str:
        return self.s[self.i] if self.i < len(self.s) else ""

    def token(self, chars: frozenset[str] = _TCHAR) -> str:
        start = self.i
        while self.i < len(self.s) and self.s[self.i] in chars:
            self.i += 1
        return self.s[start:self.i]

    def quoted(self) -> str:
        self.i += 1  # the opening quote
        out: list[str] = []
        while self.i < len(self.s):
            c = self.s[self.i]
            self.i += 1
            if c == "\\" and self.i < len(self.s):
                out.append(self.s[self.i])
                self.i += 1
            elif c == '"':
                return "".join(out)
            else:
                out.append(c)
        return "".join(out)  # unterminated: take what there is

    def skip_commas(self) -> None:
        while True:
            self.ws()
            if self.peek() != ",":
                return
            self.i += 1


def parse_www_authenticate(values: str | list[str]) -> list[Challenge]:
    """Every challenge in one or more ``WWW-Authenticate`` values, in order.

    Handles several challenges in one value, quoted strings holding commas and
    backslash escapes, and the token68 form; junk is skipped rather than raised,
    since the caller only needs the challenges it understands.
    """
    out: list[Challenge] = []
    for value in [values] if isinstance(values, str) else values:
        sc = _Scanner(value)
        while True:
            sc.skip_commas()
            if sc.i >= len(sc.s):
                break
            scheme = sc.token()
            if not scheme:
                sc.i += 1  # not a token character: skip it
                continue
            params: dict[str, str] = {}
            sc.ws()
            if not _looks_like_param(sc.s, sc.i):
                # Either no parameters, or a token68 blob such as "Negotiate abc==".
                start = sc.i
                blob = sc.token(_TOKEN68)
                sc.ws()
                if blob and sc.peek() in ("", ","):
                    params[""] = blob
                else:
                    sc.i = start  # what follows is the next challenge
                out.append(Challenge(scheme.lower(), params))
                continue
            while True:
                sc.skip_commas()
                save = sc.i
                name = sc.token()
                sc.ws()
                if not name or sc.peek() != "=":
                    sc.i = save  # the next challenge's scheme (or junk)
                    break
                sc.i += 1
                sc.ws()
                value_ = sc.quoted() if sc.peek() == '"' else sc.token()
                params.setdefault(name.lower(), value_)
            out.append(Challenge(scheme.lower(), params))
    return out


def _looks_like_param(s: str, start: int) -> bool:
    """Whether ``name = value`` starts at ``start`` (so it is not a token68 blob)."""
    sc = _Scanner(s)
    sc.i = start
    name = sc.token()
    sc.ws()
    if not name or sc.peek() != "=":
        return False
    sc.i += 1
    sc.ws()
    return sc.peek() not in ("", ",", "=")


# ---- tokens ------------------------------------------------------------------------------


def basic_header(username: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{username}:{password}".encode()).decode()


@dataclass(frozen=True)
class _Token:
    value: str
    expires: float  # on _clock


class Authorizer:
    """Answers challenges for a client: remembers them per host and caches bearer tokens.

    Once a host has challenged, later requests to it carry authorization up front, so
    a registry that cooperates costs one round trip per manifest or blob.
    """

    def __init__(self, *, user_agent: str = "pycrid", timeout: float = 30.0) -> None:
        self.user_agent = user_agent
        self.timeout = timeout
        self._challenges: dict[str, Challenge] = {}
        self._tokens: dict[tuple[str, str, str, str], _Token] = {}

    def challenge_for(self, host: str) -> Challenge | None:
        return self._challenges.get(host)

    def remember(self, host: str, challenges: list[Challenge]) -> Challenge | None:
        """Keep the challenge we can answer (Bearer preferred); None if there is none."""
        for scheme in ("bearer", "basic"):
            for c in challenges:
                if c.scheme == scheme:
                    self._challenges[host] = c
                    return c
        return None

    def forget(self, host: str, scope: str, creds: Credentials | None) -> None:
        """Drop a token the registry has just refused (it may have been revoked)."""
        c = self._challenges.get(host)
        if c is not None:
            self._tokens.pop(self._key(c, scope, creds), None)

    def _key(
        self, c: Challenge, scope: str, creds: Credentials | None
    ) -> tuple[str, str, str, str]:
        return (c.realm, c.params.get("service", ""), scope,
                creds.fingerprint() if creds else "")

    async def header(
        self, session: aiohttp.ClientSession, host: str, scope: str, creds: Credentials | None,
        tls: ssl.SSLContext | None = None,
    ) -> str | None:
        """The Authorization value for a request to ``host``, or None to send none.

        ``scope`` is the one this request needs (``repository:<path>:pull``); ``tls`` is the
        registry's context, used for the token service too (it may share a private CA).
        """
        if creds is not None and creds.registry_token:
            return f"Bearer {creds.registry_token}"
        c = self._challenges.get(host)
        if c is None:
            return None
        if c.scheme == "basic":
            if creds is None or not creds.has_basic:
                return None
            return basic_header(creds.username, creds.password)
        key = self._key(c, scope, creds)
        tok = self._tokens.get(key)
        if tok is not None and tok.expires > _clock():
            return f"Bearer {tok.value}"
        tok = await self._fetch_token(session, host, c, scope, creds, tls)
        self._tokens[key] = tok
        return f"Bearer {tok.value}"

    async def _fetch_token(
        self, session: aiohttp.ClientSession, host: str, c: Challenge, scope: str,
        creds: Credentials | None, tls: ssl.SSLContext | None,
    ) -> _Token:
        realm = c.realm
        if not realm.startswith(("https://", "http://")):
            raise Unavailable(f"registry {host} sent a bearer challenge without a usable realm")
        scopes = _scopes(c.params.get("scope", ""), scope)
        service = c.params.get("service", "")
        try:
            if creds is not None and creds.identity_token:
                resp = await self._post_refresh(session, realm, service, scopes, creds, tls)
                if resp is None:  # the token service has no OAuth endpoint: try GET
                    resp = await self._get(session, realm, service, scopes, creds, tls)
            else:
                resp = await self._get(session, realm, service, scopes, creds, tls)
        except TimeoutError:
            raise DeadlineExceeded(
                f"token service {_origin(realm)} for registry {host} did not answer "
                f"within {self.timeout:g}s") from None
        except aiohttp.ClientError as e:
            raise Unavailable(
                f"cannot reach token service {_origin(realm)} for registry {host}: "
                f"{type(e).__name__}: {e}") from None
        status, body = resp
        if status in (401, 403):
            if creds:
                raise Unauthenticated(
                    f"registry {host}: the token service {_origin(realm)} rejected the "
                    "credentials")
            raise Unauthenticated(
                f"registry {host} requires credentials (its token service {_origin(realm)} "
                "refused anonymous access)")
        if status != 200:
            raise Unavailable(
                f"registry {host}: token service {_origin(realm)} answered HTTP {status}")
        return _parse_token(body, host)

    async def _get(
        self, session: aiohttp.ClientSession, realm: str, service: str, scopes: list[str],
        creds: Credentials | None, tls: ssl.SSLContext | None,
    ) -> tuple[int, bytes]:
        params: list[tuple[str, str]] = []
        if service:
            params.append(("service", service))
        params += [("scope", s) for s in scopes]
        headers = {"User-Agent": self.user_agent}
        if creds is not None and creds.has_basic:
            headers["Authorization"] = basic_header(creds.username, creds.password)
            # Ask for a refresh token too, like docker login does; harmless when ignored.
            params.append(("offline_token", "true"))
            params.append(("client_id", _CLIENT_ID))
        async with session.get(realm, params=params, headers=headers, ssl=tls or True,
                               timeout=aiohttp.ClientTimeout(total=self.timeout)) as r:
            return r.status, await r.content.read(1 << 20)

    async def _post_refresh(
        self, session: aiohttp.ClientSession, realm: str, service: str, scopes: list[str],
        creds: Credentials, tls: ssl.SSLContext | None,
    ) -> tuple[int, bytes] | None:
        form = {"grant_type": "refresh_token", "refresh_token": creds.identity_token,
                "service": service, "scope": " ".join(scopes), "client_id": _CLIENT_ID}
        async with session.post(realm, data=form, headers={"User-Agent": self.user_agent},
                                ssl=tls or True,
                                timeout=aiohttp.ClientTimeout(total=self.timeout)) as r:
            if r.status in (404, 405):
                return None
            return r.status, await r.content.read(1 << 20)


def _origin(url: str) -> str:
    """scheme://host of a URL: never its query, which may hold something private."""
    scheme, _, rest = url.partition("://")
    return f"{scheme}://{rest.split('/', 1)[0].split('?', 1)[0]}"


def _scopes(challenge_scope: str, ours: str) -> list[str]:
    out: list[str] = []
    for s in [*challenge_scope.split(" "), ours]:
        if s and s not in out:
            out.append(s)
    return out


def _parse_token(body: bytes, host: str) -> _Token:
    try:
        doc: Any = json.loads(body)
    except ValueError:
        doc = None
    if not isinstance(doc, dict):
        raise Unavailable(f"registry {host}: the token service answered something not JSON")
    value = doc.get("token") or doc.get("access_token")
    if not isinstance(value, str) or not value:
        raise Unavailable(f"registry {host}: the token service answered without a token")
    ttl = doc.get("expires_in")
    if not isinstance(ttl, int | float) or isinstance(ttl, bool) or ttl <= 0:
        ttl = DEFAULT_TOKEN_TTL
    ttl = max(float(ttl) - _EXPIRY_MARGIN, 1.0)
    return _Token(value=value, expires=_clock() + ttl)
