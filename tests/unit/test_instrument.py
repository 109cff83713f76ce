"""The CRI edge: readiness gate, unimplemented methods, error kinds mapped to gRPC codes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import grpc
import pytest
from cri_api.v1 import api_pb2 as pb
from cri_api.v1 import api_pb2_grpc as pb_grpc

from pycrid import errors
from pycrid.cri.instrument import Gate, instrumented_servicer


class FakeCore:
    """Only the edge is under test here; the impl raises what the core would."""

    def __init__(self) -> None:
        self.raise_: Exception | None = None

    async def Version(self, request: Any, context: Any) -> Any:
        if self.raise_:
            raise self.raise_
        return pb.VersionResponse(runtime_name="x")


@pytest.fixture
async def served(tmp_path: Path) -> Any:
    impl, gate = FakeCore(), Gate()
    server = grpc.aio.server()
    pb_grpc.add_RuntimeServiceServicer_to_server(
        instrumented_servicer(pb.DESCRIPTOR.services_by_name["RuntimeService"], impl, gate),
        server)
    sock = tmp_path / "s.sock"
    server.add_insecure_port(f"unix://{sock}")
    await server.start()
    channel = grpc.aio.insecure_channel(f"unix://{sock}")
    yield impl, gate, pb_grpc.RuntimeServiceStub(channel)
    await channel.close()
    await server.stop(None)


async def test_unavailable_until_ready(served: Any) -> None:
    _impl, gate, stub = served
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await stub.Version(pb.VersionRequest())
    assert e.value.code() == grpc.StatusCode.UNAVAILABLE
    assert "not initialized" in (e.value.details() or "")
    gate.ready = True
    assert (await stub.Version(pb.VersionRequest())).runtime_name == "x"


async def test_unimplemented_names_the_method(served: Any) -> None:
    _, gate, stub = served
    gate.ready = True
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await stub.RunPodSandbox(pb.RunPodSandboxRequest())
    assert e.value.code() == grpc.StatusCode.UNIMPLEMENTED
    assert "RunPodSandbox" in (e.value.details() or "")


@pytest.mark.parametrize(
    ("exc", "code"),
    [
        (errors.NotFound("image x not found"), grpc.StatusCode.NOT_FOUND),
        (errors.InvalidArgument("bad ref"), grpc.StatusCode.INVALID_ARGUMENT),
        (errors.AlreadyExists("dup"), grpc.StatusCode.ALREADY_EXISTS),
        (errors.FailedPrecondition("no"), grpc.StatusCode.FAILED_PRECONDITION),
        (errors.Unauthenticated("creds"), grpc.StatusCode.UNAUTHENTICATED),
        (errors.PermissionDenied("denied"), grpc.StatusCode.PERMISSION_DENIED),
        (errors.DataLoss("digest"), grpc.StatusCode.DATA_LOSS),
        (errors.DeadlineExceeded("slow"), grpc.StatusCode.DEADLINE_EXCEEDED),
        (errors.Unavailable("down"), grpc.StatusCode.UNAVAILABLE),
        (RuntimeError("boom"), grpc.StatusCode.INTERNAL),
    ],
)
async def test_error_kinds_map_to_codes(served: Any, exc: Exception,
                                        code: grpc.StatusCode) -> None:
    impl, gate, stub = served
    gate.ready = True
    impl.raise_ = exc
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await stub.Version(pb.VersionRequest())
    assert e.value.code() == code
    assert str(exc) in (e.value.details() or "")
