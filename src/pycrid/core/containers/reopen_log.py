"""ReopenContainerLog: conmon reopens the CRI log after the kubelet rotated it."""

from __future__ import annotations

from cri_api.v1 import api_pb2 as pb

from pycrid.core.containers.parts import ContainerParts
from pycrid.errors import FailedPrecondition


async def reopen_log(parts: ContainerParts, prefix: str) -> None:
    rec = parts.find(prefix)
    if rec.state != pb.CONTAINER_RUNNING:
        raise FailedPrecondition(f"container {rec.id} is not running")
    await parts.runtime.reopen_log(parts.paths.bundle(rec.id), rec.log_path)
