"""containerd's API on a daemon's own socket, with real pods: what cAdvisor's containerd
driver reads for a cgroup (labels, image, spec, task pid) is the truth about that cgroup's
pod or container; a busy socket is left alone; ``disable`` serves nothing. The real
client (the kubelet's cAdvisor) reads it in tests/e2e/test_kubelet.py."""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from cri_api.v1 import api_pb2 as pb

from pycrid.cadvisor.proto import containers_pb2, task_pb2, tasks_pb2
from tests.support.daemon import CADVISOR_SECTION, Daemon, containerd_socket, running_daemon
from tests.support.images import TestImages
from tests.support.pods import Pods, busybox_daemon, container_config, pod_config
from tests.support.registry import LocalRegistry

pytestmark = pytest.mark.e2e

K8S = (("containerd-namespace", "k8s.io"),)


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory, registry: LocalRegistry,
           test_images: TestImages) -> Iterator[Daemon]:
    with busybox_daemon(tmp_path_factory.mktemp("cadvisor"), registry, test_images) as d:
        yield d


class Containerd:
    """The calls cAdvisor's containerd driver makes, over the daemon's socket."""

    def __init__(self, path: str) -> None:
        self.channel = grpc.insecure_channel(f"unix://{path}")

    def _call(self, path: str, request: Any, response: Any) -> Any:
        fn = self.channel.unary_unary(path, request_serializer=type(request).SerializeToString,
                                      response_deserializer=response.FromString)
        return fn(request, metadata=K8S, timeout=10)

    def container(self, cid: str) -> Any:
        return self._call("/containerd.services.containers.v1.Containers/Get",
                          containers_pb2.GetContainerRequest(id=cid),
                          containers_pb2.GetContainerResponse).container

    def task(self, cid: str) -> Any:
        return self._call("/containerd.services.tasks.v1.Tasks/Get",
                          tasks_pb2.GetRequest(container_id=cid), tasks_pb2.GetResponse).process


def _cgroup_of(pid: int) -> str:
    """The memory cgroup of ``pid`` (cAdvisor takes the id from its last element)."""
    with open(f"/proc/{pid}/cgroup") as f:
        for line in f:
            _, controllers, path = line.rstrip("\n").split(":", 2)
            if "memory" in controllers.split(","):
                return path
    raise AssertionError(f"no memory cgroup for {pid}")


def _not_found(fn: Any, *args: Any) -> str:
    with pytest.raises(grpc.RpcError) as err:
        fn(*args)
    assert err.value.code() == grpc.StatusCode.NOT_FOUND
    return str(err.value.details())


def test_pods_and_containers_as_containerd_records_them(daemon: Daemon) -> None:
    pods = Pods(daemon.client)
    api = Containerd(containerd_socket(daemon.extra["base"]))
    labels = {"io.kubernetes.pod.name": "web", "io.kubernetes.pod.namespace": "shop",
              "io.kubernetes.pod.uid": "u-1"}
    pod = pod_config("web", "shop", labels=labels)
    try:
        sid = pods.run(pod)
        cid = pods.run_container(sid, container_config(
            daemon.extra["busybox"], "app", command=["sleep", "1000"],
            labels={**labels, "io.kubernetes.container.name": "app"}), pod)

        sandbox = api.container(sid)
        assert sandbox.labels["io.cri-containerd.kind"] == "sandbox"
        assert {k: sandbox.labels[k] for k in labels} == labels
        spec = json.loads(sandbox.spec.value)
        assert spec["linux"]["cgroupsPath"].endswith(sid)
        pause = api.task(sid)
        assert pause.status == task_pb2.RUNNING
        info = json.loads(pods.pod_status(sid, verbose=True).info["info"])
        assert pause.pid == info["pid"]
        # cAdvisor's rules: the cgroup's last element is the id; network counters come from
        # the sandbox task's /proc/<pid>/net/dev, which must be the pod's netns.
        assert _cgroup_of(pause.pid).rstrip("/").endswith(sid)
        assert os.stat(f"/proc/{pause.pid}/ns/net").st_ino == os.stat(info["netns"]).st_ino
        with open(f"/proc/{pause.pid}/net/dev") as f:
            assert "eth0:" in f.read()

        app = api.container(cid)
        assert app.labels["io.cri-containerd.kind"] == "container"
        assert app.labels["io.kubernetes.container.name"] == "app"
        assert app.labels["version"] == "latest"  # the image's label
        assert app.image == daemon.extra["busybox"]
        assert json.loads(app.spec.value)["process"]["args"] == ["sleep", "1000"]
        task = api.task(cid)
        assert task.status == task_pb2.RUNNING
        assert task.pid == json.loads(pods.status(cid, verbose=True).info["info"])["pid"]
        assert _cgroup_of(task.pid).rstrip("/").endswith(cid)

        pods.stop(cid)
        stopped = api.task(cid)
        assert (stopped.status, stopped.exit_status) == (task_pb2.STOPPED, 137)
        pods.remove(cid)
        assert "not found" in _not_found(api.container, cid)
        assert "not found" in _not_found(api.task, cid)

        pods.stop_pod(sid)
        assert api.task(sid).status == task_pb2.STOPPED
        pods.remove_pod(sid)
        assert f'container "{sid}" in namespace "k8s.io"' in _not_found(api.container, sid)
    finally:
        api.channel.close()
        pods.cleanup()


def test_a_pod_without_a_pause(daemon: Daemon) -> None:
    """drop_infra_ctr: the pod's cgroup is empty, and a running container of the pod stands
    in as its process (the pid cAdvisor reads the pod's network counters from). cAdvisor
    asks for that pid once, when the cgroup appears: so the cgroup is there only while a
    container stands in, and is made anew when another one takes over."""
    pods = Pods(daemon.client)
    api = Containerd(containerd_socket(daemon.extra["base"]))
    pod = pod_config("pinned", labels={"io.kubernetes.pod.name": "pinned"})
    pod.linux.security_context.namespace_options.pid = pb.CONTAINER
    try:
        sid = pods.run(pod)
        assert json.loads(pods.pod_status(sid, verbose=True).info["info"])["pid"] == 0
        sandbox = api.container(sid)
        assert sandbox.labels["io.cri-containerd.kind"] == "sandbox"
        assert json.loads(sandbox.spec.value) == {}  # no process, no spec of its own
        cgroup = f"/sys/fs/cgroup/memory/k8s.io/{sid}"  # what cAdvisor sees
        assert not os.path.isdir(cgroup)
        assert "no running task" in _not_found(api.task, sid)  # nothing runs yet

        def app(name: str) -> str:
            cfg = container_config(daemon.extra["busybox"], name, command=["sleep", "1000"])
            cfg.linux.security_context.namespace_options.pid = pb.CONTAINER
            return pods.run_container(sid, cfg, pod)

        first = app("first")
        stand_in = api.task(sid)
        assert (stand_in.status, stand_in.pid) == (task_pb2.RUNNING, api.task(first).pid)
        with open(f"/proc/{stand_in.pid}/net/dev") as f:
            assert "eth0:" in f.read()
        made = os.stat(cgroup).st_ino
        second = app("second")
        assert os.stat(cgroup).st_ino == made  # the first still stands in
        pods.stop(first)
        assert api.task(sid).pid == api.task(second).pid
        assert os.stat(cgroup).st_ino != made  # made anew: cAdvisor asks again
        pods.stop(second)
        assert "no running task" in _not_found(api.task, sid)
        assert not os.path.isdir(cgroup)
    finally:
        api.channel.close()
        pods.cleanup()


def _warnings(d: Daemon) -> list[str]:
    info = d.client.runtime.Status(pb.StatusRequest(verbose=True), timeout=10).info
    found: list[str] = json.loads(info["warnings"])
    return found


def _sockets(d: Daemon) -> dict[str, str]:
    info = d.client.runtime.Status(pb.StatusRequest(verbose=True), timeout=10).info
    found: dict[str, str] = json.loads(info["daemon"])["sockets"]
    return found


def test_a_socket_another_process_serves_is_left_alone(tmp_path: Path) -> None:
    path = tmp_path / "containerd.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as real:
        real.bind(str(path))
        real.listen()
        config = f'version = 2\n{CADVISOR_SECTION}\nsocket_path = "{path}"\n'
        with running_daemon(str(tmp_path / "d"), config) as d:
            assert any(f"{path} is served by" in w and f"pid {os.getpid()}" in w
                       for w in _warnings(d)), _warnings(d)
            assert "containerd" not in _sockets(d)
        # The listener still owns its path; a connection reaches it, not pycrid.
        assert path.is_socket()
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as c:
            c.connect(str(path))
            conn, _ = real.accept()
            conn.close()


def test_disable_serves_nothing(tmp_path: Path) -> None:
    path = tmp_path / "containerd.sock"
    config = f'version = 2\n{CADVISOR_SECTION}\ndisable = true\nsocket_path = "{path}"\n'
    with running_daemon(str(tmp_path / "d"), config) as d:
        assert not path.exists()
        assert "containerd" not in _sockets(d)
        assert "skipping plugin pycrid.cadvisor.v1.containerd" in d.log()
    served = tmp_path / "served"
    with running_daemon(str(served)) as d:
        assert _sockets(d)["containerd"] == containerd_socket(str(served))
    assert not Path(containerd_socket(str(served))).exists()  # removed at stop
