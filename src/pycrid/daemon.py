"""The daemon: plugins initialised in order, the CRI socket served, a clean stop on SIGTERM."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import logging
import os
import signal
import socket
from typing import Any

import grpc

from pycrid import __version__, preflight
from pycrid.builtins import GRPC, registry
from pycrid.config.decode import ConfigError
from pycrid.config.loader import LoadedConfig
from pycrid.config.schema import GrpcConfig
from pycrid.errors import FailedPrecondition
from pycrid.metrics import Metrics
from pycrid.plugin.registry import init_all
from pycrid.sdnotify import Notifier

log = logging.getLogger("pycrid")


def socket_path(address: str) -> str:
    return address[len("unix://"):] if address.startswith("unix://") else address


class SocketLock:
    """Holds ``<socket>.lock`` for the daemon's lifetime, so a second daemon is refused.

    With the lock held, a socket file left by a daemon that died is stale and is replaced.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self._fd: int | None = None

    def acquire(self) -> None:
        _make_dir(os.path.dirname(self.path), 0o711, "the CRI socket directory",
                  "choose another --address ([grpc] address)")
        try:
            fd = os.open(self.path + ".lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        except OSError as e:
            raise FailedPrecondition(
                f"cannot create {self.path}.lock beside the CRI socket: {e.strerror}; the "
                "directory must be writable by root (or choose another --address)") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            os.close(fd)
            if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise FailedPrecondition(
                    f"another pycrid is already serving {self.path} (lock {self.path}.lock is "
                    "held); stop it first or choose another --address") from None
            raise
        self._fd = fd
        if os.path.exists(self.path):
            probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                probe.connect(self.path)
            except OSError:
                log.info("replacing stale socket %s", self.path)
                os.unlink(self.path)
            else:
                raise FailedPrecondition(
                    f"{self.path} is served by another process (not a pycrid holding the "
                    "lock); refusing to replace it")
            finally:
                probe.close()

    def release(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path)
            os.close(self._fd)
            self._fd = None


def _make_dir(path: str, mode: int, what: str, hint: str) -> None:
    try:
        os.makedirs(path, mode=mode, exist_ok=True)
    except OSError as e:
        why = ("it exists and is not a directory" if isinstance(e, FileExistsError)
               else f"{e.strerror} ({e.filename})")
        raise FailedPrecondition(f"cannot create {what} {path}: {why}; {hint}") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise FailedPrecondition(f"{what} {path} is not writable; {hint}")


def _read(key: str, path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as e:
        raise ConfigError(key, f"cannot read {path}: {e.strerror}") from None


def _tcp_credentials(cfg: GrpcConfig) -> grpc.ServerCredentials | None:
    if not cfg.tcp_tls_cert:
        return None
    cert = _read("grpc.tcp_tls_cert", cfg.tcp_tls_cert)
    key = _read("grpc.tcp_tls_key", cfg.tcp_tls_key)
    ca = _read("grpc.tcp_tls_ca", cfg.tcp_tls_ca) if cfg.tcp_tls_ca else None
    return grpc.ssl_server_credentials([(key, cert)], root_certificates=ca,
                                       require_client_auth=ca is not None)


async def serve(loaded: LoadedConfig) -> None:
    """Run until SIGTERM/SIGINT."""
    cfg = loaded.config
    notifier = Notifier.from_env()  # before any child (runc) could inherit NOTIFY_SOCKET
    for w in loaded.warnings:
        log.warning("config: %s", w)
    runtime_cfg = loaded.plugins.get("pycrid.cri.v1.runtime")
    preflight.check_cgroup_driver(getattr(runtime_cfg, "cgroup_driver", "cgroupfs"))
    preflight.check_cgroups()
    _make_dir(cfg.root, 0o700, "the root directory", "set root (--root) to a writable path")
    _make_dir(cfg.state, 0o711, "the state directory", "set state (--state) to a writable path")
    path = socket_path(cfg.grpc.address)
    lock = SocketLock(path)
    lock.acquire()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    plugins = None
    ready = False
    server: grpc.aio.Server | None = None
    services: dict[str, Any] = {}
    metrics = Metrics()
    metrics_server: Any = None
    tracer = None
    try:
        if cfg.tracing.endpoint:
            from pycrid.tracing import start_tracing

            tracer = start_tracing(cfg.tracing)
        plugins = await init_all(
            registry(), configs=loaded.plugins, disabled=cfg.disabled_plugins,
            properties={"root": cfg.root, "state": cfg.state, "loaded_config": loaded,
                        "metrics": metrics, "tracer": tracer})
        if cfg.metrics.address:
            from pycrid.metrics.server import MetricsServer  # aiohttp.web only when served

            metrics_server = MetricsServer(metrics, cfg.metrics.address)
            await metrics_server.start()
        server = grpc.aio.server(options=[
            ("grpc.max_receive_message_length", cfg.grpc.max_recv_message_size),
            ("grpc.max_send_message_length", cfg.grpc.max_send_message_size),
        ])
        services = plugins.get_by_type(GRPC)
        for svc in services.values():
            svc.register(server)
        old_umask = os.umask(0o117)  # the socket is born 0660
        try:
            server.add_insecure_port(f"unix://{path}")
        finally:
            os.umask(old_umask)
        os.chmod(path, 0o660)
        os.chown(path, cfg.grpc.uid, cfg.grpc.gid)
        cri_cfg = loaded.plugins.get(f"{GRPC}.cri")
        if cri_cfg is not None and not cri_cfg.disable_tcp_service:
            if not cfg.grpc.tcp_address:
                raise ConfigError("grpc.tcp_address",
                                  "must be set when disable_tcp_service is false")
            creds = _tcp_credentials(cfg.grpc)
            if creds is None:
                server.add_insecure_port(cfg.grpc.tcp_address)
            else:
                server.add_secure_port(cfg.grpc.tcp_address, creds)
            log.info("serving CRI on tcp %s (%s)", cfg.grpc.tcp_address,
                     "TLS" if creds else "plain")
        await server.start()
        log.info("pycrid %s serving CRI on %s", __version__, path)
        for svc in services.values():
            await svc.start()
        await plugins.wait_ready()
        log.info("pycrid is ready")
        ready = notifier.ready(f"serving CRI on {path}")
        await stop.wait()
        log.info("stopping")
    finally:
        if ready:
            notifier.stopping()
        if server is not None:
            for svc in services.values():
                svc.end_streams()  # open event streams would hold up the grace period
            await server.stop(grace=5)
        if metrics_server is not None:
            await metrics_server.aclose()
        if plugins is not None:
            await plugins.close()
        if tracer is not None:
            tracer.shutdown()  # flushes the spans still batched
        lock.release()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
    log.info("stopped")
