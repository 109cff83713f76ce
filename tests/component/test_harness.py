"""The registry harness itself: if these fail, every image test built on it is suspect."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import ssl
import tarfile
import tomllib
from collections.abc import Callable
from pathlib import Path

import jwt
import pytest

from tests.support.images import (
    DOCKER_MANIFEST,
    LAYERED_EXPECTED,
    OCI_INDEX,
    OCI_MANIFEST,
    TestImages,
    big_layer,
    build_image,
    digest_of,
    pause_binary,
)
from tests.support.layers import Entry, tar_bytes
from tests.support.registry import ISSUER, SERVICE, LocalRegistry, RegistryClient, RegistryError

ACCEPT = ", ".join([OCI_INDEX, OCI_MANIFEST, DOCKER_MANIFEST,
                    "application/vnd.docker.distribution.manifest.list.v2+json"])

REGISTRIES = ["registry", "registry_basic", "registry_token", "registry_tls"]


@pytest.fixture(params=REGISTRIES)
def any_registry(request: pytest.FixtureRequest) -> LocalRegistry:
    reg: LocalRegistry = request.getfixturevalue(request.param)
    return reg


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie counts as dead here (stop() reaps it with wait(); an unreaped one would fail).
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(") ", 1)[1][0] != "Z"
    except FileNotFoundError:
        return False


def _registry_pids_for(workdir: Path) -> list[int]:
    """Processes whose command line points at this registry's config."""
    found = []
    needle = str(workdir / "config.yml").encode()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    if needle in f.read():
                        found.append(int(entry))
            except OSError:
                continue
    return found


# -- /v2/ and auth --------------------------------------------------------------------


def test_v2_answers(any_registry: LocalRegistry) -> None:
    resp = any_registry.client().request("GET", "/v2/")
    assert resp.status == 200
    assert resp.headers.get("docker-distribution-api-version") == "registry/2.0"


@pytest.mark.parametrize("name", ["registry_basic", "registry_token"])
def test_auth_registries_refuse_anonymous(request: pytest.FixtureRequest, name: str) -> None:
    reg: LocalRegistry = request.getfixturevalue(name)
    anon = RegistryClient(reg, None)
    resp = anon.request("GET", "/v2/")
    assert resp.status == 401
    challenge = resp.headers["www-authenticate"]
    assert challenge.lower().startswith("basic" if reg.auth == "basic" else "bearer")
    assert anon.request("GET", "/v2/busybox/manifests/latest").status == 401


@pytest.mark.parametrize("name", ["registry_basic", "registry_token"])
def test_wrong_password_is_refused(request: pytest.FixtureRequest, name: str) -> None:
    reg: LocalRegistry = request.getfixturevalue(name)
    client = RegistryClient(reg, ("alice", "not-the-password"))
    if reg.auth == "basic":
        assert client.request("GET", "/v2/").status == 401
    else:
        with pytest.raises(RegistryError, match="401"):
            client.request("GET", "/v2/busybox/manifests/latest")


def test_token_server_issues_scoped_x5c_tokens(registry_token: LocalRegistry,
                                               test_images: TestImages) -> None:
    ts = registry_token.token_server
    assert ts is not None
    before = len(ts.requests)
    client = registry_token.client()
    resp = client.request("GET", "/v2/busybox/manifests/latest", headers={"Accept": ACCEPT})
    assert resp.status == 200
    assert resp.headers["docker-content-digest"] == test_images.busybox.digest
    seen = ts.requests[before:]
    assert [r.scopes for r in seen] == [["repository:busybox:pull"]]
    assert seen[0].user == "alice" and seen[0].service == SERVICE
    token = client._tokens["repository:busybox:pull"]
    header = jwt.get_unverified_header(token)
    assert header["alg"] == "ES256" and len(header["x5c"]) == 1
    claims = jwt.decode(token, options={"verify_signature": False})
    assert claims["iss"] == ISSUER and claims["aud"] == SERVICE
    assert claims["access"] == [{"type": "repository", "name": "busybox", "actions": ["pull"]}]
    # A token for another repository does not open this one.
    other = ts.issue("alice", ["repository:zstd:pull"])
    raw = RegistryClient(registry_token, None)
    raw._auth = f"Bearer {other}"
    assert raw.request("GET", "/v2/busybox/manifests/latest").status == 401


def test_token_server_oauth_post(registry_token: LocalRegistry) -> None:
    import http.client
    import urllib.parse

    ts = registry_token.token_server
    assert ts is not None
    url = urllib.parse.urlsplit(ts.realm)
    form = urllib.parse.urlencode({"grant_type": "password", "username": "alice",
                                   "password": "wonderland", "service": SERVICE,
                                   "scope": "repository:busybox:pull", "client_id": "t"})
    conn = http.client.HTTPConnection(url.hostname or "", url.port or 80, timeout=10)
    conn.request("POST", url.path, body=form,
                 headers={"Content-Type": "application/x-www-form-urlencoded"})
    body = json.loads(conn.getresponse().read())
    conn.close()
    raw = RegistryClient(registry_token, None)
    raw._auth = f"Bearer {body['access_token']}"
    assert raw.request("HEAD", "/v2/busybox/manifests/latest",
                       headers={"Accept": ACCEPT}).status == 200


# -- TLS ---------------------------------------------------------------------------


def test_tls_needs_the_ca(registry_tls: LocalRegistry) -> None:
    assert registry_tls.url.startswith("https://")
    untrusting = ssl.create_default_context()  # system roots only
    untrusting.load_cert_chain(registry_tls.client_cert or "", registry_tls.client_key or "")
    client = registry_tls.client()
    client._ssl = untrusting
    with pytest.raises(ssl.SSLCertVerificationError):
        client.request("GET", "/v2/")
    assert registry_tls.client().request("GET", "/v2/").status == 200


def test_tls_needs_a_client_cert(registry_tls: LocalRegistry) -> None:
    client = registry_tls.client(client_cert=False)
    # TLS 1.3 reports the missing certificate after the handshake, on the first read.
    with pytest.raises((ssl.SSLError, ConnectionError)):
        client.request("GET", "/v2/")


def test_plain_http_registry_does_not_speak_tls(registry: LocalRegistry) -> None:
    client = registry.client()
    client._ssl = ssl.create_default_context()
    with pytest.raises(ssl.SSLError):
        client.request("GET", "/v2/")


# -- the standard set ----------------------------------------------------------------


def test_manifests_by_tag_and_digest(any_registry: LocalRegistry, test_images: TestImages) -> None:
    client = any_registry.client()
    for img in test_images.all():
        for ref in (img.tag, img.digest):
            resp = client.request("GET", f"/v2/{img.repo}/manifests/{ref}",
                                  headers={"Accept": ACCEPT})
            assert resp.status == 200, (img.name, ref, resp.body)
            assert resp.body == img.build.manifest
            assert digest_of(resp.body) == img.digest
            assert resp.headers["docker-content-digest"] == img.digest
            assert resp.headers["content-type"] == img.build.media_type


def test_blobs_match_their_digests(registry: LocalRegistry, test_images: TestImages) -> None:
    client = registry.client()
    for img in [test_images.busybox, test_images.zstd, test_images.docker_busybox]:
        for digest in [img.build.config_digest, *img.build.layer_digests]:
            resp = client.request("GET", f"/v2/{img.repo}/blobs/{digest}")
            assert resp.status == 200
            assert digest_of(resp.body) == digest


def test_index_children_resolve(any_registry: LocalRegistry, test_images: TestImages) -> None:
    client = any_registry.client()
    index = json.loads(client.request("GET", "/v2/multi/manifests/latest",
                                      headers={"Accept": ACCEPT}).body)
    assert index["mediaType"] == OCI_INDEX
    platforms = {}
    for desc in index["manifests"]:
        p = desc["platform"]
        name = "/".join([p["os"], p["architecture"]] + ([p["variant"]] if "variant" in p else []))
        resp = client.request("GET", f"/v2/multi/manifests/{desc['digest']}",
                              headers={"Accept": ACCEPT})
        assert resp.status == 200 and digest_of(resp.body) == desc["digest"]
        manifest = json.loads(resp.body)
        config = client.request("GET", f"/v2/multi/blobs/{manifest['config']['digest']}").json()
        assert config["architecture"] == p["architecture"]
        assert f"PLATFORM={name}" in config["config"]["Env"]
        platforms[name] = desc["digest"]
    assert platforms == test_images.multi_children
    assert set(platforms) == {"linux/amd64", "linux/arm64/v8", "linux/arm/v7"}


def test_image_config_diff_ids_match_layers(registry: LocalRegistry,
                                            test_images: TestImages) -> None:
    client = registry.client()
    img = test_images.layered
    config = client.request("GET", f"/v2/layered/blobs/{img.build.config_digest}").json()
    diff_ids = []
    for digest in img.build.layer_digests:
        blob = client.request("GET", f"/v2/layered/blobs/{digest}").body
        diff_ids.append("sha256:" + hashlib.sha256(gzip.decompress(blob)).hexdigest())
    assert config["rootfs"]["diff_ids"] == diff_ids
    assert len(diff_ids) >= 3


def test_layered_layers_hold_the_advertised_tricks(test_images: TestImages) -> None:
    build = test_images.layered.build
    layers = [build.blobs[d] for d in build.layer_digests]
    names = [tarfile.open(fileobj=io.BytesIO(gzip.decompress(b))).getnames() for b in layers]
    assert "lib" in names[0] and "data/a.txt" in names[0]
    assert "data/.wh.a.txt" in names[1] and "lib/two.so" in names[1]
    assert "opt/dir/.wh..wh..opq" in names[2]
    # Every path the expectation table names is touched by some layer.
    touched = {n for layer in names for n in layer} | {"usr/lib/two.so", "usr/lib/three.so"}
    assert set(LAYERED_EXPECTED) <= touched


def test_busybox_rootfs_is_runnable_shape(test_images: TestImages) -> None:
    build = test_images.busybox.build
    (layer,) = build.layer_digests
    tf = tarfile.open(fileobj=io.BytesIO(gzip.decompress(build.blobs[layer])))
    members = {m.name: m for m in tf.getmembers()}
    assert members["bin/busybox"].mode == 0o755 and members["bin/busybox"].size > 100_000
    assert members["bin/sh"].issym() and members["bin/sh"].linkname == "busybox"
    assert members["tmp"].mode == 0o1777
    passwd = tf.extractfile("etc/passwd")
    assert passwd is not None and b"app:x:1000:1000" in passwd.read()


def test_pause_binary_is_static() -> None:
    binary = pause_binary()
    if binary is None:
        pytest.skip("no static gcc here; the pause image falls back to busybox sleep")
    assert binary[:4] == b"\x7fELF"
    assert b"/lib64/ld-linux" not in binary  # no program interpreter: static


# -- pushing extra images --------------------------------------------------------------


def test_push_extra_image_with_auth(registry_token: LocalRegistry,
                                    push_image: Callable[..., str]) -> None:
    build = build_image([tar_bytes([Entry("hello.txt", data=b"hi\n")])], compression="none")
    digest = push_image(registry_token, "extra/hello", "v1", build)
    assert digest == build.manifest_digest
    resp = registry_token.client().request("GET", f"/v2/extra/hello/manifests/{digest}",
                                           headers={"Accept": ACCEPT})
    assert resp.status == 200 and resp.body == build.manifest


def test_big_layer_is_incompressible() -> None:
    tar = big_layer(1, seed=7)
    assert len(gzip.compress(tar, compresslevel=1)) > 1024 * 1024
    assert big_layer(1, seed=7) == tar


# -- hosts.toml and life cycle --------------------------------------------------------


def test_hosts_dir(registry: LocalRegistry, registry_tls: LocalRegistry, tmp_path: Path) -> None:
    base = registry.hosts_dir(tmp_path)
    plain = tomllib.loads((Path(base) / registry.host / "hosts.toml").read_text())
    assert plain["server"] == f"http://{registry.host}"
    assert plain["host"][f"http://{registry.host}"]["capabilities"] == ["pull", "resolve"]
    registry_tls.hosts_dir(tmp_path)
    tls = tomllib.loads((tmp_path / registry_tls.host / "hosts.toml").read_text())
    host = tls["host"][f"https://{registry_tls.host}"]
    assert host["ca"] == registry_tls.ca_path
    assert host["client"] == [[registry_tls.client_cert, registry_tls.client_key]]


def test_no_registry_process_survives(registry_factory: Callable[..., LocalRegistry],
                                      tmp_path: Path) -> None:
    reg = registry_factory(auth="token", users={"bob": "builder"})
    pid, workdir, token_server = reg.pid, reg.workdir, reg.token_server
    assert pid is not None and _alive(pid) and token_server is not None
    assert _registry_pids_for(workdir) == [pid]
    reg.stop()
    assert not _alive(pid)
    assert _registry_pids_for(workdir) == []
    assert reg.token_server is None
    reg.stop()  # idempotent

    with LocalRegistry(tmp_path / "ctx") as ctx:
        ctx_pid = ctx.pid
        assert ctx_pid is not None and _alive(ctx_pid)
        assert ctx.client().request("GET", "/v2/").status == 200
    assert not _alive(ctx_pid)


def test_registry_stopped_even_when_the_body_raises(tmp_path: Path) -> None:
    reg = LocalRegistry(tmp_path / "boom")
    with pytest.raises(RuntimeError), reg:
        pid = reg.pid
        raise RuntimeError("test failure inside the registry's lifetime")
    assert pid is not None and not _alive(pid)
