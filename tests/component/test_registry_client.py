"""The registry client against a real ``docker-registry`` (and a misbehaving one)."""

from __future__ import annotations

import hashlib
import inspect
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from pycrid.errors import DataLoss, NotFound, PermissionDenied, Unauthenticated, Unavailable
from pycrid.images import manifest as mf
from pycrid.images import mediatypes as oci
from pycrid.images.auth import Credentials
from pycrid.images.distribution import RegistryClient
from pycrid.images.hosts import RegistryHosts
from pycrid.images.mediatypes import Descriptor, Platform
from pycrid.images.reference import Reference, parse_reference
from tests.support.badregistry import BadRegistry
from tests.support.images import TestImages, build_image, digest_of
from tests.support.layers import Entry, tar_bytes
from tests.support.registry import LocalRegistry

AMD64 = Platform("linux", "amd64")


@pytest.fixture
async def client_factory() -> AsyncIterator[Callable[..., RegistryClient]]:
    made: list[RegistryClient] = []

    def make(config_path: str | None = None, **kw: Any) -> RegistryClient:
        c = RegistryClient(RegistryHosts(config_path), **kw)
        made.append(c)
        return c

    yield make
    for c in made:
        await c.close()


@pytest.fixture
async def client(client_factory: Callable[..., RegistryClient]) -> RegistryClient:
    return client_factory()


class Spy:
    """Records every request the client sends (method, path) without changing it."""

    def __init__(self, client: RegistryClient, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls: list[tuple[str, str]] = []
        orig = client._http._send

        async def send(h: Any, ref: Any, method: str, url: str, *a: Any, **kw: Any) -> Any:
            self.calls.append((method, url.split("://", 1)[1].split("/", 1)[1]))
            return await orig(h, ref, method, url, *a, **kw)

        monkeypatch.setattr(client._http, "_send", send)


async def _read(client: RegistryClient, ref: Reference, desc: Descriptor,
                creds: Credentials | None = None, offset: int = 0) -> bytes:
    out = b""
    async with client.fetch_blob(ref, desc, creds, offset) as chunks:
        async for c in chunks:
            out += c
    return out


async def _pull(client: RegistryClient, image: str, creds: Credentials | None = None,
                platform: Platform = AMD64) -> tuple[Descriptor, mf.Manifest, dict[str, bytes]]:
    """What a pull does: resolve, (index ->) manifest, config and layers."""
    ref = parse_reference(image)
    desc = await client.resolve(ref, creds)
    data = await client.fetch_manifest(ref, desc, creds)
    if mf.detect_media_type(data, desc.media_type) in oci.INDEX_TYPES:
        child = mf.select_platform(mf.parse_index(data), platform, str(ref))
        data = await client.fetch_manifest(ref, child, creds)
    m = mf.parse_manifest(data)
    blobs = {d.digest: await _read(client, ref, d, creds) for d in [m.config, *m.layers]}
    return desc, m, blobs


def _check_blobs(blobs: dict[str, bytes]) -> None:
    for digest, data in blobs.items():
        assert digest_of(data) == digest


# ---- plain http, no auth ------------------------------------------------------------------


async def test_pull_by_tag(client: RegistryClient, registry: LocalRegistry,
                           test_images: TestImages) -> None:
    img = test_images.busybox
    desc, m, blobs = await _pull(client, img.ref(registry))
    assert desc.digest == img.digest
    assert desc.media_type == oci.MT_OCI_MANIFEST
    assert desc.size == len(img.build.manifest)
    assert m.config.digest == img.build.config_digest
    assert [x.digest for x in m.layers] == list(img.build.layer_digests)
    _check_blobs(blobs)


async def test_resolve_is_one_head(client: RegistryClient, registry: LocalRegistry,
                                   test_images: TestImages,
                                   monkeypatch: pytest.MonkeyPatch) -> None:
    spy = Spy(client, monkeypatch)
    ref = parse_reference(test_images.busybox.ref(registry))
    await client.resolve(ref, None)  # first contact: may find out the registry speaks http
    spy.calls.clear()
    desc = await client.resolve(ref, None)
    assert desc.digest == test_images.busybox.digest
    assert spy.calls == [("HEAD", "v2/busybox/manifests/latest")]


async def test_pull_by_digest(client: RegistryClient, registry: LocalRegistry,
                              test_images: TestImages) -> None:
    img = test_images.busybox_136
    desc, _, blobs = await _pull(client, img.digest_ref(registry))
    assert desc.digest == img.digest
    _check_blobs(blobs)


async def test_pull_docker_schema2(client: RegistryClient, registry: LocalRegistry,
                                   test_images: TestImages) -> None:
    img = test_images.docker_busybox
    desc, m, blobs = await _pull(client, img.ref(registry))
    assert desc.media_type == oci.MT_DOCKER_MANIFEST
    assert m.media_type == oci.MT_DOCKER_MANIFEST
    _check_blobs(blobs)


@pytest.mark.parametrize("plat", [("linux", "amd64"), ("linux", "arm64", "v8"),
                                  ("linux", "arm64"), ("linux", "arm", "v7")])
async def test_pull_index_selects_platform(client: RegistryClient, registry: LocalRegistry,
                                           test_images: TestImages,
                                           plat: tuple[str, ...]) -> None:
    img = test_images.multi
    want = Platform(*plat)
    desc, m, blobs = await _pull(client, img.ref(registry), platform=want)
    assert desc.media_type == oci.MT_OCI_INDEX
    children = {k: v for k, v in test_images.multi_children.items()
                if mf.platform_matches(want, Platform(*k.split("/")))}
    assert children, "the standard multi image should carry this platform"
    config = mf.parse_image_config(blobs[m.config.digest])
    assert mf.platform_matches(want, config.platform)
    _check_blobs(blobs)


async def test_index_without_platform(client: RegistryClient, registry: LocalRegistry,
                                      test_images: TestImages) -> None:
    ref = parse_reference(test_images.multi.ref(registry))
    desc = await client.resolve(ref, None)
    data = await client.fetch_manifest(ref, desc, None)
    with pytest.raises(NotFound, match="no manifest for windows/amd64 in index of"):
        mf.select_platform(mf.parse_index(data), Platform("windows", "amd64"), str(ref))


async def test_fetch_blob_with_offset(client: RegistryClient, registry: LocalRegistry,
                                      test_images: TestImages) -> None:
    ref = parse_reference(test_images.busybox.ref(registry))
    digest = test_images.busybox.build.layer_digests[0]
    blob = test_images.busybox.build.blobs[digest]
    desc = Descriptor(oci.MT_OCI_LAYER_GZIP, digest, len(blob))
    assert await _read(client, ref, desc, offset=1000) == blob[1000:]
    assert await _read(client, ref, desc, offset=len(blob)) == b""


async def test_unknown_tag_and_repo(client: RegistryClient, registry: LocalRegistry) -> None:
    with pytest.raises(NotFound) as e:
        await client.resolve(parse_reference(registry.ref("busybox:nope")), None)
    assert f"image '{registry.host}/busybox:nope' not found in registry {registry.host}" \
        in str(e.value)
    with pytest.raises(NotFound, match="not found in registry"):
        await client.resolve(parse_reference(registry.ref("no/such:1")), None)


async def test_unknown_blob(client: RegistryClient, registry: LocalRegistry) -> None:
    ref = parse_reference(registry.ref("busybox:latest"))
    desc = Descriptor(oci.MT_OCI_LAYER_GZIP, "sha256:" + "0" * 64, 10)
    with pytest.raises(NotFound, match=r"blob sha256:0+ of image"):
        await _read(client, ref, desc)
    with pytest.raises(NotFound):
        await client.fetch_manifest(ref, Descriptor(oci.MT_OCI_MANIFEST, "sha256:" + "1" * 64,
                                                    10), None)


async def test_http_fallback_for_loopback(client: RegistryClient, registry: LocalRegistry,
                                          test_images: TestImages,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    spy = Spy(client, monkeypatch)
    ref = parse_reference(test_images.busybox.ref(registry))
    await client.resolve(ref, None)
    await client.resolve(ref, None)
    # https once, then http; and http straight away from then on.
    assert [c[0] for c in spy.calls] == ["HEAD", "HEAD", "HEAD"]


async def test_connection_refused(client: RegistryClient) -> None:
    from tests.support.registry import free_port

    ref = parse_reference(f"127.0.0.1:{free_port()}/x:1")
    with pytest.raises(Unavailable, match=r"cannot connect to registry 127\.0\.0\.1"):
        await client.resolve(ref, None)


async def test_dns_failure(client: RegistryClient) -> None:
    ref = parse_reference("no-such-host.invalid/x:1")
    with pytest.raises(Unavailable, match=r"no-such-host\.invalid"):
        await client.resolve(ref, None)


# ---- mirrors ------------------------------------------------------------------------------


def _hosts_toml(tmp: Path, host: str, text: str) -> str:
    d = tmp / host
    d.mkdir(parents=True, exist_ok=True)
    (d / "hosts.toml").write_text(text)
    return str(tmp)


async def test_mirror_then_server(client_factory: Callable[..., RegistryClient],
                                  registry: LocalRegistry, test_images: TestImages,
                                  registry_factory: Callable[..., LocalRegistry],
                                  tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    empty = registry_factory()
    config = _hosts_toml(tmp_path, registry.host, f"""
server = "http://{registry.host}"
[host."http://{empty.host}"]
  capabilities = ["pull", "resolve"]
""")
    client = client_factory(config)
    spy = Spy(client, monkeypatch)
    desc, _, blobs = await _pull(client, test_images.busybox.ref(registry))
    assert desc.digest == test_images.busybox.digest
    _check_blobs(blobs)
    assert ("HEAD", f"v2/busybox/manifests/latest?ns={registry.host}") in spy.calls
    # Once the image is in the mirror, the server is not asked.
    from tests.support.images import push
    push(empty, "busybox", "latest", test_images.busybox.build)
    spy.calls.clear()
    await _pull(client, test_images.busybox.ref(registry))
    assert spy.calls and all("?ns=" in path for _, path in spy.calls)


# ---- basic auth ---------------------------------------------------------------------------


async def test_basic_auth(client: RegistryClient, registry_basic: LocalRegistry,
                          test_images: TestImages, monkeypatch: pytest.MonkeyPatch) -> None:
    user, pw = registry_basic.creds or ("", "")
    creds = Credentials.from_cri(username=user, password=pw)
    _, _, blobs = await _pull(client, test_images.busybox.ref(registry_basic), creds)
    _check_blobs(blobs)
    # The challenge is remembered: the next resolve sends credentials up front.
    spy = Spy(client, monkeypatch)
    await client.resolve(parse_reference(test_images.layered.ref(registry_basic)), creds)
    assert [c[0] for c in spy.calls] == ["HEAD"]


async def test_basic_auth_cri_auth_field(client: RegistryClient, registry_basic: LocalRegistry,
                                         test_images: TestImages) -> None:
    import base64

    user, pw = registry_basic.creds or ("", "")
    creds = Credentials.from_cri(auth=base64.b64encode(f"{user}:{pw}".encode()).decode())
    desc = await client.resolve(parse_reference(test_images.busybox.ref(registry_basic)), creds)
    assert desc.digest == test_images.busybox.digest


async def test_basic_auth_bad_creds(client: RegistryClient, registry_basic: LocalRegistry,
                                    test_images: TestImages) -> None:
    ref = parse_reference(test_images.busybox.ref(registry_basic))
    secret = "not-the-password-xyz"
    with pytest.raises(Unauthenticated, match="rejected the credentials") as e:
        await client.resolve(ref, Credentials(username="alice", password=secret))
    assert secret not in str(e.value)
    assert str(ref) in str(e.value) and registry_basic.host in str(e.value)


async def test_basic_auth_no_creds(client: RegistryClient, registry_basic: LocalRegistry,
                                   test_images: TestImages) -> None:
    ref = parse_reference(test_images.busybox.ref(registry_basic))
    with pytest.raises(Unauthenticated, match="requires credentials"):
        await client.resolve(ref, None)


# ---- bearer tokens ------------------------------------------------------------------------


async def test_bearer_token_flow(client: RegistryClient, registry_token: LocalRegistry,
                                 test_images: TestImages) -> None:
    assert registry_token.token_server is not None
    user, pw = registry_token.creds or ("", "")
    creds = Credentials(username=user, password=pw)
    tokens = registry_token.token_server.requests
    before = len(tokens)
    _, _, blobs = await _pull(client, test_images.busybox.ref(registry_token), creds)
    _check_blobs(blobs)
    mine = tokens[before:]
    assert len(mine) == 1, "one token for the whole pull"
    assert mine[0].user == user and mine[0].status == 200
    assert "repository:busybox:pull" in mine[0].scopes
    # Same repository again: the cached token is used; another repository: a new token.
    await client.resolve(parse_reference(test_images.busybox_136.ref(registry_token)), creds)
    assert len(tokens) == before + 1
    await client.resolve(parse_reference(test_images.layered.ref(registry_token)), creds)
    assert len(tokens) == before + 2
    assert "repository:layered:pull" in tokens[-1].scopes


async def test_bearer_bad_creds(client: RegistryClient, registry_token: LocalRegistry,
                                test_images: TestImages) -> None:
    ref = parse_reference(test_images.busybox.ref(registry_token))
    secret = "wrong-secret-123"
    with pytest.raises(Unauthenticated, match="rejected the credentials") as e:
        await client.resolve(ref, Credentials(username="alice", password=secret))
    assert secret not in str(e.value)
    with pytest.raises(Unauthenticated, match="requires credentials"):
        await client.resolve(ref, None)


async def test_registry_token(client: RegistryClient, registry_token: LocalRegistry,
                              test_images: TestImages) -> None:
    assert registry_token.token_server is not None
    token = registry_token.token_server.issue("alice", ["repository:busybox:pull"])
    ref = parse_reference(test_images.busybox.ref(registry_token))
    desc = await client.resolve(ref, Credentials(registry_token=token))
    assert desc.digest == test_images.busybox.digest
    with pytest.raises(Unauthenticated, match="rejected the registry token") as e:
        await client.resolve(ref, Credentials(registry_token="garbage.token.value"))
    assert "garbage.token.value" not in str(e.value)


async def test_bearer_insufficient_scope(client: RegistryClient, registry_token: LocalRegistry,
                                         test_images: TestImages) -> None:
    assert registry_token.token_server is not None
    token = registry_token.token_server.issue("alice", ["repository:other:pull"])
    ref = parse_reference(test_images.busybox.ref(registry_token))
    with pytest.raises((Unauthenticated, PermissionDenied)):
        await client.resolve(ref, Credentials(registry_token=token))


# ---- TLS ----------------------------------------------------------------------------------


async def test_tls_with_ca_from_hosts_toml(client_factory: Callable[..., RegistryClient],
                                           registry_tls: LocalRegistry, test_images: TestImages,
                                           tmp_path: Path) -> None:
    client = client_factory(registry_tls.hosts_dir(tmp_path))
    _, _, blobs = await _pull(client, test_images.busybox.ref(registry_tls))
    _check_blobs(blobs)


async def test_tls_top_level_ca_and_client(client_factory: Callable[..., RegistryClient],
                                           registry_tls: LocalRegistry, test_images: TestImages,
                                           tmp_path: Path) -> None:
    config = _hosts_toml(tmp_path, registry_tls.host, f"""
server = "https://{registry_tls.host}"
ca = "{registry_tls.ca_path}"
client = [["{registry_tls.client_cert}", "{registry_tls.client_key}"]]
""")
    client = client_factory(config)
    desc = await client.resolve(parse_reference(test_images.busybox.ref(registry_tls)), None)
    assert desc.digest == test_images.busybox.digest


async def test_tls_unknown_ca(client: RegistryClient, registry_tls: LocalRegistry,
                              test_images: TestImages) -> None:
    with pytest.raises(Unavailable, match="certificate") as e:
        await client.resolve(parse_reference(test_images.busybox.ref(registry_tls)), None)
    assert registry_tls.host in str(e.value)


async def test_tls_missing_client_cert(client_factory: Callable[..., RegistryClient],
                                       registry_tls: LocalRegistry, test_images: TestImages,
                                       tmp_path: Path) -> None:
    config = _hosts_toml(tmp_path, registry_tls.host, f"""
server = "https://{registry_tls.host}"
ca = "{registry_tls.ca_path}"
""")
    client = client_factory(config)
    with pytest.raises(Unavailable, match="certificate"):
        await client.resolve(parse_reference(test_images.busybox.ref(registry_tls)), None)


# ---- a registry that lies -----------------------------------------------------------------


@pytest.fixture(scope="module")
def bad_registry() -> Iterator[BadRegistry]:
    with BadRegistry().running() as reg:
        yield reg


async def test_garbage_manifest(client: RegistryClient, bad_registry: BadRegistry) -> None:
    ref = parse_reference(f"{bad_registry.host}/bad/garbage:latest")
    with pytest.raises(DataLoss) as e:
        desc = await client.resolve(ref, None)
        data = await client.fetch_manifest(ref, desc, None)
        mf.parse_manifest(data)
    assert "JSON" in str(e.value) or "manifest" in str(e.value)


async def test_blob_cut_mid_stream(client: RegistryClient, bad_registry: BadRegistry) -> None:
    ref = parse_reference(f"{bad_registry.host}/bad/truncated:latest")
    desc = Descriptor(oci.MT_OCI_LAYER_GZIP, bad_registry.layer_digest, len(bad_registry.layer))
    with pytest.raises(DataLoss, match=f"of {len(bad_registry.layer)} bytes"):
        await _read(client, ref, desc)


async def test_short_blob(client: RegistryClient, registry: LocalRegistry,
                          test_images: TestImages) -> None:
    # The descriptor claims more than the registry has: the stream ends early.
    digest = test_images.busybox.build.config_digest
    ref = parse_reference(test_images.busybox.ref(registry))
    desc = Descriptor(oci.MT_OCI_CONFIG, digest, len(test_images.busybox.build.config) + 10)
    with pytest.raises(DataLoss, match="ended blob"):
        await _read(client, ref, desc)


async def test_manifest_digest_mismatch(client: RegistryClient, registry: LocalRegistry,
                                        test_images: TestImages,
                                        push_image: Callable[..., str]) -> None:
    # Ask for manifest B by digest A's descriptor: the bytes do not hash to what we asked.
    build = build_image([tar_bytes([Entry("x.txt", data=b"x")])])
    digest = push_image(registry, "mismatch", "v1", build)
    ref = parse_reference(registry.ref("mismatch:v1"))
    desc = await client.resolve(ref, None)
    assert desc.digest == digest
    body = await client.fetch_manifest(ref, desc, None)
    assert hashlib.sha256(body).hexdigest() == digest.split(":")[1]


# ---- registries that cooperate less: a scripted one ---------------------------------------


class Scripted:
    """A tiny registry whose answers each test chooses; records what it was asked."""

    def __init__(self) -> None:
        from aiohttp import web

        self.web = web
        self.manifest = b'{"schemaVersion": 2, "config": {"digest": "%s", "size": 2}, ' \
                        b'"layers": []}' % D_CFG.encode()
        self.blob = bytes(range(256)) * 40
        self.head: Callable[[Any], Any] = lambda r: self.web.Response(status=405)
        self.get: Callable[[Any], Any] = lambda r: self.web.Response(
            body=self.manifest, content_type="application/json")
        self.blob_handler: Callable[[Any], Any] = lambda r: self.web.Response(body=self.blob)
        self.seen: list[tuple[str, str, dict[str, str]]] = []
        self.host = ""

    async def _manifest(self, request: Any) -> Any:
        self.seen.append((request.method, request.path_qs, dict(request.headers)))
        out = (self.head if request.method == "HEAD" else self.get)(request)
        return await out if inspect.isawaitable(out) else out

    async def _blob(self, request: Any) -> Any:
        self.seen.append((request.method, request.path_qs, dict(request.headers)))
        return self.blob_handler(request)

    async def _storage(self, request: Any) -> Any:
        self.seen.append((request.method, request.path_qs, dict(request.headers)))
        return self.web.Response(body=self.blob)

    async def start(self) -> Any:
        app = self.web.Application()
        app.router.add_route("*", "/v2/r/manifests/{ref}", self._manifest)
        app.router.add_route("GET", "/v2/r/blobs/{digest}", self._blob)
        app.router.add_route("GET", "/storage/{name}", self._storage)
        runner = self.web.AppRunner(app)
        await runner.setup()
        site = self.web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        self.host = f"127.0.0.1:{site._server.sockets[0].getsockname()[1]}"  # type: ignore
        return runner


D_CFG = "sha256:" + "c" * 64


@pytest.fixture
async def scripted() -> AsyncIterator[Scripted]:
    s = Scripted()
    runner = await s.start()
    yield s
    await runner.cleanup()


async def test_head_405_falls_back_to_get_and_reuses_body(
        client: RegistryClient, scripted: Scripted) -> None:
    ref = parse_reference(f"{scripted.host}/r:v1")
    desc = await client.resolve(ref, None)
    assert desc.digest == digest_of(scripted.manifest)
    assert desc.media_type == oci.MT_OCI_MANIFEST  # detected from the body
    assert desc.size == len(scripted.manifest)
    n = len(scripted.seen)
    assert await client.fetch_manifest(ref, desc, None) == scripted.manifest
    assert len(scripted.seen) == n, "the body from resolve is reused"
    # Second fetch is a real GET by digest.
    assert await client.fetch_manifest(ref, desc, None) == scripted.manifest
    assert scripted.seen[-1][1] == f"/v2/r/manifests/{desc.digest}"


async def test_head_without_digest_falls_back_to_get(client: RegistryClient,
                                                     scripted: Scripted) -> None:
    scripted.head = lambda r: scripted.web.Response(
        headers={"Content-Type": oci.MT_OCI_MANIFEST}, body=b"")
    desc = await client.resolve(parse_reference(f"{scripted.host}/r:v1"), None)
    assert desc.digest == digest_of(scripted.manifest)
    assert [m for m, *_ in scripted.seen if m in ("HEAD", "GET")][-2:] == ["HEAD", "GET"]


async def test_get_digest_header_lies(client: RegistryClient, scripted: Scripted) -> None:
    scripted.get = lambda r: scripted.web.Response(
        body=scripted.manifest, headers={"Docker-Content-Digest": D_CFG})
    with pytest.raises(DataLoss, match="hash to"):
        await client.resolve(parse_reference(f"{scripted.host}/r:v1"), None)


async def test_resolve_by_digest_checks_body(client: RegistryClient, scripted: Scripted) -> None:
    with pytest.raises(DataLoss, match="digest"):
        await client.resolve(parse_reference(f"{scripted.host}/r@{D_CFG}"), None)


async def test_garbage_manifest_on_get(client: RegistryClient, scripted: Scripted) -> None:
    scripted.get = lambda r: scripted.web.Response(body=b"<html>oops</html>")
    with pytest.raises(DataLoss, match="not valid JSON"):
        await client.resolve(parse_reference(f"{scripted.host}/r:v1"), None)


async def test_fetch_manifest_digest_mismatch(client: RegistryClient, scripted: Scripted) -> None:
    ref = parse_reference(f"{scripted.host}/r:v1")
    desc = Descriptor(oci.MT_OCI_MANIFEST, D_CFG, len(scripted.manifest))
    with pytest.raises(DataLoss, match="digest"):
        await client.fetch_manifest(ref, desc, None)


async def test_manifest_too_big(client: RegistryClient, scripted: Scripted) -> None:
    big = b" " * (4 << 20) + scripted.manifest
    scripted.get = lambda r: scripted.web.Response(body=big)
    ref = parse_reference(f"{scripted.host}/r:v1")
    with pytest.raises(DataLoss, match=r"larger than|more than"):
        await client.resolve(ref, None)
    with pytest.raises(DataLoss, match="more than"):
        await client.fetch_manifest(ref, Descriptor(oci.MT_OCI_MANIFEST, D_CFG, 5 << 20), None)


@pytest.mark.parametrize("status, body, kind, text", [
    (404, b"", NotFound, "not found in registry"),
    (400, b'{"errors": [{"code": "MANIFEST_UNKNOWN", "message": "nope"}]}', NotFound, "nope"),
    (403, b"", PermissionDenied, "denied access to image"),
    (400, b'{"errors": [{"code": "DENIED"}]}', PermissionDenied, "denied"),
    (429, b"", Unavailable, "rate limiting"),
    (500, b"boom", Unavailable, "HTTP 500"),
    (503, b'{"errors": [{"code": "UNAVAILABLE", "message": "down"}]}', Unavailable, "down"),
    (418, b"", Unavailable, "HTTP 418"),
])
async def test_error_mapping(client: RegistryClient, scripted: Scripted, status: int,
                             body: bytes, kind: type[Exception], text: str) -> None:
    scripted.get = lambda r: scripted.web.Response(status=status, body=body)
    ref = parse_reference(f"{scripted.host}/r:v1")
    with pytest.raises(kind, match=text) as e:
        await client.resolve(ref, None)
    assert str(ref) in str(e.value) and scripted.host in str(e.value)


async def test_head_errors_are_not_retried_with_get(client: RegistryClient,
                                                    scripted: Scripted) -> None:
    scripted.head = lambda r: scripted.web.Response(status=404)
    with pytest.raises(NotFound):
        await client.resolve(parse_reference(f"{scripted.host}/r:v1"), None)
    assert "GET" not in [m for m, *_ in scripted.seen]


async def test_timeout(client_factory: Callable[..., RegistryClient], scripted: Scripted) -> None:
    import asyncio

    from pycrid.errors import DeadlineExceeded

    async def slow(r: Any) -> Any:
        await asyncio.sleep(1.5)
        return scripted.web.Response(body=scripted.manifest)

    scripted.get = slow
    client = client_factory(timeout=0.3)
    with pytest.raises(DeadlineExceeded, match="did not answer within"):
        await client.resolve(parse_reference(f"{scripted.host}/r:v1"), None)


async def test_blob_redirect_drops_authorization(client: RegistryClient,
                                                 scripted: Scripted) -> None:
    # Redirect to another origin (localhost vs 127.0.0.1): credentials must not follow.
    port = scripted.host.split(":")[1]
    scripted.blob_handler = lambda r: scripted.web.Response(
        status=307, headers={"Location": f"http://localhost:{port}/storage/x?sig=1"})
    ref = parse_reference(f"{scripted.host}/r:v1")
    desc = Descriptor(oci.MT_OCI_LAYER, digest_of(scripted.blob), len(scripted.blob))
    data = await _read(client, ref, desc, Credentials(registry_token="tok"))
    assert data == scripted.blob
    blob_req, storage_req = scripted.seen[-2:]
    assert blob_req[2].get("Authorization") == "Bearer tok"
    assert storage_req[1].startswith("/storage/x")
    assert "Authorization" not in storage_req[2]


async def test_range_honoured_and_ignored(client: RegistryClient, scripted: Scripted) -> None:
    ref = parse_reference(f"{scripted.host}/r:v1")
    desc = Descriptor(oci.MT_OCI_LAYER, digest_of(scripted.blob), len(scripted.blob))
    # This registry ignores Range: the client skips ahead itself.
    assert await _read(client, ref, desc, offset=1000) == scripted.blob[1000:]
    assert scripted.seen[-1][2]["Range"] == "bytes=1000-"

    def ranged(r: Any) -> Any:
        start = int(r.headers["Range"].split("=")[1].rstrip("-"))
        return scripted.web.Response(status=206, body=scripted.blob[start:])

    scripted.blob_handler = ranged
    assert await _read(client, ref, desc, offset=7) == scripted.blob[7:]


async def test_blob_longer_than_declared_is_not_cut(client: RegistryClient,
                                                    scripted: Scripted) -> None:
    # Verifying is the content store's job; the client passes on what it got.
    ref = parse_reference(f"{scripted.host}/r:v1")
    desc = Descriptor(oci.MT_OCI_LAYER, digest_of(scripted.blob), 10)
    assert len(await _read(client, ref, desc)) == len(scripted.blob)


async def test_hosts_toml_headers_sent(client_factory: Callable[..., RegistryClient],
                                       scripted: Scripted, tmp_path: Path) -> None:
    config = _hosts_toml(tmp_path, scripted.host, f"""
server = "http://{scripted.host}"
[header]
  X-Custom = "yes"
""")
    client = client_factory(config, user_agent="pycrid-test/1")
    await client.resolve(parse_reference(f"{scripted.host}/r:v1"), None)
    headers = scripted.seen[-1][2]
    assert headers["X-Custom"] == "yes"
    assert headers["User-Agent"] == "pycrid-test/1"
    assert oci.MT_OCI_INDEX in headers["Accept"]
