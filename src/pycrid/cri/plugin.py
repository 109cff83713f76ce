"""The CRI gRPC plugin: builds the core and its servicers, gates calls until start-up is done."""

from __future__ import annotations

import logging
from collections.abc import Callable

import grpc
from cri_api.v1 import api_pb2 as pb
from cri_api.v1 import api_pb2_grpc as pb_grpc

from pycrid.config.schema import CRIServerConfig
from pycrid.core.service import CRIService
from pycrid.cri.images import ImageServicer
from pycrid.cri.instrument import Gate, instrumented_servicer
from pycrid.cri.runtime import RuntimeServicer

log = logging.getLogger(__name__)


class CRIPlugin:
    def __init__(self, *, core: CRIService, server_config: CRIServerConfig,
                 ready: Callable[[], None]) -> None:
        self.server_config = server_config
        self.core = core
        self.gate = Gate()
        self._ready = ready

    def register(self, server: grpc.aio.Server) -> None:
        services = pb.DESCRIPTOR.services_by_name
        pb_grpc.add_RuntimeServiceServicer_to_server(  # type: ignore[no-untyped-call]
            instrumented_servicer(services["RuntimeService"], RuntimeServicer(self.core),
                                  self.gate), server)
        pb_grpc.add_ImageServiceServicer_to_server(  # type: ignore[no-untyped-call]
            instrumented_servicer(services["ImageService"], ImageServicer(self.core), self.gate),
            server)

    async def start(self) -> None:
        """Recover, then open the gate: until here every call answered UNAVAILABLE."""
        await self.core.start()
        self.gate.ready = True
        self._ready()

    def end_streams(self) -> None:
        """Shutdown: end every GetContainerEvents stream so the server can stop."""
        self.core.events.broadcast.close()

    async def close(self) -> None:
        # The parts are plugins of their own and are closed by the registry after us.
        self.gate.ready = False
        await self.core.aclose()
