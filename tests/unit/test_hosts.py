"""Registry host configuration (containerd's hosts.toml)."""

from __future__ import annotations

import os
import ssl
from pathlib import Path

import pytest

from pycrid.errors import InvalidArgument
from pycrid.images.hosts import RegistryHosts, TLSConfig, is_loopback
from tests.support.certs import TestPKI, make_pki


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> TestPKI:
    return make_pki(tmp_path_factory.mktemp("pki"))


def write(root: Path, host: str, text: str) -> Path:
    d = root / host
    d.mkdir(parents=True, exist_ok=True)
    p = d / "hosts.toml"
    p.write_text(text)
    return p


@pytest.mark.parametrize("host, want", [
    ("localhost", True), ("localhost:5000", True), ("127.0.0.1", True),
    ("127.0.0.1:5000", True), ("127.1.2.3:1", True), ("[::1]:5000", True), ("::1", True),
    ("example.com", False), ("10.0.0.1:5000", False), ("[::2]:1", False),
    ("localhost.example.com", False), ("docker.io", False),
])
def test_is_loopback(host: str, want: bool) -> None:
    assert is_loopback(host) is want


def test_defaults_without_config() -> None:
    hosts = RegistryHosts(None)
    [hub] = hosts.hosts_for("docker.io")
    assert hub.url == "https://registry-1.docker.io/v2"
    assert hub.capabilities == {"pull", "resolve", "push"}
    assert isinstance(hub.ssl, ssl.SSLContext)
    assert not hub.http_fallback and not hub.is_mirror
    [q] = hosts.hosts_for("quay.io")
    assert q.url == "https://quay.io/v2" and q.host == "quay.io"
    [local] = hosts.hosts_for("127.0.0.1:5000")
    assert local.url == "https://127.0.0.1:5000/v2"
    assert local.http_fallback
    assert hosts.hosts_for("localhost")[0].http_fallback
    assert not hosts.hosts_for("10.1.1.1:5000")[0].http_fallback


def test_missing_dir_is_default(tmp_path: Path) -> None:
    [h] = RegistryHosts(str(tmp_path / "nope")).hosts_for("example.com")
    assert h.url == "https://example.com/v2"


def test_mirrors_in_order_then_server(tmp_path: Path) -> None:
    write(tmp_path, "docker.io", """
server = "https://registry-1.docker.io"

[host."https://mirror-b.example.com"]
  capabilities = ["pull", "resolve"]

[host."http://mirror-a.example.com:5000/prefix/"]
  capabilities = ["pull"]
  override_path = true

[host."mirror-c.example.com"]
""")
    hs = RegistryHosts(str(tmp_path)).hosts_for("docker.io")
    assert [h.url for h in hs] == [
        "https://mirror-b.example.com/v2",
        "http://mirror-a.example.com:5000/prefix",
        "https://mirror-c.example.com/v2",
        "https://registry-1.docker.io/v2",
    ]
    assert [h.is_mirror for h in hs] == [True, True, True, False]
    assert hs[0].capabilities == {"pull", "resolve"}
    assert hs[1].capabilities == {"pull"} and hs[1].ssl is None
    assert hs[2].capabilities == {"pull", "resolve", "push"}
    assert hs[1].host == "mirror-a.example.com:5000"
    assert not any(h.http_fallback for h in hs)


def test_server_path_gets_v2_once(tmp_path: Path) -> None:
    write(tmp_path, "a.example.com", 'server = "https://a.example.com/v2/"\n')
    write(tmp_path, "b.example.com", 'server = "https://b.example.com/sub"\n')
    write(tmp_path, "c.example.com", 'server = "https://c.example.com/raw"\noverride_path = true\n')
    h = RegistryHosts(str(tmp_path))
    assert h.hosts_for("a.example.com")[0].url == "https://a.example.com/v2"
    assert h.hosts_for("b.example.com")[0].url == "https://b.example.com/sub/v2"
    assert h.hosts_for("c.example.com")[0].url == "https://c.example.com/raw"


def test_no_server_key_means_default_server(tmp_path: Path) -> None:
    write(tmp_path, "docker.io", '[host."https://m.example.com"]\n')
    hs = RegistryHosts(str(tmp_path)).hosts_for("docker.io")
    assert [h.url for h in hs] == ["https://m.example.com/v2", "https://registry-1.docker.io/v2"]


def test_top_level_tls_without_server(tmp_path: Path) -> None:
    write(tmp_path, "x.example.com", "skip_verify = true\n")
    [h] = RegistryHosts(str(tmp_path)).hosts_for("x.example.com")
    assert h.url == "https://x.example.com/v2"
    assert h.ssl is not None and h.ssl.verify_mode == ssl.CERT_NONE
    assert not h.ssl.check_hostname


def test_default_dir(tmp_path: Path) -> None:
    write(tmp_path, "_default", '[host."https://catchall.example.com"]\n'
                                '  capabilities = ["pull", "resolve"]\n')
    write(tmp_path, "quay.io", 'server = "https://quay.io"\n')
    h = RegistryHosts(str(tmp_path))
    assert [x.url for x in h.hosts_for("ghcr.io")] == [
        "https://catchall.example.com/v2", "https://ghcr.io/v2"]
    assert [x.url for x in h.hosts_for("quay.io")] == ["https://quay.io/v2"]


def test_headers(tmp_path: Path) -> None:
    write(tmp_path, "h.example.com", """
[header]
  x-one = "1"
  x-many = ["a", "b"]
[host."https://m.example.com".header]
  x-mirror = "yes"
""")
    m, s = RegistryHosts(str(tmp_path)).hosts_for("h.example.com")
    assert m.headers == (("x-mirror", "yes"),)
    assert s.headers == (("x-one", "1"), ("x-many", "a"), ("x-many", "b"))


def test_tls_material(tmp_path: Path, pki: TestPKI) -> None:
    write(tmp_path, "t.example.com", f"""
server = "https://t.example.com"
ca = "{pki.ca_cert}"
client = [["{pki.client_cert}", "{pki.client_key}"]]
[host."https://m.example.com"]
  ca = ["{pki.ca_cert}", "{pki.client_ca_cert}"]
""")
    hosts = RegistryHosts(str(tmp_path))
    m, s = hosts.hosts_for("t.example.com")
    assert s.tls == TLSConfig(ca=(pki.ca_cert,), client=((pki.client_cert, pki.client_key),))
    assert m.tls.ca == (pki.ca_cert, pki.client_ca_cert)
    assert s.ssl is not None and m.ssl is not None and s.ssl is not m.ssl
    # Our CA is added to, not instead of, the default trust.
    default_count = len(ssl.create_default_context().get_ca_certs())
    assert len(s.ssl.get_ca_certs()) >= min(default_count, 1)
    assert any("pycrid" in str(c.get("subject")) for c in s.ssl.get_ca_certs())
    # Equal TLS configs share one context.
    assert hosts.hosts_for("t.example.com")[1].ssl is s.ssl


def test_relative_paths_are_relative_to_host_dir(tmp_path: Path, pki: TestPKI) -> None:
    d = tmp_path / "r.example.com"
    d.mkdir()
    (d / "ca.crt").write_bytes(Path(pki.ca_cert).read_bytes())
    (d / "hosts.toml").write_text('ca = "ca.crt"\nclient = "client.pem"\n')
    (d / "client.pem").write_bytes(Path(pki.client_cert).read_bytes()
                                   + Path(pki.client_key).read_bytes())
    [h] = RegistryHosts(str(tmp_path)).hosts_for("r.example.com")
    assert h.tls.ca == (str(d / "ca.crt"),)
    assert h.tls.client == ((str(d / "client.pem"), ""),)
    assert h.ssl is not None


def test_certs_d_without_hosts_toml(tmp_path: Path, pki: TestPKI) -> None:
    d = tmp_path / "127.0.0.1:5000"
    d.mkdir()
    (d / "ca.crt").write_bytes(Path(pki.ca_cert).read_bytes())
    (d / "client.cert").write_bytes(Path(pki.client_cert).read_bytes())
    (d / "client.key").write_bytes(Path(pki.client_key).read_bytes())
    [h] = RegistryHosts(str(tmp_path)).hosts_for("127.0.0.1:5000")
    assert h.tls.ca == (str(d / "ca.crt"),)
    assert h.tls.client == ((str(d / "client.cert"), str(d / "client.key")),)
    assert not h.http_fallback  # configured for TLS: no silent downgrade


def test_cache_and_mtime_invalidation(tmp_path: Path) -> None:
    p = write(tmp_path, "c.example.com", 'server = "https://one.example.com"\n')
    hosts = RegistryHosts(str(tmp_path))
    assert hosts.hosts_for("c.example.com")[0].url == "https://one.example.com/v2"
    parsed = hosts._files[str(p)]
    assert hosts.hosts_for("c.example.com")[0].url == "https://one.example.com/v2"
    assert hosts._files[str(p)] is parsed  # not parsed again
    p.write_text('server = "https://two.example.com"\n')
    st = p.stat()
    os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    assert hosts.hosts_for("c.example.com")[0].url == "https://two.example.com/v2"
    p.unlink()
    assert hosts.hosts_for("c.example.com")[0].url == "https://c.example.com/v2"


@pytest.mark.parametrize("text, key", [
    ("server = [", "not valid TOML"),
    ("server = 5", "'server'"),
    ('server = "ftp://x"', "'server'"),
    ('server = "https://x?y=1"', "'server'"),
    ("capabilities = 'pull'\nfoo = 1", "'foo'"),
    ('capabilities = ["pull", "fly"]', "'capabilities'"),
    ("capabilities = [1]", "'capabilities'"),
    ('skip_verify = "yes"', "'skip_verify'"),
    ("override_path = 1", "'override_path'"),
    ("ca = 5", "'ca'"),
    ("ca = [1, 2]", "'ca'"),
    ('client = [["a", "b", "c"]]', "'client'"),
    ("client = 5", "'client'"),
    ("client = [5]", "'client'"),
    ('header = "x"', "'header'"),
    ("[header]\nx = 5", "'header.x'"),
    ("host = 5", "'host'"),
    ('[host."https://m"]\nbogus = 1', "'host.https://m.bogus'"),
    ('[host."https://m"]\nserver = "https://x"', "'host.https://m.server'"),
    ('[host."https://m"]\ncapabilities = ["nope"]', "'host.https://m.capabilities'"),
    ('[host."ftp://m"]', "'host.ftp://m'"),
    ('host."https://m" = 1', "'host.https://m'"),
])
def test_invalid_file(tmp_path: Path, text: str, key: str) -> None:
    p = write(tmp_path, "bad.example.com", text)
    with pytest.raises(InvalidArgument) as e:
        RegistryHosts(str(tmp_path)).hosts_for("bad.example.com")
    assert str(p) in str(e.value)
    assert key in str(e.value)


def test_unreadable_ca(tmp_path: Path) -> None:
    write(tmp_path, "x.example.com", f'ca = "{tmp_path}/missing.crt"\n')
    with pytest.raises(InvalidArgument, match=r"missing\.crt|No such file"):
        RegistryHosts(str(tmp_path)).hosts_for("x.example.com")
