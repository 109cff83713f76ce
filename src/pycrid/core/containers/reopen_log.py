"""ReopenContainerLog: conmon reopens the CRI log after the kubelet rotated it."""

from __future__ import annotations

from pycrid.core.containers.exec import running
from pycrid.core.containers.parts import ContainerParts


async def reopen_log(parts: ContainerParts, prefix: str) -> None:
    rec = running(parts, prefix)
    await parts.runtime.reopen_log(parts.paths.bundle(rec.id), rec.log_path)
