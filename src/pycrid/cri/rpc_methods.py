"""The methods of a gRPC service, read from its protobuf descriptor.

types-protobuf types the descriptor classes' attributes as ``Any``. This module is the one
place in the CRI edge that reads them, and the one module of ``pycrid.cri`` that mypy lets
hold an ``Any`` (pyproject.toml): everything else there is checked with none at all.
"""

from __future__ import annotations

from dataclasses import dataclass

from google.protobuf.descriptor import FileDescriptor, ServiceDescriptor


@dataclass(frozen=True)
class RpcMethod:
    #: The short name, which is also the servicer's attribute: ``Version``.
    name: str
    #: The gRPC path: ``/runtime.v1.RuntimeService/Version``.
    path: str
    server_streaming: bool


@dataclass(frozen=True)
class RpcService:
    #: The short name: ``RuntimeService``.
    name: str
    methods: tuple[RpcMethod, ...]


def rpc_service(service: ServiceDescriptor) -> RpcService:
    full: str = service.full_name
    return RpcService(name=str(service.name), methods=tuple(
        RpcMethod(name=str(m.name), path=f"/{full}/{m.name}",
                  server_streaming=bool(m.server_streaming))
        for m in service.methods))


def service_named(file: FileDescriptor, name: str) -> ServiceDescriptor:
    """One service of a .proto file's descriptor, by its short name."""
    service: ServiceDescriptor = file.services_by_name[name]
    return service
