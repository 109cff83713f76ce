"""OpenTelemetry tracing (``[tracing] endpoint``): a span per CRI call, a child per NRI
plugin call, exported over OTLP/HTTP (protobuf) in batches.

The OpenTelemetry packages are imported here only, and this module only when tracing is on,
so a daemon without an endpoint never loads them and its calls make no span at all (the
CRI wrapper is chosen when the servicer is built). The provider is this daemon's own, never
the global one, so several daemons in one test process do not mix.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any

import grpc
from google.protobuf.message import Message

from pycrid import release
from pycrid.config.schema import TracingConfig
from pycrid.cri.handler_types import Context, Req, Resp, Unary
from pycrid.cri.instrument import status_of

#: Request and response fields whose ids are cheap to put on a span.
_ID_FIELDS = (("pod_sandbox_id", "pycrid.pod_sandbox_id"),
              ("container_id", "pycrid.container_id"))


class Tracing:
    def __init__(self, config: TracingConfig) -> None:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
        from opentelemetry.trace import SpanKind, Status, StatusCode

        self._kind_server = SpanKind.SERVER
        self._status = Status
        self._error = StatusCode.ERROR
        self.provider = TracerProvider(
            resource=Resource.create({"service.name": config.service_name,
                                      "service.version": release.runtime_version()}),
            sampler=ParentBased(TraceIdRatioBased(float(config.sampling_ratio))))
        self.processor = BatchSpanProcessor(OTLPSpanExporter(endpoint=config.endpoint,
                                                             timeout=5))
        self.provider.add_span_processor(self.processor)
        self.tracer = self.provider.get_tracer("pycrid", release.VERSION)

    def span(self, name: str, attributes: dict[str, Any]) -> AbstractContextManager[Any]:
        """A span, child of the current one (an NRI plugin call inside its CRI call)."""
        return self.tracer.start_as_current_span(name, attributes=attributes)

    def wrap_unary(self, method: str, fn: Unary[Req, Resp]) -> Unary[Req, Resp]:
        """``fn`` in a server span named ``method`` with the gRPC status code on it."""
        tracer = self.tracer

        async def call(request: Req, context: Context[Req, Resp]) -> Resp:
            with tracer.start_as_current_span(
                    method, kind=self._kind_server, record_exception=False,
                    set_status_on_exception=False,
                    attributes={"rpc.system": "grpc", "rpc.method": method}) as span:
                _ids(span, request)
                try:
                    response = await fn(request, context)
                except Exception as exc:
                    if isinstance(exc, grpc.aio.AbortError):
                        # None (or an int) until a code is set, whatever the stubs say.
                        found: object = context.code()
                        code = (found if isinstance(found, grpc.StatusCode)
                                else grpc.StatusCode.UNKNOWN)
                        msg = str(context.details() or "")
                    else:
                        code, msg = status_of(exc)
                    span.set_attribute("rpc.grpc.status_code", code.value[0])
                    span.set_status(self._status(self._error, f"{code.name}: {msg}"))
                    raise
                span.set_attribute("rpc.grpc.status_code", 0)
                _ids(span, response)
                return response

        return call

    def shutdown(self) -> None:
        """Flush the batched spans and stop the exporter (daemon shutdown)."""
        self.provider.shutdown()


def _ids(span: Any, msg: Message) -> None:
    for field, attr in _ID_FIELDS:
        value = getattr(msg, field, "")
        if value and isinstance(value, str):
            span.set_attribute(attr, value)


def start_tracing(config: TracingConfig) -> Tracing:
    """The daemon's tracing; a missing OpenTelemetry install stops start-up by key."""
    try:
        return Tracing(config)
    except ImportError as e:
        from pycrid.config.decode import ConfigError

        raise ConfigError("tracing.endpoint", f"tracing needs the OpenTelemetry packages "
                          f"(pip install 'pycrid[tracing]'): {e}") from None
