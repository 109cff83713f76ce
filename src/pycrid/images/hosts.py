"""Where to fetch an image from: containerd's registry host configuration (``hosts.toml``).

``config_path`` holds one directory per registry host (``docker.io``,
``127.0.0.1:5000``) and an optional ``_default``; each may have a ``hosts.toml``
naming mirrors (tried first, in file order), the upstream ``server``, TLS material
and extra headers. Operators already write these files for containerd, so the keys
and their meaning are the same. Without a file, a registry is reached at
``https://<host>`` (Docker Hub at ``registry-1.docker.io``), and a loopback registry
may also be reached over plain http.
"""

from __future__ import annotations

import glob
import ipaddress
import os
import ssl
import tomllib
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from pycrid.errors import InvalidArgument

CAP_PULL = "pull"
CAP_RESOLVE = "resolve"
CAP_PUSH = "push"
ALL_CAPABILITIES = frozenset({CAP_PULL, CAP_RESOLVE, CAP_PUSH})

DOCKER_HUB = "docker.io"
DOCKER_HUB_SERVER = "https://registry-1.docker.io"
_DEFAULT_DIR = "_default"
_TOP_KEYS = frozenset({"server", "capabilities", "ca", "client", "skip_verify",
                       "override_path", "header", "host"})
_HOST_KEYS = _TOP_KEYS - {"server", "host"}


@dataclass(frozen=True)
class TLSConfig:
    """TLS material of one host; hashable, so equal configs share one SSL context."""

    ca: tuple[str, ...] = ()
    client: tuple[tuple[str, str], ...] = ()
    skip_verify: bool = False


@dataclass(frozen=True)
class RegistryHost:
    """One endpoint to try: a mirror or the upstream server itself."""

    url: str  # scheme://host[:port]/prefix, ending in /v2 unless override_path
    host: str  # host[:port], for messages and the token cache
    capabilities: frozenset[str]
    ssl: ssl.SSLContext | None = field(compare=False)
    headers: tuple[tuple[str, str], ...] = ()
    is_mirror: bool = False
    http_fallback: bool = False
    tls: TLSConfig = TLSConfig()

    @property
    def scheme(self) -> str:
        return self.url.split(":", 1)[0]

    def can(self, capability: str) -> bool:
        return capability in self.capabilities


def is_loopback(host: str) -> bool:
    """``localhost``, 127.0.0.0/8 or ::1, with or without a port."""
    name = host
    if name.startswith("["):
        name = name[1:].partition("]")[0]
    elif name.count(":") == 1:
        name = name.partition(":")[0]
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def _why(e: OSError) -> str:
    """OpenSSL's short reason ("NO_CERTIFICATE_OR_CRL_FOUND") or the OS's ("No such file")."""
    if isinstance(e, ssl.SSLError) and e.reason:
        return str(e.reason)
    return str(e.strerror or e)


def default_server(domain: str) -> str:
    return DOCKER_HUB_SERVER if domain == DOCKER_HUB else f"https://{domain}"


# ---- parsing hosts.toml ----------------------------------------------------------------


@dataclass(frozen=True)
class _HostSpec:
    """One ``[host."..."]`` table (or the top level), validated but without SSL contexts."""

    url: str
    capabilities: frozenset[str]
    tls: TLSConfig
    override_path: bool
    headers: tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class _FileSpec:
    mirrors: tuple[_HostSpec, ...]
    server: _HostSpec | None  # None: the top level named no server; use the default one


def _bad(path: str, key: str, why: str) -> InvalidArgument:
    return InvalidArgument(f"registry host config {path}: key {key!r}: {why}")


def _strs(path: str, key: str, v: Any) -> list[str]:
    if isinstance(v, str):
        return [v]
    if isinstance(v, list) and all(isinstance(x, str) for x in v):
        return list(v)
    raise _bad(path, key, "want a string or a list of strings")


def _abs(base: str, p: str) -> str:
    return p if os.path.isabs(p) else os.path.join(base, p)


def _client_pairs(path: str, key: str, v: Any, base: str) -> tuple[tuple[str, str], ...]:
    # containerd accepts "cert.pem", ["a.pem", "b.pem"] and [["cert", "key"], ...]; a
    # single file holds both the certificate and its key.
    items = [v] if isinstance(v, str) else v
    if not isinstance(items, list):
        raise _bad(path, key, "want a path, a list of paths or a list of [cert, key] pairs")
    out: list[tuple[str, str]] = []
    for item in items:
        if isinstance(item, str):
            out.append((_abs(base, item), ""))
        elif (isinstance(item, list) and 1 <= len(item) <= 2
              and all(isinstance(x, str) for x in item)):
            cert = _abs(base, item[0])
            out.append((cert, _abs(base, item[1]) if len(item) == 2 and item[1] else ""))
        else:
            raise _bad(path, key, f"invalid client certificate entry {item!r}: "
                                  "want a path or a [cert, key] pair")
    return tuple(out)


def _headers(path: str, key: str, v: Any) -> tuple[tuple[str, str], ...]:
    if not isinstance(v, dict):
        raise _bad(path, key, "want a table of header names to values")
    out: list[tuple[str, str]] = []
    for name, value in v.items():
        for one in _strs(path, f"{key}.{name}", value):
            out.append((str(name), one))
    return tuple(out)


def _url(path: str, key: str, raw: Any) -> str:
    if not isinstance(raw, str) or not raw:
        raise _bad(path, key, "want a URL such as \"https://mirror.example.com\"")
    s = raw if "://" in raw else f"https://{raw}"
    u = urlsplit(s)
    if u.scheme not in ("http", "https") or not u.netloc:
        raise _bad(path, key, f"{raw!r} is not an http(s) URL")
    if u.query or u.fragment:
        raise _bad(path, key, f"{raw!r}: a host URL takes no query or fragment")
    return f"{u.scheme}://{u.netloc}{u.path.rstrip('/')}"


def _host_spec(path: str, prefix: str, url: str, table: dict[str, Any], allowed: frozenset[str],
               default_caps: frozenset[str]) -> _HostSpec:
    base = os.path.dirname(path)
    for k in table:
        if k not in allowed:
            raise _bad(path, f"{prefix}{k}", "unknown key")
    caps = default_caps
    if "capabilities" in table:
        given = _strs(path, f"{prefix}capabilities", table["capabilities"])
        unknown = set(given) - ALL_CAPABILITIES
        if unknown:
            raise _bad(path, f"{prefix}capabilities",
                       f"unknown capability {sorted(unknown)[0]!r} (want pull, resolve, push)")
        caps = frozenset(given)
    for flag in ("skip_verify", "override_path"):
        if flag in table and not isinstance(table[flag], bool):
            raise _bad(path, f"{prefix}{flag}", "want true or false")
    ca = tuple(_abs(base, p) for p in _strs(path, f"{prefix}ca", table["ca"])) \
        if "ca" in table else ()
    client = _client_pairs(path, f"{prefix}client", table["client"], base) \
        if "client" in table else ()
    headers = _headers(path, f"{prefix}header", table["header"]) if "header" in table else ()
    return _HostSpec(
        url=url, capabilities=caps,
        tls=TLSConfig(ca=ca, client=client, skip_verify=bool(table.get("skip_verify", False))),
        override_path=bool(table.get("override_path", False)), headers=headers,
    )


def parse_hosts_toml(path: str, data: bytes) -> _FileSpec:
    """Validate one hosts.toml; InvalidArgument names the file and the offending key."""
    try:
        doc = tomllib.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
        raise InvalidArgument(f"registry host config {path}: not valid TOML: {e}") from None
    mirrors: list[_HostSpec] = []
    hosts = doc.get("host", {})
    if not isinstance(hosts, dict):
        raise _bad(path, "host", 'want tables such as [host."https://mirror.example.com"]')
    for raw_url, table in hosts.items():
        key = f"host.{raw_url}"
        if not isinstance(table, dict):
            raise _bad(path, key, "want a table")
        mirrors.append(_host_spec(path, f"{key}.", _url(path, key, raw_url), table,
                                  _HOST_KEYS, ALL_CAPABILITIES))
    top = {k: v for k, v in doc.items() if k != "host"}
    server: _HostSpec | None = None
    if top:
        url = _url(path, "server", top["server"]) if "server" in top else ""
        server = _host_spec(path, "", url, top, _TOP_KEYS - {"host"}, ALL_CAPABILITIES)
    return _FileSpec(mirrors=tuple(mirrors), server=server)


# ---- resolution --------------------------------------------------------------------------


def _api_url(url: str, override_path: bool) -> str:
    if override_path or url.endswith("/v2"):
        return url
    return f"{url}/v2"


def _certs_dir_tls(d: str) -> TLSConfig | None:
    """Docker's ``certs.d`` layout without a hosts.toml: ``*.crt`` CAs, ``*.cert``+``*.key``."""
    cas = sorted(glob.glob(os.path.join(d, "*.crt")))
    pairs = []
    for cert in sorted(glob.glob(os.path.join(d, "*.cert"))):
        key = cert[: -len(".cert")] + ".key"
        if os.path.exists(key):
            pairs.append((cert, key))
    if not cas and not pairs:
        return None
    return TLSConfig(ca=tuple(cas), client=tuple(pairs))


class RegistryHosts:
    """Answers "which endpoints, in which order, serve images of this domain"."""

    def __init__(self, config_path: str | None) -> None:
        self.config_path = config_path
        self._files: dict[str, tuple[tuple[int, int], _FileSpec]] = {}
        self._contexts: dict[TLSConfig, ssl.SSLContext] = {}

    def _load(self, path: str) -> _FileSpec | None:
        """The parsed file, re-read only when its mtime or size changed; None if absent."""
        try:
            st = os.stat(path)
        except FileNotFoundError:
            self._files.pop(path, None)
            return None
        except OSError as e:
            raise InvalidArgument(f"registry host config {path}: {e.strerror}") from None
        stamp = (st.st_mtime_ns, st.st_size)
        cached = self._files.get(path)
        if cached is not None and cached[0] == stamp:
            return cached[1]
        try:
            with open(path, "rb") as f:
                data = f.read()
        except OSError as e:
            raise InvalidArgument(f"registry host config {path}: {e.strerror}") from None
        spec = parse_hosts_toml(path, data)
        self._files[path] = (stamp, spec)
        return spec

    def ssl_context(self, tls: TLSConfig) -> ssl.SSLContext:
        """One context per distinct TLS config: the system trust plus the configured CAs."""
        ctx = self._contexts.get(tls)
        if ctx is not None:
            return ctx
        ctx = ssl.create_default_context()
        for ca in tls.ca:
            try:
                ctx.load_verify_locations(cafile=ca)
            except (OSError, ssl.SSLError) as e:
                raise InvalidArgument(
                    f"registry host config: cannot load CA certificate {ca}: {_why(e)}") from None
        # OpenSSL keeps one certificate per key type; the first pair is the one used.
        for cert, key in tls.client[:1]:
            try:
                ctx.load_cert_chain(cert, key or None)
            except (OSError, ssl.SSLError) as e:
                raise InvalidArgument(
                    f"registry host config: cannot load client certificate {cert}"
                    f"{' with key ' + key if key else ''}: {_why(e)}") from None
        if tls.skip_verify:
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        self._contexts[tls] = ctx
        return ctx

    def _host(self, spec: _HostSpec, *, mirror: bool, fallback: bool = False) -> RegistryHost:
        u = urlsplit(spec.url)
        return RegistryHost(
            url=_api_url(spec.url, spec.override_path), host=u.netloc,
            capabilities=spec.capabilities,
            ssl=self.ssl_context(spec.tls) if u.scheme == "https" else None,
            headers=spec.headers, is_mirror=mirror, http_fallback=fallback, tls=spec.tls,
        )

    def hosts_for(self, domain: str) -> list[RegistryHost]:
        """Mirrors in file order, then the server; the first file found wins."""
        spec: _FileSpec | None = None
        certs_tls: TLSConfig | None = None
        if self.config_path:
            for name in (domain, _DEFAULT_DIR):
                d = os.path.join(self.config_path, name)
                spec = self._load(os.path.join(d, "hosts.toml"))
                if spec is not None:
                    break
                if name == domain and os.path.isdir(d):
                    certs_tls = _certs_dir_tls(d)
                    if certs_tls is not None:
                        break
        default = _HostSpec(url=default_server(domain), capabilities=ALL_CAPABILITIES,
                            tls=certs_tls or TLSConfig(), override_path=False, headers=())
        if spec is None:
            fallback = certs_tls is None and is_loopback(domain)
            return [self._host(default, mirror=False, fallback=fallback)]
        out = [self._host(m, mirror=True) for m in spec.mirrors]
        server = spec.server
        if server is None:
            out.append(self._host(default, mirror=False))
        else:
            if not server.url:
                server = _HostSpec(url=default.url, capabilities=server.capabilities,
                                   tls=server.tls, override_path=server.override_path,
                                   headers=server.headers)
            out.append(self._host(server, mirror=False))
        return out
