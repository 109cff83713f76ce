"""The daemon: plugins initialised in order, the CRI socket served, a clean stop on SIGTERM."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import warnings
from typing import Any

import grpc

from pycrid import endpoints, preflight, release
from pycrid.builtins import GRPC, registry
from pycrid.config.decode import ConfigError
from pycrid.config.loader import LoadedConfig
from pycrid.config.schema import GrpcConfig
from pycrid.errors import FailedPrecondition
from pycrid.metrics import Metrics
from pycrid.pathlock import PathLock
from pycrid.plugin.startup import init_all
from pycrid.sdnotify import Notifier
from pycrid.tasks import Owner
from pycrid.unixsock import SocketFile, check_free, publish

log = logging.getLogger("pycrid")


CRI_SOCKET_HINT = "choose another --address ([grpc] address)"


def use_pidfd_child_watcher() -> None:
    """Learn of child exits (runc, conmon, CNI plugins) through a pidfd on the event loop.
    Python 3.11's default watcher starts a thread per child to wait for it, which was a
    tenth of the daemon's time in a pod's lifecycle."""
    if hasattr(os, "pidfd_open") and hasattr(asyncio, "PidfdChildWatcher"):
        with warnings.catch_warnings():  # deprecated from 3.12, where pidfd is the default
            warnings.simplefilter("ignore", DeprecationWarning)
            asyncio.set_child_watcher(asyncio.PidfdChildWatcher())


def socket_path(address: str) -> str:
    return address[len("unix://"):] if address.startswith("unix://") else address


#: The lock file in the root and in the state directory (the CRI socket's is
#: ``<socket>.lock``).
LOCK_NAME = "pycrid.lock"


def node_locks(root: str, state: str, socket: str) -> list[PathLock]:
    """The locks that make this daemon the only one using its root, state and CRI socket
    (one file per distinct path: root and state may be the same directory)."""
    wanted = [
        (os.path.join(root, LOCK_NAME), f"the root directory {root}",
         "choose another --root (root)"),
        (os.path.join(state, LOCK_NAME), f"the state directory {state}",
         "choose another --state (state)"),
        (socket + ".lock", f"the CRI socket {socket}", CRI_SOCKET_HINT),
    ]
    locks: dict[str, PathLock] = {}
    for path, what, hint in wanted:
        locks.setdefault(os.path.realpath(path), PathLock(path, what=what, hint=hint))
    return list(locks.values())


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
    endpoints.check_distinct(loaded)  # before anything is bound (or even locked)
    runtime_cfg = loaded.plugins.get("pycrid.cri.v1.runtime")
    preflight.check_cgroup_driver(getattr(runtime_cfg, "cgroup_driver", "cgroupfs"))
    preflight.check_cgroups()
    _make_dir(cfg.root, 0o700, "the root directory", "set root (--root) to a writable path")
    _make_dir(cfg.state, 0o711, "the state directory", "set state (--state) to a writable path")
    path = socket_path(cfg.grpc.address)
    _make_dir(os.path.dirname(path), 0o711, "the CRI socket directory", CRI_SOCKET_HINT)
    with contextlib.ExitStack() as held:
        for lock in node_locks(cfg.root, cfg.state, path):
            lock.acquire()
            held.callback(lock.release)
        # Before any plugin starts: a foreign server on the socket stops us at once.
        check_free(path, what="the CRI socket", hint=CRI_SOCKET_HINT)
        await _serve_locked(loaded, notifier, path)
    log.info("stopped")


async def _serve_locked(loaded: LoadedConfig, notifier: Notifier, path: str) -> None:
    cfg = loaded.config
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    plugins = None
    ready = False
    server: grpc.aio.Server | None = None
    cri_socket: SocketFile | None = None
    services: dict[str, Any] = {}
    metrics = Metrics()
    #: The root of the daemon's tree of task owners: each plugin's owner is a child.
    owner = Owner("pycrid")
    metrics_server: Any = None
    tracer = None
    try:
        if cfg.tracing.endpoint:
            from pycrid.tracing import start_tracing

            tracer = start_tracing(cfg.tracing)
        plugins = await init_all(
            registry(), configs=loaded.plugins, disabled=cfg.disabled_plugins,
            properties={"root": cfg.root, "state": cfg.state, "loaded_config": loaded,
                        "metrics": metrics, "tracer": tracer, "owner": owner})
        if cfg.metrics.address:
            from pycrid.metrics.endpoint import MetricsServer  # aiohttp.web only when served

            metrics_server = MetricsServer(metrics, cfg.metrics.address)
            await metrics_server.start()
        server = grpc.aio.server(options=[
            ("grpc.max_receive_message_length", cfg.grpc.max_recv_message_size),
            ("grpc.max_send_message_length", cfg.grpc.max_send_message_size),
        ])
        services = plugins.get_by_type(GRPC)
        for svc in services.values():
            svc.register(server)
        grpc_server = server
        cri_socket = publish(
            path, lambda at: _add_unix_port(grpc_server, at), what="the CRI socket",
            hint=CRI_SOCKET_HINT, mode=0o660,
            uid=cfg.grpc.uid, gid=cfg.grpc.gid)
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
        log.info("%s serving CRI on %s", release.describe(), path)
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
            with (cri_socket.foreign_kept() if cri_socket is not None
                  else contextlib.nullcontext()):
                await server.stop(grace=5)
        if metrics_server is not None:
            await metrics_server.aclose()
        if plugins is not None:
            await plugins.close()
        await owner.aclose()  # whatever a plugin left running
        if tracer is not None:
            tracer.shutdown()  # flushes the spans still batched
        if cri_socket is not None:
            cri_socket.remove()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)


def _add_unix_port(server: grpc.aio.Server, path: str) -> None:
    if not server.add_insecure_port(f"unix://{path}"):  # older grpcio: 0 instead of raising
        raise FailedPrecondition(f"cannot listen on {path}")
