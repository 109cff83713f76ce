"""Credentials, WWW-Authenticate parsing and the bearer token flow (against a tiny server)."""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from hypothesis import given
from hypothesis import strategies as st

from pycrid.errors import InvalidArgument, Unauthenticated, Unavailable
from pycrid.images import auth
from pycrid.images.auth import Authorizer, Challenge, Credentials, parse_www_authenticate

# ---- credentials --------------------------------------------------------------------------


def test_from_cri_plain() -> None:
    c = Credentials.from_cri(username="u", password="p")
    assert (c.username, c.password, c.identity_token, c.registry_token) == ("u", "p", "", "")
    assert c.has_basic and bool(c)


def test_from_cri_auth_field_wins() -> None:
    a = base64.b64encode(b"alice:pa:ss").decode()
    c = Credentials.from_cri(username="x", password="y", auth=a)
    assert (c.username, c.password) == ("alice", "pa:ss")


def test_from_cri_tokens() -> None:
    c = Credentials.from_cri(identity_token="idt", registry_token="rt")
    assert c.identity_token == "idt" and c.registry_token == "rt" and not c.has_basic
    assert not Credentials.from_cri()


@pytest.mark.parametrize("bad", ["%%%", "YWxpY2U", base64.b64encode(b"nocolon").decode(),
                                 base64.b64encode(b"\xff\xfe:x").decode()])
def test_from_cri_bad_auth(bad: str) -> None:
    with pytest.raises(InvalidArgument, match="auth"):
        Credentials.from_cri(auth=bad)


def test_secrets_not_in_repr() -> None:
    c = Credentials("user1", "hunter2", "idtok", "regtok")
    r = repr(c)
    for secret in ("user1", "hunter2", "idtok", "regtok"):
        assert secret not in r
    assert "password" in r


def test_fingerprint_distinguishes() -> None:
    a = Credentials("a", "b").fingerprint()
    assert a == Credentials("a", "b").fingerprint()
    assert a != Credentials("a", "c").fingerprint()
    assert Credentials("ab", "").fingerprint() != Credentials("a", "b").fingerprint()
    assert "b" * 3 not in a


# ---- WWW-Authenticate ---------------------------------------------------------------------


def ch(scheme: str, **params: str) -> Challenge:
    return Challenge(scheme, params)


@pytest.mark.parametrize("header, want", [
    ('Bearer realm="https://auth.docker.io/token",service="registry.docker.io",'
     'scope="repository:library/busybox:pull"',
     [ch("bearer", realm="https://auth.docker.io/token", service="registry.docker.io",
         scope="repository:library/busybox:pull")]),
    ('Basic realm="Registry Realm"', [ch("basic", realm="Registry Realm")]),
    ("basic realm=simple", [ch("basic", realm="simple")]),
    ("BASIC REALM=x", [ch("basic", realm="x")]),
    ('Bearer realm="a,b,c", service="s"', [ch("bearer", realm="a,b,c", service="s")]),
    (r'Bearer realm="say \"hi\"",service="back\\slash"',
     [ch("bearer", realm='say "hi"', service="back\\slash")]),
    ('Basic realm="r1", Bearer realm="r2",service="s2"',
     [ch("basic", realm="r1"), ch("bearer", realm="r2", service="s2")]),
    ('Bearer realm="r", scope="repository:a:pull repository:b:pull"',
     [ch("bearer", realm="r", scope="repository:a:pull repository:b:pull")]),
    ('Bearer realm="r",error="insufficient_scope",scope="x"',
     [ch("bearer", realm="r", error="insufficient_scope", scope="x")]),
    ("Bearer  realm = \"r\" ,  service = s ", [ch("bearer", realm="r", service="s")]),
    ("Basic", [ch("basic")]),
    ("Basic, Bearer realm=r", [ch("basic"), ch("bearer", realm="r")]),
    ("Negotiate abc123==", [Challenge("negotiate", {"": "abc123=="})]),
    ("Negotiate abc==, Basic realm=x",
     [Challenge("negotiate", {"": "abc=="}), ch("basic", realm="x")]),
    ('Bearer realm="unterminated', [ch("bearer", realm="unterminated")]),
    ('Bearer realm=""', [ch("bearer", realm="")]),
    ('Bearer realm="first", realm="second"', [ch("bearer", realm="first")]),
    ("", []),
    (",, ,", []),
    ('Bearer realm="r",,,service="s"', [ch("bearer", realm="r", service="s")]),
    ('Bearer realm="héllo"', [ch("bearer", realm="héllo")]),
])
def test_parse_challenges(header: str, want: list[Challenge]) -> None:
    assert parse_www_authenticate(header) == want


def test_parse_several_headers() -> None:
    got = parse_www_authenticate(['Basic realm="a"', 'Bearer realm="b"'])
    assert [c.scheme for c in got] == ["basic", "bearer"]
    assert got[1].realm == "b"


@given(st.text(max_size=120))
def test_parser_never_crashes(s: str) -> None:
    for c in parse_www_authenticate(s):
        assert c.scheme == c.scheme.lower() and c.scheme
        assert all(k == k.lower() for k in c.params)


_value = st.text(alphabet=st.characters(blacklist_categories=("Cs", "Cc")), max_size=30)


@given(st.dictionaries(st.sampled_from(["realm", "service", "scope", "error"]), _value,
                       min_size=1))
def test_quoted_values_roundtrip(params: dict[str, str]) -> None:
    def quote(v: str) -> str:
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'

    header = "Bearer " + ", ".join(f"{k}={quote(v)}" for k, v in params.items())
    [c] = parse_www_authenticate(header)
    assert dict(c.params) == params


# ---- tokens against a local token server --------------------------------------------------


class TokenService:
    def __init__(self) -> None:
        self.seen: list[dict[str, Any]] = []
        self.answer: dict[str, Any] = {"token": "tok-1", "expires_in": 300}
        self.status = 200
        self.post_status: int | None = None
        self.url = ""

    async def handle(self, request: web.Request) -> web.Response:
        form = dict(await request.post()) if request.method == "POST" else {}
        self.seen.append({
            "method": request.method, "query": request.query.getall("scope", []),
            "service": request.query.get("service"), "auth": request.headers.get("Authorization"),
            "form": form,
        })
        if request.method == "POST" and self.post_status is not None:
            return web.Response(status=self.post_status)
        return web.Response(status=self.status, body=json.dumps(self.answer),
                            content_type="application/json")


@pytest.fixture
async def token_service() -> AsyncIterator[TokenService]:
    svc = TokenService()
    app = web.Application()
    app.router.add_route("*", "/token", svc.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    svc.url = f"http://127.0.0.1:{port}/token"
    yield svc
    await runner.cleanup()


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as s:
        yield s


SCOPE = "repository:lib/x:pull"


def bearer(svc: TokenService, **extra: str) -> list[Challenge]:
    return [ch("bearer", realm=svc.url, service="reg", **extra)]


async def test_no_challenge_no_header(session: aiohttp.ClientSession) -> None:
    a = Authorizer()
    assert await a.header(session, "h", SCOPE, None) is None
    assert await a.header(session, "h", SCOPE, Credentials("u", "p")) is None


async def test_registry_token_sent_directly(session: aiohttp.ClientSession) -> None:
    a = Authorizer()
    assert await a.header(session, "h", SCOPE, Credentials(registry_token="rt")) == "Bearer rt"


async def test_basic(session: aiohttp.ClientSession) -> None:
    a = Authorizer()
    a.remember("h", [ch("basic", realm="r")])
    assert await a.header(session, "h", SCOPE, None) is None
    hdr = await a.header(session, "h", SCOPE, Credentials("u", "p:w"))
    assert hdr == "Basic " + base64.b64encode(b"u:p:w").decode()


async def test_bearer_preferred_over_basic(session: aiohttp.ClientSession,
                                           token_service: TokenService) -> None:
    a = Authorizer()
    c = a.remember("h", [ch("basic", realm="r"), *bearer(token_service)])
    assert c is not None and c.scheme == "bearer"
    assert a.remember("h2", [ch("negotiate")]) is None


async def test_anonymous_token(session: aiohttp.ClientSession,
                               token_service: TokenService) -> None:
    a = Authorizer()
    a.remember("h", bearer(token_service, scope="repository:lib/x:pull"))
    assert await a.header(session, "h", SCOPE, None) == "Bearer tok-1"
    [req] = token_service.seen
    assert req["method"] == "GET" and req["auth"] is None
    assert req["service"] == "reg" and req["query"] == [SCOPE]


async def test_token_with_basic_creds_and_cache(session: aiohttp.ClientSession,
                                                token_service: TokenService) -> None:
    a = Authorizer()
    a.remember("h", bearer(token_service, scope="repository:other:pull"))
    creds = Credentials("u", "p")
    assert await a.header(session, "h", SCOPE, creds) == "Bearer tok-1"
    req = token_service.seen[0]
    assert req["auth"] == "Basic " + base64.b64encode(b"u:p").decode()
    assert req["query"] == ["repository:other:pull", SCOPE]
    # Cached for the same scope and credentials...
    assert await a.header(session, "h", SCOPE, creds) == "Bearer tok-1"
    assert len(token_service.seen) == 1
    # ...but not across credentials or scopes.
    token_service.answer = {"access_token": "tok-2"}
    assert await a.header(session, "h", SCOPE, Credentials("v", "p")) == "Bearer tok-2"
    assert await a.header(session, "h", "repository:y:pull", creds) == "Bearer tok-2"
    assert len(token_service.seen) == 3


async def test_token_expiry(session: aiohttp.ClientSession, token_service: TokenService,
                            monkeypatch: pytest.MonkeyPatch) -> None:
    now = [1000.0]
    monkeypatch.setattr(auth, "_clock", lambda: now[0])
    a = Authorizer()
    a.remember("h", bearer(token_service))
    token_service.answer = {"token": "t"}  # no expires_in: the 60 s default
    await a.header(session, "h", SCOPE, None)
    now[0] += 50
    await a.header(session, "h", SCOPE, None)
    assert len(token_service.seen) == 1
    now[0] += 10
    await a.header(session, "h", SCOPE, None)
    assert len(token_service.seen) == 2
    token_service.answer = {"token": "t", "expires_in": 3600}
    now[0] += 100
    await a.header(session, "h", SCOPE, None)
    now[0] += 3000
    await a.header(session, "h", SCOPE, None)
    assert len(token_service.seen) == 3


async def test_forget_drops_token(session: aiohttp.ClientSession,
                                  token_service: TokenService) -> None:
    a = Authorizer()
    a.remember("h", bearer(token_service))
    await a.header(session, "h", SCOPE, None)
    a.forget("h", SCOPE, None)
    await a.header(session, "h", SCOPE, None)
    assert len(token_service.seen) == 2


async def test_identity_token_posts_refresh_grant(session: aiohttp.ClientSession,
                                                  token_service: TokenService) -> None:
    a = Authorizer()
    a.remember("h", bearer(token_service))
    token_service.answer = {"access_token": "oauth"}
    assert await a.header(session, "h", SCOPE, Credentials(identity_token="idt")) \
        == "Bearer oauth"
    [req] = token_service.seen
    assert req["method"] == "POST"
    assert req["form"]["grant_type"] == "refresh_token"
    assert req["form"]["refresh_token"] == "idt"
    assert req["form"]["service"] == "reg" and req["form"]["scope"] == SCOPE


async def test_identity_token_falls_back_to_get(session: aiohttp.ClientSession,
                                                token_service: TokenService) -> None:
    a = Authorizer()
    a.remember("h", bearer(token_service))
    token_service.post_status = 404
    assert await a.header(session, "h", SCOPE, Credentials(identity_token="i")) == "Bearer tok-1"
    assert [r["method"] for r in token_service.seen] == ["POST", "GET"]


@pytest.mark.parametrize("status, creds, kind, text", [
    (401, Credentials("u", "secret-pw"), Unauthenticated, "rejected the credentials"),
    (401, None, Unauthenticated, "requires credentials"),
    (403, None, Unauthenticated, "requires credentials"),
    (500, None, Unavailable, "HTTP 500"),
])
async def test_token_errors(session: aiohttp.ClientSession, token_service: TokenService,
                            status: int, creds: Credentials | None, kind: type[Exception],
                            text: str) -> None:
    a = Authorizer()
    a.remember("h", bearer(token_service))
    token_service.status = status
    with pytest.raises(kind, match=text) as e:
        await a.header(session, "h", SCOPE, creds)
    assert "secret-pw" not in str(e.value)


@pytest.mark.parametrize("answer", [{}, {"token": ""}, {"token": 5}, [1], "x"])
async def test_token_bad_answers(session: aiohttp.ClientSession, token_service: TokenService,
                                 answer: Any) -> None:
    a = Authorizer()
    a.remember("h", bearer(token_service))
    token_service.answer = answer
    with pytest.raises(Unavailable, match="token service"):
        await a.header(session, "h", SCOPE, None)


async def test_realm_unusable(session: aiohttp.ClientSession) -> None:
    a = Authorizer()
    a.remember("h", [ch("bearer", realm="not-a-url")])
    with pytest.raises(Unavailable, match="realm"):
        await a.header(session, "h", SCOPE, None)


async def test_token_service_unreachable(session: aiohttp.ClientSession) -> None:
    from tests.support.registry import free_port

    a = Authorizer()
    a.remember("h", [ch("bearer", realm=f"http://127.0.0.1:{free_port()}/token?secret=1")])
    with pytest.raises(Unavailable, match="cannot reach token service") as e:
        await a.header(session, "h", SCOPE, None)
    assert "secret=1" not in str(e.value)


@pytest.mark.parametrize("expires_in, ttl", [(None, 60), (300, 300), (0, 60), (-5, 60),
                                             ("x", 60), (True, 60), (2.5, 2.5)])
def test_parse_token_ttl(expires_in: Any, ttl: float, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(auth, "_clock", lambda: 0.0)
    body: dict[str, Any] = {"token": "t"}
    if expires_in is not None:
        body["expires_in"] = expires_in
    tok = auth._parse_token(json.dumps(body).encode(), "h")
    assert tok.value == "t"
    assert tok.expires == max(ttl - 5, 1.0)
