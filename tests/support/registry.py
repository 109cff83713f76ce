"""A real registry for image tests: Debian's ``docker-registry`` (distribution 2.8) as a subprocess.

Each :class:`LocalRegistry` gets its own config, storage and port under a temporary
directory, listens on 127.0.0.1 only, and is always stopped: by its context manager,
by the fixture finalizer, by an ``atexit`` hook, and — if the test process itself is
killed — by the kernel, through ``PR_SET_PDEATHSIG``.

Variants: no auth, ``auth="basic"`` (bcrypt htpasswd), ``auth="token"`` (Bearer tokens
from :class:`TokenServer`, running in this process), ``tls=True`` and, on top of TLS,
``client_ca=True`` (client certificates required).

What distribution 2.8 checks in a token (registry/auth/token/token.go): ``iss`` equals
the configured issuer, ``aud`` equals the configured service, ``exp``/``nbf`` within a
60 s leeway, and a signing key found from the header, trying ``x5c`` first (a chain
that must verify up to a cert in ``rootcertbundle``), then ``jwk``, then ``kid`` (a
libtrust fingerprint, which v3 replaced by an RFC 7638 thumbprint). We send ``x5c``:
it works the same on 2.8 and 3.x. ``aud`` must be a single string for 2.8.
"""

from __future__ import annotations

import atexit
import base64
import contextlib
import http.client
import json
import secrets
import socket
import ssl
import subprocess
import threading
import time
import urllib.parse
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import bcrypt
import jwt
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from tests.support.certs import TestPKI, make_pki

REGISTRY_BIN = "/usr/bin/docker-registry"
SERVICE = "pycrid-test-registry"
ISSUER = "pycrid-test-token-issuer"

Creds = tuple[str, str]


def free_port() -> int:
    """A port that was free a moment ago; the caller must cope with losing the race."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def dying_with_parent(argv: list[str]) -> list[str]:
    """``argv`` run so that the kernel kills it if the test process dies without cleaning
    up (SIGKILL, a crashed interpreter): util-linux's setpriv sets the parent-death signal
    and execs it. Not Python code between fork and exec (``preexec_fn``): with gRPC's
    threads in the test process, its fork handlers can kill that child before the exec.
    PDEATHSIG follows the forking *thread*, so only from the main thread."""
    if threading.current_thread() is not threading.main_thread():
        return argv
    return ["setpriv", "--pdeathsig", "KILL", *argv]


# ---------------------------------------------------------------------------
# Token server


@dataclass
class TokenRequest:
    """One request seen by the token server, for tests that check the client's auth flow."""

    method: str
    user: str | None
    service: str | None
    scopes: list[str]
    status: int


def _parse_scope(scope: str) -> dict[str, Any] | None:
    # "repository:some/name:pull,push"; the name may itself hold a colon (host:port/...).
    kind, sep, rest = scope.partition(":")
    name, sep2, actions = rest.rpartition(":")
    if not sep or not sep2 or not name:
        return None
    return {"type": kind, "name": name, "actions": [a for a in actions.split(",") if a]}


class TokenServer:
    """A minimal Docker token service on 127.0.0.1, run in a background thread.

    ``GET /token?service=..&scope=..`` with HTTP Basic credentials (what the Docker
    token spec describes) and ``POST /token`` with an OAuth2 password grant form (what
    containerd tries first when it has credentials) both answer ``{"token",
    "access_token", "expires_in", "issued_at"}``. Valid users get every action they
    asked for; unknown users and missing credentials get 401.
    """

    def __init__(self, users: dict[str, str], pki: TestPKI, *, ttl: int = 300) -> None:
        self.users = dict(users)
        self.ttl = ttl
        self.requests: list[TokenRequest] = []
        self._key = Path(pki.token_key).read_bytes()
        cert = x509.load_pem_x509_certificate(Path(pki.token_cert).read_bytes())
        self._x5c = [base64.b64encode(cert.public_bytes(serialization.Encoding.DER)).decode()]
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def realm(self) -> str:
        assert self._httpd is not None
        return f"http://127.0.0.1:{self._httpd.server_address[1]}/token"

    def issue(self, user: str, scopes: list[str], service: str = SERVICE) -> str:
        """A signed token granting ``scopes`` to ``user`` (also handy for tests that forge one)."""
        now = int(time.time())
        access = [a for a in (_parse_scope(s) for s in scopes) if a is not None]
        claims = {
            "iss": ISSUER, "sub": user, "aud": service,
            "exp": now + self.ttl, "nbf": now - 5, "iat": now,
            "jti": uuid.uuid4().hex, "access": access,
        }
        return jwt.encode(claims, self._key, algorithm="ES256", headers={"x5c": self._x5c})

    def _check(self, user: str | None, password: str | None) -> bool:
        return user is not None and self.users.get(user) == password

    def start(self) -> None:
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                pass  # keep pytest output clean

            def _reply(self, status: int, body: dict[str, Any]) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                if status == 401:
                    self.send_header("WWW-Authenticate", 'Basic realm="pycrid-test-token"')
                self.end_headers()
                self.wfile.write(data)

            def _answer(self, method: str, user: str | None, password: str | None,
                        params: dict[str, list[str]]) -> None:
                scopes = [s for v in params.get("scope", []) for s in v.split(" ") if s]
                service = params.get("service", [None])[0]
                ok = server._check(user, password)
                server.requests.append(
                    TokenRequest(method, user, service, scopes, 200 if ok else 401))
                if not ok:
                    self._reply(401, {"errors": [{"code": "UNAUTHORIZED"}]})
                    return
                assert user is not None
                token = server.issue(user, scopes, service or SERVICE)
                self._reply(200, {
                    "token": token, "access_token": token, "expires_in": server.ttl,
                    "issued_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                })

            def do_GET(self) -> None:
                url = urllib.parse.urlsplit(self.path)
                if url.path != "/token":
                    self._reply(404, {})
                    return
                user = password = None
                header = self.headers.get("Authorization", "")
                if header.lower().startswith("basic "):
                    with contextlib.suppress(ValueError):
                        raw = base64.b64decode(header[6:]).decode()
                        user, _, password = raw.partition(":")
                self._answer("GET", user, password, urllib.parse.parse_qs(url.query))

            def do_POST(self) -> None:
                if urllib.parse.urlsplit(self.path).path != "/token":
                    self._reply(404, {})
                    return
                length = int(self.headers.get("Content-Length") or 0)
                form = urllib.parse.parse_qs(self.rfile.read(length).decode())
                if form.get("grant_type", [""])[0] != "password":
                    self._reply(400, {"error": "unsupported_grant_type"})
                    return
                self._answer("POST", form.get("username", [None])[0],
                             form.get("password", [None])[0], form)

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, name="token-server", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None


# ---------------------------------------------------------------------------
# A small synchronous client for the distribution API


@dataclass
class Response:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


class RegistryError(Exception):
    pass


def parse_challenge(header: str) -> tuple[str, dict[str, str]]:
    """``Bearer realm="..",service=".."`` -> ("bearer", {"realm": .., "service": ..})."""
    scheme, _, rest = header.strip().partition(" ")
    params: dict[str, str] = {}
    i = 0
    while i < len(rest):
        eq = rest.find("=", i)
        if eq < 0:
            break
        key = rest[i:eq].strip().strip(",").strip().lower()
        i = eq + 1
        if i < len(rest) and rest[i] == '"':
            end = rest.find('"', i + 1)
            end = len(rest) if end < 0 else end
            params[key] = rest[i + 1:end]
            i = end + 1
        else:
            end = rest.find(",", i)
            end = len(rest) if end < 0 else end
            params[key] = rest[i:end].strip()
            i = end
        while i < len(rest) and rest[i] in ", ":
            i += 1
    return scheme.lower(), params


class RegistryClient:
    """Talks to one :class:`LocalRegistry`, answering Basic and Bearer challenges.

    This is test tooling, deliberately independent of pycrid's own registry client,
    so that a bug there cannot hide itself by also being in the fixtures.
    """

    def __init__(self, registry: LocalRegistry, creds: Creds | None = None, *,
                 verify: bool = True, client_cert: bool = True, timeout: float = 30) -> None:
        self.registry = registry
        self.timeout = timeout
        self.creds = creds
        self._ssl: ssl.SSLContext | None = None
        if registry.tls:
            self._ssl = registry.ssl_context(verify=verify, client_cert=client_cert)
        self._auth: str | None = None
        self._tokens: dict[str, str] = {}

    def _send(self, method: str, path: str, body: bytes, headers: dict[str, str]) -> Response:
        host, port = "127.0.0.1", self.registry.port
        conn: http.client.HTTPConnection
        if self._ssl is not None:
            conn = http.client.HTTPSConnection(host, port, context=self._ssl,
                                               timeout=self.timeout)
        else:
            conn = http.client.HTTPConnection(host, port, timeout=self.timeout)
        try:
            conn.request(method, path, body=body or None, headers=headers)
            resp = conn.getresponse()
            data = resp.read()
            return Response(resp.status, {k.lower(): v for k, v in resp.getheaders()}, data)
        finally:
            conn.close()

    def _token(self, params: dict[str, str]) -> str:
        scope = params.get("scope", "")
        if scope in self._tokens:
            return self._tokens[scope]
        if self.creds is None:
            raise RegistryError("registry wants a token but no credentials were given")
        pairs = [("service", params.get("service", ""))]
        pairs += [("scope", s) for s in scope.split(" ") if s]
        query = urllib.parse.urlencode(pairs)
        url = urllib.parse.urlsplit(params["realm"])
        conn = http.client.HTTPConnection(url.hostname or "127.0.0.1", url.port or 80, timeout=30)
        basic = base64.b64encode(f"{self.creds[0]}:{self.creds[1]}".encode()).decode()
        try:
            conn.request("GET", f"{url.path}?{query}", headers={"Authorization": f"Basic {basic}"})
            resp = conn.getresponse()
            data = resp.read()
        finally:
            conn.close()
        if resp.status != 200:
            raise RegistryError(f"token server said {resp.status}: {data!r}")
        token = str(json.loads(data)["token"])
        self._tokens[scope] = token
        return token

    def request(self, method: str, path: str, *, body: bytes = b"",
                headers: dict[str, str] | None = None) -> Response:
        """One API call; on 401 it authenticates once from the challenge and retries."""
        hdrs = dict(headers or {})
        if self._auth is not None:
            hdrs["Authorization"] = self._auth
        resp = self._send(method, path, body, hdrs)
        if resp.status != 401 or self.creds is None:
            return resp
        scheme, params = parse_challenge(resp.headers.get("www-authenticate", ""))
        if scheme == "basic":
            basic = base64.b64encode(f"{self.creds[0]}:{self.creds[1]}".encode()).decode()
            self._auth = f"Basic {basic}"
        elif scheme == "bearer":
            self._auth = f"Bearer {self._token(params)}"
        else:
            return resp
        hdrs["Authorization"] = self._auth
        return self._send(method, path, body, hdrs)


# ---------------------------------------------------------------------------
# The registry process


_LIVE: set[LocalRegistry] = set()


@atexit.register
def _stop_all() -> None:
    for reg in list(_LIVE):
        reg.stop()


@dataclass(eq=False)
class LocalRegistry:
    """A ``docker-registry`` subprocess with its own config, storage and port.

    ``workdir`` holds ``config.yml``, ``storage/``, ``htpasswd`` and ``registry.log``
    (read the log when a test fails). Use as a context manager, or call
    :meth:`start` / :meth:`stop`; :meth:`stop` is idempotent.
    """

    workdir: Path
    auth: str | None = None
    users: dict[str, str] = field(default_factory=dict)
    tls: bool = False
    client_ca: bool = False
    pki: TestPKI | None = None
    port: int = 0
    process: subprocess.Popen[bytes] | None = None
    token_server: TokenServer | None = None

    def __post_init__(self) -> None:
        self.workdir = Path(self.workdir)
        if self.auth not in (None, "basic", "token"):
            raise ValueError(f"auth must be None, 'basic' or 'token', not {self.auth!r}")
        if self.auth and not self.users:
            raise ValueError("an auth registry needs at least one user")
        if self.client_ca and not self.tls:
            raise ValueError("client_ca=True needs tls=True")
        if (self.tls or self.auth == "token") and self.pki is None:
            self.pki = make_pki(self.workdir / "pki")

    # -- addresses and credentials -----------------------------------------------------

    @property
    def host(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def scheme(self) -> str:
        return "https" if self.tls else "http"

    @property
    def url(self) -> str:
        return f"{self.scheme}://{self.host}"

    @property
    def ca_path(self) -> str | None:
        return self.pki.ca_cert if self.tls and self.pki else None

    @property
    def client_cert(self) -> str | None:
        return self.pki.client_cert if self.client_ca and self.pki else None

    @property
    def client_key(self) -> str | None:
        return self.pki.client_key if self.client_ca and self.pki else None

    @property
    def creds(self) -> Creds | None:
        """The first user's credentials, or None for a registry without auth."""
        if not self.auth:
            return None
        user = next(iter(self.users))
        return user, self.users[user]

    @property
    def log_path(self) -> Path:
        return self.workdir / "registry.log"

    def ref(self, name: str) -> str:
        """``busybox:latest`` -> ``127.0.0.1:PORT/busybox:latest``."""
        return f"{self.host}/{name}"

    def ssl_context(self, *, verify: bool = True, client_cert: bool = True) -> ssl.SSLContext:
        """A client context trusting the test CA (``verify``), presenting the client cert."""
        ctx = ssl.create_default_context(cafile=self.ca_path if verify else None)
        if client_cert and self.client_cert and self.client_key:
            ctx.load_cert_chain(self.client_cert, self.client_key)
        return ctx

    def client(self, creds: Creds | None = None, **kw: Any) -> RegistryClient:
        """A client; ``creds`` defaults to the registry's first user."""
        return RegistryClient(self, creds if creds is not None else self.creds, **kw)

    def hosts_dir(self, tmp: str | Path) -> str:
        """Write a containerd-style ``<tmp>/<host:port>/hosts.toml``; return ``tmp``.

        Point a ``config_path`` at the returned directory.
        """
        d = Path(tmp) / self.host
        d.mkdir(parents=True, exist_ok=True)
        lines = [f"server = {json.dumps(self.url)}", "", f"[host.{json.dumps(self.url)}]",
                 '  capabilities = ["pull", "resolve"]']
        if self.tls:
            lines.append(f"  ca = {json.dumps(self.ca_path)}")
            if self.client_cert:
                lines.append(f"  client = [[{json.dumps(self.client_cert)}, "
                             f"{json.dumps(self.client_key)}]]")
        (d / "hosts.toml").write_text("\n".join(lines) + "\n")
        return str(tmp)

    # -- lifecycle -----------------------------------------------------------------

    def _config(self) -> dict[str, Any]:
        http_cfg: dict[str, Any] = {
            "addr": self.host,
            "secret": secrets.token_hex(16),
            "headers": {"X-Content-Type-Options": ["nosniff"]},
        }
        if self.tls:
            assert self.pki is not None
            http_cfg["tls"] = {"certificate": self.pki.server_cert, "key": self.pki.server_key}
            if self.client_ca:
                http_cfg["tls"]["clientcas"] = [self.pki.client_ca_cert]
        cfg: dict[str, Any] = {
            "version": "0.1",
            "log": {"level": "info", "formatter": "text", "accesslog": {"disabled": False}},
            "storage": {
                "filesystem": {"rootdirectory": str(self.workdir / "storage")},
                "delete": {"enabled": True},
                "maintenance": {"uploadpurging": {"enabled": False}},
            },
            "http": http_cfg,
            "health": {"storagedriver": {"enabled": False}},
        }
        if self.auth == "basic":
            htpasswd = self.workdir / "htpasswd"
            htpasswd.write_text("".join(
                f"{u}:{bcrypt.hashpw(p.encode(), bcrypt.gensalt(rounds=4)).decode()}\n"
                for u, p in self.users.items()))
            cfg["auth"] = {"htpasswd": {"realm": "pycrid-test", "path": str(htpasswd)}}
        elif self.auth == "token":
            assert self.pki is not None and self.token_server is not None
            cfg["auth"] = {"token": {
                "realm": self.token_server.realm, "service": SERVICE,
                "issuer": ISSUER, "rootcertbundle": self.pki.ca_cert,
            }}
        return cfg

    def start(self, timeout: float = 15.0) -> LocalRegistry:
        if self.process is not None:
            return self
        self.workdir.mkdir(parents=True, exist_ok=True)
        if self.auth == "token" and self.token_server is None:
            assert self.pki is not None
            self.token_server = TokenServer(self.users, self.pki)
            self.token_server.start()
        _LIVE.add(self)
        try:
            for _attempt in range(5):
                self.port = free_port()
                if self._launch(timeout):
                    return self
            raise RegistryError(f"docker-registry never came up: {self.log_path.read_text()}")
        except BaseException:
            self.stop()
            raise

    def _launch(self, timeout: float) -> bool:
        """Start on ``self.port``; False if the port was taken meanwhile (retry another)."""
        config = self.workdir / "config.yml"
        # JSON is YAML, and it spares a YAML emitter.
        config.write_text(json.dumps(self._config(), indent=2))
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                dying_with_parent([REGISTRY_BIN, "serve", str(config)]),
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                cwd=self.workdir, env={"PATH": "/usr/bin:/bin"},
            )
        deadline = time.monotonic() + timeout
        # A short timeout: whoever won a port race may accept and never answer.
        probe = RegistryClient(self, None, timeout=0.5)
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                self.process = None
                if "address already in use" in self.log_path.read_text():
                    return False
                raise RegistryError(f"docker-registry exited: {self.log_path.read_text()}")
            with contextlib.suppress(OSError, http.client.HTTPException):
                resp = probe.request("GET", "/v2/")
                if resp.status in (200, 401):
                    return True
            time.sleep(0.02)
        raise RegistryError(f"docker-registry did not answer in {timeout}s: "
                            f"{self.log_path.read_text()}")

    def stop(self) -> None:
        """Kill the process and wait for it; stop the token server. Safe to call twice."""
        proc, self.process = self.process, None
        if proc is not None:
            with contextlib.suppress(ProcessLookupError):
                proc.terminate()
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if self.token_server is not None:
            self.token_server.stop()
            self.token_server = None
        _LIVE.discard(self)

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    def __enter__(self) -> LocalRegistry:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


@contextlib.contextmanager
def local_registry(workdir: str | Path, **kwargs: Any) -> Iterator[LocalRegistry]:
    """``with local_registry(tmp, auth="basic", users={...}) as reg:`` — always stopped."""
    reg = LocalRegistry(Path(workdir), **kwargs)
    with reg:
        yield reg
