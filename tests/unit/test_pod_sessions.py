"""Streaming sessions of pods: ending a session (until_ended), the port-forward pump's
linger, and the start-up sweep of network traces no pod owns."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from cri_api.v1 import api_pb2 as pb

from pycrid.core import streams
from pycrid.core.sessions import SessionEnds, until_ended
from pycrid.network.netns_cni import NetnsCNI
from pycrid.stdio import StreamError
from pycrid.store.records import SandboxRecord

# ---- until_ended --------------------------------------------------------------------


async def test_until_ended_returns_the_work_result() -> None:
    async def work() -> int:
        await asyncio.sleep(0)
        return 7

    with SessionEnds().track("c1") as ended:
        assert await until_ended(work(), ended) == 7


async def test_until_ended_cancels_the_work_and_raises_the_reason() -> None:
    ends = SessionEnds()
    cancelled = asyncio.Event()

    async def work() -> int:
        try:
            await asyncio.sleep(3600)
        finally:
            cancelled.set()
        return 0

    with ends.track("c1") as ended:
        asyncio.get_running_loop().call_later(0.01, ends.end, "c1", "container c1 removed")
        with pytest.raises(StreamError, match="container c1 removed"):
            await until_ended(work(), ended)
        assert cancelled.is_set()
        assert ended.result() == "container c1 removed"  # the session's future is intact


async def test_until_ended_passes_the_work_error_on() -> None:
    async def work() -> int:
        raise StreamError("exec failed")

    with SessionEnds().track("c1") as ended, pytest.raises(StreamError, match="exec failed"):
        await until_ended(work(), ended)


# ---- the port-forward pump ----------------------------------------------------------


class _Client:
    """The client's side of a forwarded connection: what it sends, what it got."""

    def __init__(self, sends: list[bytes], *, then_wait: bool) -> None:
        self.sends = list(sends)
        self.then_wait = then_wait
        self.got = b""

    async def read(self) -> bytes:
        if self.sends:
            return self.sends.pop(0)
        if self.then_wait:
            await asyncio.sleep(3600)
        return b""

    async def write(self, data: bytes) -> None:
        self.got += data


def _pod(netns: str = "") -> SandboxRecord:
    return SandboxRecord(id="a" * 64, name="p", config=pb.PodSandboxConfig(),
                         runtime_handler="", created_at=0, netns=netns)


async def _forward_with(pod_side: Any, client: _Client) -> float:
    """Run the pump against a socketpair; ``pod_side`` plays the pod on the other end."""
    ours, theirs = socket.socketpair()
    ours.setblocking(False)

    async def dial(netns: str, port: int) -> socket.socket:
        return ours

    network = SimpleNamespace(dial=dial)
    loop = asyncio.get_running_loop()
    started = loop.time()
    pod = asyncio.create_task(asyncio.to_thread(pod_side, theirs))
    try:
        await streams._forward(network, _pod(), 80, client)  # type: ignore[arg-type]
    finally:
        await pod
        theirs.close()
    return loop.time() - started


async def test_forward_lingers_after_the_pod_closed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(streams, "FORWARD_LINGER", 0.2)

    def pod_side(sock: socket.socket) -> None:
        sock.sendall(b"hello")
        sock.shutdown(socket.SHUT_WR)

    client = _Client([], then_wait=True)  # never done sending: the linger ends it
    took = await _forward_with(pod_side, client)
    assert client.got == b"hello"
    assert 0.2 <= took < 5
    assert [t for t in asyncio.all_tasks() if "port-forward" in t.get_name()] == []


async def test_forward_ends_with_both_sides(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(streams, "FORWARD_LINGER", 30)

    def pod_side(sock: socket.socket) -> None:
        request = b""
        while chunk := sock.recv(100):  # until the client's EOF
            request += chunk
        sock.sendall(request.upper())
        sock.shutdown(socket.SHUT_WR)

    client = _Client([b"ping"], then_wait=False)
    took = await _forward_with(pod_side, client)
    assert client.got == b"PING"
    assert took < 5  # no linger: the client's side had finished first


async def test_forward_names_the_netns_it_could_not_reach() -> None:
    async def dial(netns: str, port: int) -> socket.socket:
        raise ConnectionRefusedError(111, "Connection refused")

    network = SimpleNamespace(dial=dial)
    with pytest.raises(StreamError, match="localhost:8080 inside network namespace /n/x: "
                                          "Connection refused"):
        await streams._forward(network, _pod("/n/x"), 8080,  # type: ignore[arg-type]
                               _Client([], then_wait=False))


# ---- the network's start-up sweep --------------------------------------------------


async def test_sweep_removes_unused_netns_and_unowned_attachments(tmp_path: Path) -> None:
    purged: list[str] = []
    detached: list[tuple[str, str, bool]] = []

    async def detach(sid: str, netns: str, config: pb.PodSandboxConfig, handler: str, *,
                     netns_alive: bool) -> None:
        detached.append((sid, handler, netns_alive))
        if sid == "gone2":
            raise RuntimeError("plugin missing")  # ignored: the cache entry still goes

    networks = SimpleNamespace(
        default_runtime="runc", detach=detach,
        cache=SimpleNamespace(owners=lambda: {"kept", "gone1", "gone2"},
                              purge=purged.append))
    netns_dir = tmp_path / "netns"
    net = NetnsCNI(networks, str(netns_dir))  # type: ignore[arg-type]
    for name in ("cni-used", "cni-stale", ".hidden"):
        (netns_dir / name).write_bytes(b"")
    removed = await net.sweep({"kept"}, {str(netns_dir / "cni-used")})
    assert removed == [f"netns {netns_dir / 'cni-stale'}", "CNI attachment of gone1",
                       "CNI attachment of gone2"]
    assert sorted(p.name for p in netns_dir.iterdir()) == [".hidden", "cni-used"]
    assert detached == [("gone1", "runc", False), ("gone2", "runc", False)]
    assert purged == ["gone1", "gone2"]
