"""The [metrics] endpoint end to end: a real daemon, a pull, a pod with a running container,
a failing call and an external NRI plugin, then exact values read from a scrape."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from prometheus_client.parser import text_string_to_metric_families

from pycrid import release
from tests.support.daemon import (
    CADVISOR_SECTION,
    Daemon,
    containerd_socket,
    nri_paths,
    running_daemon,
)
from tests.support.images import ImageBuild, TestImages
from tests.support.nri_plugins import external_plugin, has_event, wait_events
from tests.support.pods import Pods, container_config, daemon_config, pod_config, wait_for
from tests.support.registry import LocalRegistry

pytestmark = pytest.mark.e2e

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def scrape(address: str, path: str = "/v1/metrics") -> Samples:
    with urllib.request.urlopen(f"http://{address}{path}", timeout=10) as resp:
        assert resp.status == 200
        text = resp.read().decode()
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def value(got: Samples, name: str, **labels: str) -> float | None:
    return got.get((name, frozenset(labels.items())))


def labelsets(got: Samples, name: str) -> set[frozenset[tuple[str, str]]]:
    return {labels for n, labels in got if n == name}


def pulled_bytes(build: ImageBuild) -> int:
    """What a pull of this (single-manifest) image downloads: manifest, config, layers."""
    return len(build.manifest) + len(build.config) + sum(
        len(build.blobs[d]) for d in build.layer_digests)


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory, registry: LocalRegistry,
           test_images: TestImages) -> Iterator[Daemon]:
    base = tmp_path_factory.mktemp("metrics")
    address = f"127.0.0.1:{free_port()}"
    config = daemon_config(registry, test_images, base) + f'[metrics]\naddress = "{address}"\n'
    with running_daemon(str(base), config) as d:
        d.extra["metrics"] = address
        d.extra["base"] = str(base)
        yield d


def test_scrape_counts_calls_pulls_objects_and_plugins(
        daemon: Daemon, registry: LocalRegistry, test_images: TestImages,
        tmp_path: Path) -> None:
    addr = daemon.extra["metrics"]
    got = scrape(addr)
    build = {"version": release.VERSION, "commit": release.commit()}
    assert value(got, "pycrid_build_info", **build) == 1
    assert value(got, "pycrid_cri_requests_total", method="Version", code="OK") == 1
    assert (value(got, "pycrid_recovery_duration_seconds") or -1) >= 0
    assert value(got, "pycrid_nri_plugins_connected") == 0
    assert value(got, "pycrid_pods", state="SANDBOX_READY") == 0
    assert scrape(addr, "/metrics").keys() >= {("pycrid_build_info",
                                                frozenset(build.items()))}

    busybox = test_images.busybox.ref(registry)
    daemon.client.pull(busybox)
    with pytest.raises(grpc.RpcError):
        daemon.client.pull(f"{registry.host}/no-such-image:latest")

    record = tmp_path / "plugin.jsonl"
    socket_path = nri_paths(daemon.extra["base"])["socket_path"]
    pods = Pods(daemon.client)
    with external_plugin(socket_path, "recorder", "metrics", "50", record=record) as plugin:
        wait_events(record, has_event("Synchronize"), 20, "the plugin to synchronise")
        wait_for(lambda: value(scrape(addr), "pycrid_nri_plugins_connected") == 1,
                 what="the plugin to count as connected")
        pod = pod_config()
        sid = pods.run(pod)
        cid = pods.run_container(sid, container_config(busybox, "sleeper",
                                                       command=["sleep", "300"]), pod)
        with pytest.raises(grpc.RpcError) as e:
            pods.status("0" * 64)
        assert e.value.code() == grpc.StatusCode.NOT_FOUND

        got = scrape(addr)
        for method in ("RunPodSandbox", "CreateContainer", "StartContainer"):
            assert value(got, "pycrid_cri_requests_total", method=method, code="OK") == 1
            assert value(got, "pycrid_cri_request_duration_seconds_count", method=method,
                         code="OK") == 1
        assert value(got, "pycrid_cri_requests_total", method="ContainerStatus",
                     code="NOT_FOUND") == 1
        assert value(got, "pycrid_cri_requests_total", method="PullImage", code="OK") == 1
        assert value(got, "pycrid_cri_requests_total", method="PullImage",
                     code="NOT_FOUND") == 1
        # busybox by PullImage, then the pause image by RunPodSandbox; one failure.
        assert value(got, "pycrid_image_pulls_total", result="success") == 2
        assert value(got, "pycrid_image_pulls_total", result="failure") == 1
        assert value(got, "pycrid_image_pull_duration_seconds_count") == 3
        assert value(got, "pycrid_image_pull_bytes_total") == (
            pulled_bytes(test_images.busybox.build) + pulled_bytes(test_images.pause.build))
        assert value(got, "pycrid_pods", state="SANDBOX_READY") == 1
        assert value(got, "pycrid_pods", state="SANDBOX_NOTREADY") == 0
        assert value(got, "pycrid_containers", state="CONTAINER_RUNNING") == 1
        assert value(got, "pycrid_containers", state="CONTAINER_CREATED") == 0
        assert labelsets(got, "pycrid_containers") == {
            frozenset({("state", s)}) for s in ("CONTAINER_CREATED", "CONTAINER_RUNNING",
                                                "CONTAINER_EXITED", "CONTAINER_UNKNOWN")}
        assert value(got, "pycrid_nri_plugins_connected") == 1
        assert value(got, "pycrid_nri_plugin_registrations_total", plugin="50-metrics") == 1
        for event in ("Configure", "Synchronize", "RunPodSandbox", "CreateContainer",
                      "PostCreateContainer", "StartContainer", "PostStartContainer"):
            assert value(got, "pycrid_nri_plugin_request_duration_seconds_count",
                         plugin="50-metrics", event=event) == 1, event
        assert not labelsets(got, "pycrid_nri_plugin_drops_total")

        # The plugin dies between events: counted as a drop at once, not at the next event.
        os.kill(plugin.pid, signal.SIGKILL)
        wait_for(lambda: value(scrape(addr), "pycrid_nri_plugin_drops_total",
                               plugin="50-metrics", reason="closed") == 1,
                 what="the dead plugin to be counted as dropped")
        assert value(scrape(addr), "pycrid_nri_plugins_connected") == 0

    pods.stop(cid)
    got = scrape(addr)
    assert value(got, "pycrid_containers", state="CONTAINER_EXITED") == 1
    assert value(got, "pycrid_containers", state="CONTAINER_RUNNING") == 0
    pods.cleanup()
    got = scrape(addr)
    assert value(got, "pycrid_pods", state="SANDBOX_READY") == 0
    assert value(got, "pycrid_containers", state="CONTAINER_EXITED") == 0


def test_busy_metrics_address_stops_start_up(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        config = tmp_path / "config.toml"
        nri = nri_paths(str(tmp_path))
        config.write_text(
            f'version = 2\n[metrics]\naddress = "127.0.0.1:{port}"\n'
            '[plugins."pycrid.nri.v1.nri"]\n'
            + "".join(f'{k} = "{v}"\n' for k, v in nri.items())
            + f'{CADVISOR_SECTION}\nsocket_path = "{containerd_socket(str(tmp_path))}"\n')
        state = tmp_path / "state"
        proc = subprocess.run(
            [sys.executable, "-m", "pycrid", "serve", "--config", str(config), "--root",
             str(tmp_path / "root"), "--state", str(state), "--address",
             str(state / "pycrid.sock")], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "metrics.address" in proc.stderr
    assert not (state / "pycrid.sock").exists()


def test_malformed_metrics_address_is_refused(tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    config.write_text('version = 2\n[metrics]\naddress = "localhost"\n')
    proc = subprocess.run([sys.executable, "-m", "pycrid", "serve", "--config", str(config),
                           "--root", str(tmp_path / "root"), "--state", str(tmp_path / "s")],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "metrics.address" in proc.stderr
