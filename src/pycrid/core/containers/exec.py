"""ExecSync, and the checks a container passes before any exec or attach."""

from __future__ import annotations

from collections.abc import Sequence

from cri_api.v1 import api_pb2 as pb

from pycrid.core.containers.parts import ContainerParts, state_name
from pycrid.errors import DeadlineExceeded, FailedPrecondition, InvalidArgument
from pycrid.store.records import ContainerRecord

#: ExecSync keeps at most this much of each stream (containerd's limit).
EXEC_OUTPUT_CAP = 16 * 1024 * 1024


def running(parts: ContainerParts, prefix: str) -> ContainerRecord:
    """The container ``prefix`` names, which must be running to exec in or attach to."""
    rec = parts.find(prefix)
    if rec.state != pb.CONTAINER_RUNNING:
        raise FailedPrecondition(
            f"container {rec.id} is in {state_name(rec.state)} state, not running")
    return rec


async def exec_sync(parts: ContainerParts, prefix: str, cmd: Sequence[str],
                    limit_s: int) -> tuple[int, bytes, bytes]:
    if not cmd:
        raise InvalidArgument("exec command must not be empty")
    rec = running(parts, prefix)
    process = parts.bundles.read_spec(rec.id)["process"]
    process["args"] = list(cmd)
    process["terminal"] = False
    try:
        result = await parts.runtime.exec_sync(
            rec.id, process, limit=limit_s if limit_s > 0 else None,
            output_cap=EXEC_OUTPUT_CAP)
    except TimeoutError:
        raise DeadlineExceeded(
            f"timeout {limit_s}s exceeded running {list(cmd)!r}: the process was killed"
        ) from None
    return result.exit_code, result.stdout, result.stderr
