"""Fetching signatures: lookasides over file:// and http:// (404 ends the list, a server
that hangs or errs is a clear error within the deadline), sigstore attachments through the
registry client (a missing one is no signature; a huge or lying one is refused), and the
policy part's files (a configured policy that is missing, a broken one, a namespace's own)."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path

import pytest
from aiohttp import web

from pycrid.errors import SignatureValidationFailed
from pycrid.images.distribution import RegistryClient
from pycrid.images.hosts import RegistryHosts
from pycrid.images.policy import payload as pl
from pycrid.images.policy.enforcer import PolicySettings, SignaturePolicy
from pycrid.images.policy.registries_d import RegistriesD, parse_files
from pycrid.images.policy.sources import SignatureFetchError, SignatureSource
from pycrid.images.reference import parse_reference
from tests.support.registry import LocalRegistry
from tests.support.signed_registry import push_attachment
from tests.support.signing import SigstoreKey

D = "sha256:" + "a" * 64


def lookaside(url: str) -> RegistriesD:
    return parse_files({"/rd/x.yaml": f"default-docker:\n  lookaside: {url}\n".encode()})


async def serve(handler: web.StreamResponse | object) -> tuple[web.AppRunner, str]:
    app = web.Application()
    app.router.add_get("/{tail:.*}", handler)  # type: ignore[arg-type]
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    return runner, f"http://127.0.0.1:{port}"


def source(timeout: float = 5.0) -> SignatureSource:
    return SignatureSource(RegistryClient(RegistryHosts(None)), None, timeout=timeout)


async def test_file_lookaside_reads_until_the_first_missing(tmp_path: Path) -> None:
    d = tmp_path / f"ns/app@sha256={'a' * 64}"
    d.mkdir(parents=True)
    for i in (1, 2, 4):
        (d / f"signature-{i}").write_bytes(b"\xa3sig" + bytes([i]))
    src = source()
    got = await src.fetch(parse_reference("q.io/ns/app:v1"), D, None,
                          lookaside(f"file://{tmp_path}"))
    assert got == [pl.SimpleSigning(b"\xa3sig\x01"), pl.SimpleSigning(b"\xa3sig\x02")]
    (d / "signature-1").write_bytes(b"not a signature")
    with pytest.raises(SignatureFetchError, match="parsing signature"):
        await src.fetch(parse_reference("q.io/ns/app:v1"), D, None,
                        lookaside(f"file://{tmp_path}"))


async def test_http_lookaside_404_hang_and_error() -> None:
    asked: list[str] = []

    async def handler(request: web.Request) -> web.StreamResponse:
        asked.append(request.path)
        if "hang" in request.path:
            await asyncio.sleep(3)
        if "fail" in request.path:
            return web.Response(status=500)
        if "slow" in request.path and request.path.endswith("signature-1"):
            # One signature in pieces: what arrives first is not the whole of it.
            resp = web.StreamResponse()
            await resp.prepare(request)
            for piece in (b"\xa3", b"slow" * 5000, b"end"):
                await resp.write(piece)
                await asyncio.sleep(0.05)
            await resp.write_eof()
            return resp
        if request.path.endswith("signature-1"):
            return web.Response(body=b"\xa3one")
        return web.Response(status=404)

    runner, url = await serve(handler)
    try:
        src = source(timeout=0.5)
        ref = parse_reference("q.io/ok/app:v1")
        assert await src.fetch(ref, D, None, lookaside(url)) == [pl.SimpleSigning(b"\xa3one")]
        assert asked == [f"/ok/app@sha256={'a' * 64}/signature-{i}" for i in (1, 2)]
        assert await src.fetch(parse_reference("q.io/slow/app:v1"), D, None,
                               lookaside(url)) == [pl.SimpleSigning(b"\xa3" + b"slow" * 5000
                                                                    + b"end")]
        with pytest.raises(SignatureFetchError, match=r"did not answer within 0\.5s"):
            await src.fetch(parse_reference("q.io/hang/app:v1"), D, None, lookaside(url))
        with pytest.raises(SignatureFetchError, match="HTTP 500"):
            await src.fetch(parse_reference("q.io/fail/app:v1"), D, None, lookaside(url))
        await src.close()
    finally:
        await runner.cleanup()


async def test_attachments(tmp_path: Path) -> None:
    reg = LocalRegistry(tmp_path / "reg")
    reg.start()
    try:
        hosts = RegistryHosts(reg.hosts_dir(tmp_path / "certs.d"))
        src = SignatureSource(RegistryClient(hosts), hosts)
        attach = parse_files({"/rd/a.yaml": b"default-docker:\n  use-sigstore-attachments: "
                                            b"true\n  lookaside: file:///nonexistent\n"})
        ref = parse_reference(f"{reg.host}/app:v1")
        assert await src.fetch(ref, D, None, attach) == []  # no attachment: no signatures
        sig = SigstoreKey.new().signature(D, str(ref))
        push_attachment(reg, "app", D, [sig])
        assert await src.fetch(ref, D, None, attach) == [sig]
        other = "sha256:" + "b" * 64
        push_attachment(reg, "app", other, [sig],
                        media_type="application/vnd.docker.distribution.manifest.v2+json")
        with pytest.raises(SignatureFetchError, match="not an OCI image manifest"):
            await src.fetch(ref, other, None, attach)
        huge = pl.Sigstore(pl.SIGSTORE_MIME, b"x" * ((4 << 20) + 1), {})
        third = "sha256:" + "c" * 64
        push_attachment(reg, "app", third, [huge])
        with pytest.raises(SignatureFetchError, match="more than the 4194304 allowed"):
            await src.fetch(ref, third, None, attach)
        await src.close()
        await src.client.close()
    finally:
        reg.stop()


def test_policy_files(tmp_path: Path) -> None:
    off = SignaturePolicy(PolicySettings(str(tmp_path / "absent.json"), True,
                                         str(tmp_path / "ns"), str(tmp_path / "rd")), source())
    assert off.policy_for("default") is None
    assert "not verified" in str(off.describe()["state"])
    required = SignaturePolicy(PolicySettings(str(tmp_path / "absent.json"), False,
                                              str(tmp_path / "ns"), str(tmp_path / "rd")),
                               source())
    with pytest.raises(SignatureValidationFailed, match="cannot read the signature policy"):
        required.policy_for("default")
    glob = tmp_path / "policy.json"
    glob.write_text('{"default": [{"type": "reject"}]}')
    (tmp_path / "ns").mkdir()
    (tmp_path / "ns" / "team-a.json").write_text(
        '{"default": [{"type": "insecureAcceptAnything"}]}')
    p = SignaturePolicy(PolicySettings(str(glob), False, str(tmp_path / "ns"),
                                       str(tmp_path / "rd")), source())
    assert p.policy_for("team-a").path.endswith("team-a.json")  # type: ignore[union-attr]
    assert p.policy_for("team-b").path == str(glob)  # type: ignore[union-attr]
    assert p.policy_for("../ns/team-a").path == str(glob)  # type: ignore[union-attr]
    assert p.describe()["namespaces"] == ["team-a"]
    glob.write_text('{"default": [{"type": "reject"}], "transports": {"docker": {"x": {}}}}')
    with pytest.raises(SignatureValidationFailed, match=re.escape(str(glob))):
        p.policy_for("")
    assert "invalid" in str(p.describe()["state"])


def test_registries_d_rules(tmp_path: Path) -> None:
    from pycrid.images.policy.names import parse_named
    from pycrid.images.policy.registries_d import RegistriesDError
    cfg = parse_files({
        "/rd/a.yaml": b"default-docker:\n  lookaside: https://sigs.example/default\n"
                      b"docker:\n  quay.io/ns:\n    lookaside: https://sigs.example/ns\n"
                      b"    use-sigstore-attachments: true\n",
        "/rd/b.yaml": b"docker:\n  quay.io/ns/special:\n    use-sigstore-attachments: false\n"})
    ref = parse_named("quay.io/ns/app:v1")
    assert cfg.lookaside(ref) == "https://sigs.example/ns/ns/app"
    assert cfg.use_sigstore_attachments(ref)
    special = parse_named("quay.io/ns/special:v1")
    assert not cfg.use_sigstore_attachments(special)
    assert cfg.lookaside(special) == "https://sigs.example/ns/ns/special"
    assert cfg.lookaside(parse_named("docker.io/library/busybox:1")) == (
        "https://sigs.example/default/library/busybox")
    assert parse_files({}).lookaside(ref) == "file:///var/lib/containers/sigstore/ns/app"
    with pytest.raises(RegistriesDError, match='"default-docker" is defined both'):
        parse_files({"/rd/a.yaml": b"default-docker: {}\n",
                     "/rd/b.yaml": b"default-docker:\n  lookaside: file:///x\n"})
    with pytest.raises(RegistriesDError, match="unsupported lookaside scheme"):
        parse_files({"/rd/a.yaml": b"default-docker:\n  lookaside: ftp://x\n"})
    with pytest.raises(RegistriesDError, match=r"parsing /rd/a\.yaml"):
        parse_files({"/rd/a.yaml": b"default-docker: [\n"})
    assert json.dumps(sorted(cfg.docker))  # keys are plain strings


def test_registries_d_directory(tmp_path: Path) -> None:
    """registries.d that is absent is empty; one that is not a directory refuses with its
    path (containers/image fails the same way), a ``*.yaml`` directory inside is skipped,
    and a changed file is read again."""
    rd = tmp_path / "rd"
    policy = SignaturePolicy(PolicySettings(str(tmp_path / "absent.json"), True,
                                            str(tmp_path / "ns"), str(rd)), source())
    assert policy.registries().docker == {}
    rd.write_text("not a directory")
    with pytest.raises(SignatureValidationFailed,
                       match=rf"signature storage configuration \({re.escape(str(rd))}\): "
                             rf"cannot list {re.escape(str(rd))}: Not a directory"):
        policy.registries()
    rd.unlink()
    rd.mkdir()
    (rd / "dir.yaml").mkdir()
    (rd / "a.yaml").write_text("docker:\n  quay.io/ns:\n    use-sigstore-attachments: true\n")
    assert sorted(policy.registries().docker) == ["quay.io/ns"]
    (rd / "a.yaml").write_text("docker:\n  quay.io/other:\n    lookaside: file:///x\n")
    assert sorted(policy.registries().docker) == ["quay.io/other"]
