"""Metrics: the scrape-time collector over real records, the recording calls, the CRI edge
recording every call's method and code, the endpoint."""

from __future__ import annotations

import functools
import socket
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import aiohttp
import grpc
import pytest
from cri_api.v1 import api_pb2 as pb
from cri_api.v1 import api_pb2_grpc as pb_grpc

from pycrid import __version__, errors, release
from pycrid.config.decode import ConfigError
from pycrid.core.cri_service import CRIService
from pycrid.cri.instrument import Gate, instrumented_servicer
from pycrid.images.pull_report import PullReport
from pycrid.metrics import Metrics, samples
from pycrid.metrics.endpoint import MetricsServer
from pycrid.store.records import ContainerRecord, SandboxRecord


def scrape(m: Metrics) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    text = m.exposition().decode()
    return {(name, frozenset(labels.items())): value for name, labels, value in samples(text)}


def value(got: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str,
          **labels: str) -> float | None:
    return got.get((name, frozenset(labels.items())))


class Store:
    def __init__(self, *recs: Any) -> None:
        self.recs = list(recs)

    def visible(self) -> list[Any]:
        return [r for r in self.recs if r.phase != "creating"]


def pod(pid: str, phase: str) -> SandboxRecord:
    return SandboxRecord(id=pid, name=pid, config=pb.PodSandboxConfig(), runtime_handler="runc",
                         created_at=1, phase=phase)


def ctr(cid: str, **kw: Any) -> ContainerRecord:
    return ContainerRecord(id=cid, sandbox_id="p", name=cid, config=pb.ContainerConfig(),
                           created_at=1, **kw)


def fake_core(plugins: list[Any] | None = None, recovery: float | None = 0.25) -> Any:
    core = _fake_core(plugins, recovery)
    # The counting is the real core's, over these stores.
    core.pod_counts = functools.partial(CRIService.pod_counts, core)
    core.container_counts = functools.partial(CRIService.container_counts, core)
    return core


def _fake_core(plugins: list[Any] | None, recovery: float | None) -> Any:
    return SimpleNamespace(
        pods=SimpleNamespace(store=Store(pod("a", "ready"), pod("b", "ready"),
                                         pod("c", "notready"), pod("d", "creating"))),
        containers=SimpleNamespace(store=Store(
            ctr("1", phase="created"), ctr("2", phase="created", started_at=5),
            ctr("3", phase="created", started_at=5), ctr("4", phase="created", finished_at=9),
            ctr("5", phase="created", unknown=True), ctr("6", phase="creating"))),
        nri=SimpleNamespace(adaptation=None if plugins is None else SimpleNamespace(
            plugins=plugins)),
        images=SimpleNamespace(pull_reports={"sha256:abc": PullReport(
            fetched=10, reused=900, skipped=300, partial_layers=2)}),
        recovery_seconds=recovery)


def test_states_counted_from_records() -> None:
    m = Metrics()
    m.bind(fake_core(plugins=[SimpleNamespace(closed=False), SimpleNamespace(closed=True)]))
    got = scrape(m)
    assert value(got, "pycrid_pods", state="SANDBOX_READY") == 2
    assert value(got, "pycrid_pods", state="SANDBOX_NOTREADY") == 1
    assert value(got, "pycrid_containers", state="CONTAINER_CREATED") == 1
    assert value(got, "pycrid_containers", state="CONTAINER_RUNNING") == 2
    assert value(got, "pycrid_containers", state="CONTAINER_EXITED") == 1
    assert value(got, "pycrid_containers", state="CONTAINER_UNKNOWN") == 1
    assert value(got, "pycrid_nri_plugins_connected") == 1
    assert value(got, "pycrid_recovery_duration_seconds") == 0.25
    assert value(got, "pycrid_build_info", version=__version__, commit=release.commit()) == 1
    for kind, n in (("fetched", 10), ("reused", 900), ("skipped", 300)):
        assert value(got, "pycrid_image_last_pull_bytes", image="sha256:abc", kind=kind) == n


def test_unbound_and_not_recovered_report_nothing_of_the_core() -> None:
    m = Metrics()
    got = scrape(m)
    assert not [k for k in got if k[0] in ("pycrid_pods", "pycrid_containers")]
    m.bind(fake_core(plugins=None, recovery=None))
    got = scrape(m)
    assert value(got, "pycrid_nri_plugins_connected") == 0
    assert not [k for k in got if k[0] == "pycrid_recovery_duration_seconds"]


def test_registries_are_per_instance() -> None:
    a, b = Metrics(), Metrics()
    a.cri_call("Version", "OK", 0.001)
    assert value(scrape(a), "pycrid_cri_requests_total", method="Version", code="OK") == 1
    assert value(scrape(b), "pycrid_cri_requests_total", method="Version", code="OK") is None


def test_recording_calls() -> None:
    m = Metrics()
    m.cri_call("Version", "OK", 0.002)
    m.cri_call("Version", "OK", 0.004)
    m.cri_call("ContainerStatus", "NOT_FOUND", 0.001)
    m.nri_call("10-rec", "CreateContainer", 0.003, failed=False)
    m.nri_registered("10-rec")
    m.nri_dropped("10-rec", "timeout")
    m.pull_done(True, 1.5)
    m.pull_done(False, 0.5)
    m.pull_bytes(1000)
    m.pull_bytes(24)
    m.pull_saved(reused=5000, skipped=700)
    m.pull_saved(reused=0, skipped=0)
    got = scrape(m)
    assert value(got, "pycrid_image_pull_reused_bytes_total") == 5000
    assert value(got, "pycrid_image_pull_skipped_bytes_total") == 700
    assert value(got, "pycrid_cri_requests_total", method="Version", code="OK") == 2
    assert value(got, "pycrid_cri_request_duration_seconds_count", method="Version",
                 code="OK") == 2
    assert value(got, "pycrid_cri_request_duration_seconds_sum", method="Version",
                 code="OK") == pytest.approx(0.006)
    assert value(got, "pycrid_cri_requests_total", method="ContainerStatus",
                 code="NOT_FOUND") == 1
    assert value(got, "pycrid_nri_plugin_request_duration_seconds_count", plugin="10-rec",
                 event="CreateContainer") == 1
    assert value(got, "pycrid_nri_plugin_registrations_total", plugin="10-rec") == 1
    assert value(got, "pycrid_nri_plugin_drops_total", plugin="10-rec", reason="timeout") == 1
    assert value(got, "pycrid_image_pulls_total", result="success") == 1
    assert value(got, "pycrid_image_pulls_total", result="failure") == 1
    assert value(got, "pycrid_image_pull_bytes_total") == 1024
    assert value(got, "pycrid_image_pull_duration_seconds_count") == 2


class Impl:
    def __init__(self) -> None:
        self.raise_: Exception | None = None

    async def Version(self, request: Any, context: Any) -> Any:
        if self.raise_:
            raise self.raise_
        return pb.VersionResponse(runtime_name="x")

    async def GetContainerEvents(self, request: Any, context: Any) -> Any:
        yield pb.ContainerEventResponse(container_id="c1")
        yield pb.ContainerEventResponse(container_id="c2")


async def test_every_cri_call_is_recorded_with_its_code(tmp_path: Path) -> None:
    m, impl, gate = Metrics(), Impl(), Gate()
    server = grpc.aio.server()
    pb_grpc.add_RuntimeServiceServicer_to_server(  # type: ignore[no-untyped-call]
        instrumented_servicer(pb.DESCRIPTOR.services_by_name["RuntimeService"], impl, gate,
                              m.cri_call), server)
    sock = tmp_path / "s.sock"
    server.add_insecure_port(f"unix://{sock}")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"unix://{sock}") as channel:
            stub = pb_grpc.RuntimeServiceStub(channel)  # type: ignore[no-untyped-call]
            with pytest.raises(grpc.aio.AioRpcError):  # not ready yet
                await stub.Version(pb.VersionRequest())
            gate.ready = True
            await stub.Version(pb.VersionRequest())
            await stub.Version(pb.VersionRequest())
            impl.raise_ = errors.NotFound("nope")
            with pytest.raises(grpc.aio.AioRpcError):
                await stub.Version(pb.VersionRequest())
            with pytest.raises(grpc.aio.AioRpcError):
                await stub.RunPodSandbox(pb.RunPodSandboxRequest())
            events = [e async for e in stub.GetContainerEvents(pb.GetEventsRequest())]
            assert [e.container_id for e in events] == ["c1", "c2"]
    finally:
        await server.stop(None)
    got = scrape(m)
    assert value(got, "pycrid_cri_requests_total", method="Version", code="OK") == 2
    assert value(got, "pycrid_cri_requests_total", method="Version", code="NOT_FOUND") == 1
    assert value(got, "pycrid_cri_requests_total", method="Version", code="UNAVAILABLE") == 1
    assert value(got, "pycrid_cri_requests_total", method="RunPodSandbox",
                 code="UNIMPLEMENTED") == 1
    assert value(got, "pycrid_cri_requests_total", method="GetContainerEvents", code="OK") == 1


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_endpoint_serves_both_paths() -> None:
    m = Metrics()
    m.cri_call("Version", "OK", 0.001)
    server = MetricsServer(m, f"127.0.0.1:{free_port()}")
    await server.start()
    try:
        async with aiohttp.ClientSession() as http:
            for path in ("/v1/metrics", "/metrics"):
                async with http.get(f"http://{server.address}{path}") as resp:
                    assert resp.status == 200
                    assert resp.headers["Content-Type"].startswith("text/plain")
                    text = await resp.text()
                assert 'pycrid_cri_requests_total{code="OK",method="Version"} 1.0' in text
    finally:
        await server.aclose()


async def test_busy_address_names_the_key() -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(ConfigError) as e:
            await MetricsServer(Metrics(), f"127.0.0.1:{port}").start()
    assert e.value.key == "metrics.address"
