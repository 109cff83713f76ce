"""The containerd socket in-process: the calls cAdvisor's containerd driver makes (with its
namespace metadata), List with filters, what is not served, and the socket's claim rules
(pycrid/unixsock.py: a stale file is replaced, a live listener or a non-socket is refused,
close removes only its own socket). Real pods behind it: tests/e2e/test_cadvisor.py and
test_kubelet.py."""

from __future__ import annotations

import json
import os
import socket
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from cri_api.v1 import api_pb2 as pb
from google.protobuf.empty_pb2 import Empty

from pycrid.cadvisor.containerd_api import handlers
from pycrid.cadvisor.containerd_socket import ContainerdEndpoint
from pycrid.cadvisor.proto import containers_pb2, task_pb2, tasks_pb2, version_pb2
from pycrid.cadvisor.view import ContainerdView
from pycrid.errors import FailedPrecondition
from pycrid.sandbox.controller import SandboxAnchor
from pycrid.store.db import Database
from pycrid.store.records import ContainerRecord, SandboxRecord, container_store, sandbox_store

SID, CID, OTHER = "a" * 64, "b" * 64, "c" * 64
K8S = (("containerd-namespace", "k8s.io"),)


class Client:
    """Calls by method path, as containerd's Go client names them."""

    def __init__(self, channel: grpc.aio.Channel) -> None:
        self.channel = channel

    async def call(self, path: str, request: Any, response: Any,
                   metadata: tuple[tuple[str, str], ...] = K8S) -> Any:
        fn = self.channel.unary_unary(path, request_serializer=type(request).SerializeToString,
                                      response_deserializer=response.FromString)
        return await fn(request, metadata=metadata, timeout=10)

    async def stream(self, path: str, request: Any, response: Any) -> list[Any]:
        fn = self.channel.unary_stream(path, request_serializer=type(request).SerializeToString,
                                       response_deserializer=response.FromString)
        return [m async for m in fn(request, metadata=K8S, timeout=10)]


@pytest.fixture
async def endpoint(tmp_path: Path) -> AsyncIterator[tuple[ContainerdEndpoint, Client]]:
    db = Database(str(tmp_path / "db.sqlite"))
    pods, ctrs = sandbox_store(db), container_store(db)
    labels = {"io.kubernetes.pod.name": "web", "io.kubernetes.pod.namespace": "ns"}
    pods.put(SandboxRecord(
        id=SID, name="web_ns_u_0", runtime_handler="", created_at=1, phase="ready", pid=4242,
        config=pb.PodSandboxConfig(metadata=pb.PodSandboxMetadata(name="web"), labels=labels),
        image_name="registry.k8s.io/pause:3.10"))
    ctrs.put(ContainerRecord(
        id=CID, sandbox_id=SID, name="app", created_at=2, phase="created", pid=4300,
        started_at=3, image_name="busybox:1.36",
        config=pb.ContainerConfig(labels={**labels, "io.kubernetes.container.name": "app"})))
    for oid in (SID, CID):
        (tmp_path / oid).write_text(json.dumps({"ociVersion": "1.2.0", "hostname": oid[:4]}))
    view = ContainerdView(
        sandboxes=pods, containers=ctrs,
        anchor=lambda rec: SandboxAnchor("", rec.pid, str(tmp_path / rec.id)),
        container_spec=lambda cid: str(tmp_path / cid), image_config=lambda i: b"{}")
    ep = ContainerdEndpoint(str(tmp_path / "run" / "containerd.sock"), handlers(view))
    await ep.start()
    channel = grpc.aio.insecure_channel(f"unix://{ep.path}")
    try:
        yield ep, Client(channel)
    finally:
        await channel.close()
        await ep.close()


def _mode(path: str) -> int:
    return os.stat(path).st_mode & 0o777


GET = "/containerd.services.containers.v1.Containers/Get"
LIST = "/containerd.services.containers.v1.Containers/List"
TASK = "/containerd.services.tasks.v1.Tasks/Get"


async def test_what_cadvisor_asks(endpoint: tuple[ContainerdEndpoint, Client]) -> None:
    ep, client = endpoint
    assert _mode(ep.path) == 0o660
    version = await client.call("/containerd.services.version.v1.Version/Version", Empty(),
                                version_pb2.VersionResponse, metadata=())
    assert version.version
    got = (await client.call(GET, containers_pb2.GetContainerRequest(id=CID),
                             containers_pb2.GetContainerResponse)).container
    assert got.labels["io.cri-containerd.kind"] == "container"
    assert got.labels["io.kubernetes.container.name"] == "app"
    assert json.loads(got.spec.value)["hostname"] == CID[:4]
    pod = (await client.call(GET, containers_pb2.GetContainerRequest(id=SID),
                             containers_pb2.GetContainerResponse)).container
    assert pod.labels["io.cri-containerd.kind"] == "sandbox"
    task = (await client.call(TASK, tasks_pb2.GetRequest(container_id=SID),
                              tasks_pb2.GetResponse)).process
    assert (task.pid, task.status) == (4242, task_pb2.RUNNING)


async def test_errors_are_containerds(endpoint: tuple[ContainerdEndpoint, Client]) -> None:
    _, client = endpoint
    cases = [
        (GET, containers_pb2.GetContainerRequest(id=OTHER), K8S, grpc.StatusCode.NOT_FOUND,
         f'container "{OTHER}" in namespace "k8s.io": not found'),
        (GET, containers_pb2.GetContainerRequest(id=CID), (), grpc.StatusCode.FAILED_PRECONDITION,
         "namespace is required"),
        (GET, containers_pb2.GetContainerRequest(id=CID), (("containerd-namespace", "moby"),),
         grpc.StatusCode.NOT_FOUND, 'in namespace "moby"'),
        (GET, containers_pb2.GetContainerRequest(id=CID), (("containerd-namespace", "-x"),),
         grpc.StatusCode.INVALID_ARGUMENT, "invalid namespace name"),
        (GET, containers_pb2.GetContainerRequest(), K8S, grpc.StatusCode.INVALID_ARGUMENT,
         "id is required"),
        (TASK, tasks_pb2.GetRequest(container_id=OTHER), K8S, grpc.StatusCode.NOT_FOUND,
         "not found"),
        (LIST, containers_pb2.ListContainersRequest(filters=["id=="]), K8S,
         grpc.StatusCode.INVALID_ARGUMENT, "needs a value"),
        # Nothing that writes is served.
        ("/containerd.services.containers.v1.Containers/Delete",
         containers_pb2.GetContainerRequest(id=CID), K8S, grpc.StatusCode.UNIMPLEMENTED, ""),
        ("/containerd.services.tasks.v1.Tasks/Kill", tasks_pb2.GetRequest(container_id=CID),
         K8S, grpc.StatusCode.UNIMPLEMENTED, ""),
    ]
    for path, request, metadata, code, text in cases:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await client.call(path, request, tasks_pb2.GetResponse, metadata=metadata)
        assert err.value.code() == code, (path, err.value.details())
        assert text in (err.value.details() or ""), (path, err.value.details())


async def test_lists(endpoint: tuple[ContainerdEndpoint, Client]) -> None:
    _, client = endpoint
    every = await client.call(LIST, containers_pb2.ListContainersRequest(),
                              containers_pb2.ListContainersResponse)
    assert sorted(c.id for c in every.containers) == [SID, CID]
    sandboxes = await client.call(
        LIST, containers_pb2.ListContainersRequest(
            filters=['labels."io.cri-containerd.kind"==sandbox']),
        containers_pb2.ListContainersResponse)
    assert [c.id for c in sandboxes.containers] == [SID]
    streamed = await client.stream("/containerd.services.containers.v1.Containers/ListStream",
                                   containers_pb2.ListContainersRequest(filters=["image~=busy"]),
                                   containers_pb2.ListContainerMessage)
    assert [m.container.id for m in streamed] == [CID]
    tasks = await client.call("/containerd.services.tasks.v1.Tasks/List",
                              tasks_pb2.ListTasksRequest(), tasks_pb2.ListTasksResponse)
    assert {t.container_id: t.pid for t in tasks.tasks} == {SID: 4242, CID: 4300}
    other_ns = await client.call(LIST, containers_pb2.ListContainersRequest(),
                                 containers_pb2.ListContainersResponse,
                                 metadata=(("containerd-namespace", "default"),))
    assert list(other_ns.containers) == []


async def test_a_stale_socket_is_replaced(tmp_path: Path) -> None:
    path = tmp_path / "containerd.sock"
    _dead_socket(path)
    ep = ContainerdEndpoint(str(path), [])
    await ep.start()
    try:
        assert _connects(path)
    finally:
        await ep.close()


async def test_a_live_socket_or_a_file_is_not_taken_over(tmp_path: Path) -> None:
    path = tmp_path / "containerd.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as real:
        real.bind(str(path))
        real.listen()
        with pytest.raises(FailedPrecondition,
                           match=rf"served by another process \(\S+, pid {os.getpid()}\); "
                                 r".*--containerd"):
            await ContainerdEndpoint(str(path), []).start()
        assert _connects(path)  # still the real one's
        conn, _ = real.accept()
        conn.close()
    plain = tmp_path / "plain"
    plain.write_text("not a socket")
    with pytest.raises(FailedPrecondition, match="not a socket"):
        await ContainerdEndpoint(str(plain), []).start()
    assert plain.read_text() == "not a socket"


async def test_close_removes_only_its_own_socket(tmp_path: Path) -> None:
    path = tmp_path / "run" / "containerd.sock"  # the directory is made
    ep = ContainerdEndpoint(str(path), [])
    await ep.start()
    assert sorted(os.listdir(path.parent)) == ["containerd.sock"]  # no temporary name left
    await ep.close()
    assert not path.exists()
    ep = ContainerdEndpoint(str(path), [])
    await ep.start()
    path.unlink()  # a real containerd took the path over meanwhile
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as successor:
        successor.bind(str(path))
        await ep.close()
        assert path.exists()


def _dead_socket(path: Path) -> None:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(str(path))
    s.close()  # the file stays, nobody listens


def _connects(path: Path) -> bool:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as c:
        try:
            c.connect(str(path))
        except OSError:
            return False
    return True
