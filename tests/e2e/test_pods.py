"""Pods and containers end to end: a real pycrid running real runc containers under conmon."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from cri_api.v1 import api_pb2 as pb

from tests.support.daemon import Daemon, running_daemon
from tests.support.images import TestImages
from tests.support.pods import Pods, container_config, log_text, pod_config, wait_for
from tests.support.registry import LocalRegistry

pytestmark = pytest.mark.e2e


def daemon_config(registry: LocalRegistry, images: TestImages, base: Path) -> str:
    return (
        "version = 2\n"
        '[plugins."pycrid.cri.v1.images"]\n'
        f'sandbox_image = "{images.pause.ref(registry)}"\n'
        '[plugins."pycrid.cri.v1.images".registry]\n'
        f'config_path = "{registry.hosts_dir(base / "certs.d")}"\n'
    )


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory, registry: LocalRegistry,
           test_images: TestImages) -> Iterator[Daemon]:
    base = tmp_path_factory.mktemp("pods")
    with running_daemon(str(base), daemon_config(registry, test_images, base)) as d:
        d.extra["busybox"] = test_images.busybox.ref(registry)
        d.client.pull(d.extra["busybox"])
        yield d


@pytest.fixture
def pods(daemon: Daemon) -> Iterator[Pods]:
    p = Pods(daemon.client)
    yield p
    p.cleanup()


def test_lifecycle_output_exit_code(daemon: Daemon, pods: Pods, tmp_path: Path) -> None:
    pod = pod_config(log_dir=str(tmp_path / "logs"))
    sid = pods.run(pod)
    assert pods.pod_status(sid).status.state == pb.SANDBOX_READY
    cfg = container_config(daemon.extra["busybox"], "hello",
                           command=["sh", "-c", "echo out; echo err >&2; exit 3"],
                           log_path="hello.log")
    cid = pods.run_container(sid, cfg, pod)
    st = pods.wait_state(cid, pb.CONTAINER_EXITED)
    assert st.exit_code == 3
    assert st.reason == "Error"
    assert st.started_at > 0 and st.finished_at >= st.started_at
    log = str(tmp_path / "logs" / "hello.log")
    assert st.log_path == log
    assert log_text(log, "stdout") == "out\n"
    assert log_text(log, "stderr") == "err\n"
    pods.remove(cid)
    with pytest.raises(grpc.RpcError) as e:
        pods.status(cid)
    assert e.value.code() == grpc.StatusCode.NOT_FOUND
    pods.stop_pod(sid)
    assert pods.pod_status(sid).status.state == pb.SANDBOX_NOTREADY
    pods.remove_pod(sid)


def test_exec_sync(daemon: Daemon, pods: Pods) -> None:
    pod = pod_config()
    sid = pods.run(pod)
    cid = pods.run_container(sid, container_config(daemon.extra["busybox"], "sleeper",
                                                   command=["sleep", "3600"]), pod)
    pods.wait_state(cid, pb.CONTAINER_RUNNING)
    r = pods.exec(cid, ["sh", "-c", "echo hi; echo there >&2; exit 7"])
    assert (r.exit_code, r.stdout, r.stderr) == (7, b"hi\n", b"there\n")
    with pytest.raises(grpc.RpcError) as e:
        pods.exec(cid, ["sleep", "30"], timeout=1)
    assert e.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    wait_for(lambda: "sleep 30" not in pods.exec(cid, ["ps"]).stdout.decode(), 10,
             "the timed-out exec to be killed")
    pods.stop(cid, timeout=2)
    assert pods.status(cid).status.exit_code == 137 or pods.status(cid).status.exit_code == 143
