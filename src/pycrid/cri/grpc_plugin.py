"""The CRI gRPC plugin: builds the core, its servicers and the streaming server, and gates
calls until start-up is done."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import cast

import grpc
from cri_api.v1 import api_pb2 as pb
from cri_api.v1 import api_pb2_grpc as pb_grpc

from pycrid.config.schema import CRIServerConfig
from pycrid.core.cri_service import CRIService
from pycrid.core.streams import ContainerStreams
from pycrid.cri.image_servicer import ImageServicer
from pycrid.cri.instrument import Gate, Record, Tracer, instrumented_servicer
from pycrid.cri.rpc_methods import service_named
from pycrid.cri.runtime_servicer import RuntimeServicer
from pycrid.streaming.server import StreamServer
from pycrid.streaming.tls import server_context

log = logging.getLogger(__name__)

#: The config section of this plugin.
SECTION = "pycrid.grpc.v1.cri"


class CRIPlugin:
    def __init__(self, *, core: CRIService, server_config: CRIServerConfig,
                 ready: Callable[[], None], state_dir: str, record: Record | None = None,
                 tracer: Tracer | None = None) -> None:
        self.server_config = server_config
        #: Metrics and tracing of every call (both optional; see cri/instrument.py).
        self.record = record
        self.tracer = tracer
        self.core = core
        self.gate = Gate()
        self._ready = ready
        self.streams = ContainerStreams(core.containers, core.pods)
        tls = None
        if server_config.enable_tls_streaming:
            pair = server_config.x509_key_pair_streaming
            tls = server_context(pair.tls_cert_file, pair.tls_key_file, state_dir=state_dir,
                                 address=server_config.stream_server_address,
                                 section=f'plugins."{SECTION}"')
        self.stream_server = StreamServer(
            runtime=self.streams, address=server_config.stream_server_address,
            port=int(server_config.stream_server_port),
            idle_timeout=float(server_config.stream_idle_timeout), tls=tls,
            parent=core.owner)

    def register(self, server: grpc.aio.Server) -> None:
        # The instrumented servicers have every method of their service, set by name.
        runtime = RuntimeServicer(self.core, self.streams, self.stream_server)
        pb_grpc.add_RuntimeServiceServicer_to_server(cast(
            pb_grpc.RuntimeServiceServicer,
            instrumented_servicer(service_named(pb.DESCRIPTOR, "RuntimeService"), runtime,
                                  self.gate, self.record, self.tracer)), server)
        pb_grpc.add_ImageServiceServicer_to_server(cast(
            pb_grpc.ImageServiceServicer,
            instrumented_servicer(service_named(pb.DESCRIPTOR, "ImageService"),
                                  ImageServicer(self.core), self.gate, self.record,
                                  self.tracer)), server)

    async def start(self) -> None:
        """Recover, then open the gate: until here every call answered UNAVAILABLE."""
        await self.core.start()
        await self.stream_server.start()
        self.gate.ready = True
        self._ready()

    def end_streams(self) -> None:
        """Shutdown: end every GetContainerEvents stream so the server can stop."""
        self.core.events.broadcast.close()

    async def close(self) -> None:
        # The parts are plugins of their own and are closed by the registry after us.
        self.gate.ready = False
        await self.stream_server.aclose()  # ends every exec, attach and port-forward
        await self.core.aclose()
