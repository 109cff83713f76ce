"""Exec, Attach and PortForward: the checks the CRI calls make before a URL is handed
out, and the sessions the streaming server runs behind it (its ``StreamRuntime``).

The checks and messages follow containerd's (``container_exec.go``, and the
``cri-streaming`` server's request validation). A session checks again when
the client connects, since a minute may have passed, and ends with an error
when its container or pod goes away (:mod:`sessions`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence

from cri_api.v1 import api_pb2 as pb

from pycrid.core.containers import ContainerParts, state_name
from pycrid.core.containers.exec import running
from pycrid.core.pods.pod_parts import PodParts
from pycrid.core.sessions import until_ended
from pycrid.errors import FailedPrecondition, InvalidArgument
from pycrid.network.sandbox_network import SandboxNetwork
from pycrid.stdio import (
    AttachRequest,
    ByteStream,
    ExecRequest,
    PortForwardRequest,
    ProcessIO,
    StreamError,
)
from pycrid.store.records import ContainerRecord, SandboxRecord
from pycrid.tasks import Owner

log = logging.getLogger(__name__)

#: After the pod's side of a forwarded connection closed, how long the client's side
#: may still send (containerd and socat wait one second).
FORWARD_LINGER = 1.0


def _check_stdio(tty: bool, stdin: bool, stdout: bool, stderr: bool) -> None:
    if tty and stderr:
        raise InvalidArgument("tty and stderr cannot both be true (a terminal has one "
                              "output stream)")
    if not (stdin or stdout or stderr):
        raise InvalidArgument("one of stdin, stdout, or stderr must be set")


class ContainerStreams:
    def __init__(self, containers: ContainerParts, pods: PodParts) -> None:
        self.containers = containers
        self.pods = pods
        self.sessions = containers.sessions

    # ---- the CRI calls -----------------------------------------------------------------

    def exec_request(self, container_id: str, cmd: Sequence[str], *, tty: bool, stdin: bool,
                     stdout: bool, stderr: bool) -> ExecRequest:
        if not cmd:
            raise InvalidArgument("exec command must not be empty")
        _check_stdio(tty, stdin, stdout, stderr)
        rec = self._running(container_id)
        return ExecRequest(rec.id, tuple(cmd), tty, stdin, stdout, stderr)

    def attach_request(self, container_id: str, *, tty: bool, stdin: bool, stdout: bool,
                       stderr: bool) -> AttachRequest:
        _check_stdio(tty, stdin, stdout, stderr)
        rec = self._running(container_id)
        return AttachRequest(rec.id, tty, stdin, stdout, stderr)

    def port_forward_request(self, sandbox_id: str, ports: Sequence[int]) -> PortForwardRequest:
        if not sandbox_id:
            raise InvalidArgument("pod_sandbox_id must not be empty")
        bad = [p for p in ports if not 0 < p <= 65535]
        if bad:
            raise InvalidArgument(f"port {bad[0]} is out of range 1-65535")
        rec = self.pods.find(sandbox_id)
        if not rec.ready:
            raise FailedPrecondition(f"pod sandbox {rec.id} is not ready")
        return PortForwardRequest(rec.id, tuple(ports))

    def _running(self, container_id: str) -> ContainerRecord:
        if not container_id:
            raise InvalidArgument("container_id must not be empty")
        return running(self.containers, container_id)

    # ---- the sessions (StreamRuntime) ---------------------------------------------------

    def _session_container(self, cid: str) -> ContainerRecord:
        rec = self.containers.store.get(cid)
        if rec is None:
            raise StreamError(f"container {cid} not found")
        if rec.state != pb.CONTAINER_RUNNING:
            raise StreamError(f"container {cid} is in {state_name(rec.state)} state, "
                              f"not running")
        return rec

    async def exec(self, request: ExecRequest, io: ProcessIO) -> int:
        rec = self._session_container(request.container_id)
        process = self.containers.bundles.read_spec(rec.id)["process"]
        process["args"] = list(request.cmd)
        process["terminal"] = request.tty
        if request.tty:  # containerd sets TERM for terminal execs
            env = [e for e in process.get("env", []) if not e.startswith("TERM=")]
            process["env"] = [*env, "TERM=xterm"]
        with self.sessions.track(rec.id) as ended:
            return await until_ended(
                self.containers.runtime.exec_stream(rec.id, process, io), ended)

    async def attach(self, request: AttachRequest, io: ProcessIO) -> None:
        rec = self._session_container(request.container_id)
        if not rec.config.stdin:
            io.stdin = None  # the container has no stdin to write to (containerd)
        with self.sessions.track(rec.id) as ended:
            await until_ended(
                self.containers.runtime.attach(self.containers.paths.bundle(rec.id), io),
                ended)

    async def port_forward(self, sandbox_id: str, port: int, stream: ByteStream) -> None:
        rec = self._session_pod(sandbox_id)
        with self.sessions.track(rec.id) as ended:
            await until_ended(_forward(self.pods.network, rec, port, stream), ended)

    def _session_pod(self, sid: str) -> SandboxRecord:
        rec = self.pods.store.get(sid)
        if rec is None:
            raise StreamError(f"pod sandbox {sid} not found")
        if not rec.ready:
            raise StreamError(f"pod sandbox {sid} is not ready")
        return rec


async def _forward(network: SandboxNetwork, rec: SandboxRecord, port: int,
                   stream: ByteStream) -> None:
    """Copy between the client and ``localhost:port`` in the pod's network namespace
    (IPv4, then IPv6, as containerd dials)."""
    try:
        sock = await network.dial(rec.netns, port)
    except OSError as e:
        where = f"network namespace {rec.netns}" if rec.netns else "the host network"
        raise StreamError(f"failed to connect to localhost:{port} inside {where}: "
                          f"{e.strerror or e}") from None
    reader, writer = await asyncio.open_connection(sock=sock)

    async def upstream() -> None:
        with contextlib.suppress(ConnectionError, OSError):
            while data := await stream.read():
                writer.write(data)
                await writer.drain()
            if writer.can_write_eof():
                writer.write_eof()  # the client is done sending; the pod may still answer

    async def downstream() -> None:
        with contextlib.suppress(ConnectionError, OSError):
            while data := await reader.read(65536):
                await stream.write(data)

    # The pod's side sets the pace: once it closed, the client's side gets the linger to
    # finish sending, then both end.
    pumps = Owner(f"port-forward {rec.id[:12]}:{port}")
    up = pumps.spawn(upstream(), "client to pod")
    try:
        await downstream()
        await asyncio.wait({up}, timeout=FORWARD_LINGER)
    finally:
        await pumps.aclose()
        writer.close()
