"""[tracing] end to end: a real daemon exporting OTLP/HTTP to a receiver in this test, a pod
and a container made while an NRI plugin is connected; the spans are checked after the
daemon's shutdown flushed them."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from tests.support.daemon import nri_paths, running_daemon
from tests.support.images import TestImages
from tests.support.nri_plugins import external_plugin, has_event, wait_events
from tests.support.pods import Pods, container_config, daemon_config, pod_config
from tests.support.registry import LocalRegistry

pytestmark = pytest.mark.e2e


class Receiver:
    """A minimal OTLP/HTTP traces endpoint (protobuf, uncompressed) on 127.0.0.1."""

    def __init__(self) -> None:
        self.requests: list[ExportTraceServiceRequest] = []
        spans = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                ok = self.path == "/v1/traces" and "protobuf" in self.headers["Content-Type"]
                if ok:
                    spans.requests.append(ExportTraceServiceRequest.FromString(body))
                reply = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200 if ok else 404)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/v1/traces"

    def spans(self) -> list[tuple[str, Span]]:
        """(service name, span) of everything received."""
        out = []
        for req in self.requests:
            for rs in req.resource_spans:
                service = next((a.value.string_value for a in rs.resource.attributes
                                if a.key == "service.name"), "")
                out += [(service, s) for ss in rs.scope_spans for s in ss.spans]
        return out


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    r.thread.start()
    yield r
    r.server.shutdown()
    r.server.server_close()


def attrs(span: Span) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for a in span.attributes:
        kind = a.value.WhichOneof("value")
        out[a.key] = getattr(a.value, kind) if kind else None
    return out


def test_cri_and_nri_spans(tmp_path: Path, receiver: Receiver, registry: LocalRegistry,
                           test_images: TestImages) -> None:
    base = tmp_path / "d"
    config = (daemon_config(registry, test_images, base)
              + f'[tracing]\nendpoint = "{receiver.endpoint}"\nservice_name = "pycrid-test"\n')
    busybox = test_images.busybox.ref(registry)
    record = tmp_path / "plugin.jsonl"
    with running_daemon(str(base), config) as d:
        d.client.pull(busybox)
        pods = Pods(d.client)
        with external_plugin(nri_paths(str(base))["socket_path"], "recorder", "trace", "33",
                             record=record):
            wait_events(record, has_event("Synchronize"), 20, "the plugin to synchronise")
            pod = pod_config()
            sid = pods.run(pod)
            cid = pods.create(sid, container_config(busybox, "c", command=["true"]), pod)
            with pytest.raises(grpc.RpcError):
                pods.status("0" * 64)
            pods.remove(cid)
            pods.cleanup()
    # The daemon has stopped: its batch processor was flushed at shutdown.
    spans = receiver.spans()
    assert spans and {svc for svc, _ in spans} == {"pycrid-test"}
    by_name: dict[str, list[Span]] = {}
    for _, s in spans:
        by_name.setdefault(s.name, []).append(s)

    [run] = by_name["RunPodSandbox"]
    assert attrs(run)["rpc.grpc.status_code"] == 0
    assert attrs(run)["rpc.method"] == "RunPodSandbox"
    assert attrs(run)["pycrid.pod_sandbox_id"] == sid
    assert run.kind == Span.SPAN_KIND_SERVER
    [create] = by_name["CreateContainer"]
    assert attrs(create)["rpc.grpc.status_code"] == 0
    assert attrs(create)["pycrid.container_id"] == cid
    [failed] = by_name["ContainerStatus"]
    assert attrs(failed)["rpc.grpc.status_code"] == grpc.StatusCode.NOT_FOUND.value[0]
    assert failed.status.code == failed.status.STATUS_CODE_ERROR

    [nri_create] = by_name["nri.CreateContainer"]
    assert nri_create.trace_id == create.trace_id
    assert nri_create.parent_span_id == create.span_id
    assert attrs(nri_create) == {"nri.plugin.name": "trace", "nri.plugin.index": "33"}
    [nri_run] = by_name["nri.RunPodSandbox"]
    assert (nri_run.trace_id, nri_run.parent_span_id) == (run.trace_id, run.span_id)
    # Different CRI calls are different traces.
    assert run.trace_id != create.trace_id
