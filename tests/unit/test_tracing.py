"""Tracing off costs nothing: no OpenTelemetry import, no span, even after calls."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from pycrid.config.schema import TracingConfig

_OFF = textwrap.dedent("""
    import asyncio, sys
    from cri_api.v1 import api_pb2 as pb
    import pycrid.builtins, pycrid.cri.grpc_plugin, pycrid.daemon, pycrid.nri.adaptation.adaptation
    from pycrid.cri.instrument import Gate, instrumented_servicer
    from pycrid.metrics import Metrics

    class Impl:
        async def Version(self, request, context):
            return pb.VersionResponse(runtime_name="x")

    gate = Gate()
    gate.ready = True
    servicer = instrumented_servicer(pb.DESCRIPTOR.services_by_name["RuntimeService"],
                                     Impl(), gate, Metrics().cri_call, None)
    resp = asyncio.run(servicer.Version(pb.VersionRequest(), None))
    assert resp.runtime_name == "x"
    print(sorted(m for m in sys.modules if m.split(".")[0] == "opentelemetry"))
""")


def test_tracing_off_imports_no_opentelemetry() -> None:
    # A fresh interpreter: this test process may have loaded OpenTelemetry elsewhere.
    out = subprocess.run([sys.executable, "-c", _OFF], capture_output=True, text=True,
                         check=True, timeout=60)
    assert out.stdout.strip() == "[]"


def test_defaults_are_off() -> None:
    cfg = TracingConfig()
    assert (cfg.endpoint, cfg.sampling_ratio, cfg.service_name) == ("", 1.0, "pycrid")
