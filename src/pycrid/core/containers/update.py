"""UpdateContainerResources, and an NRI plugin's new limits for a container: both go to
the live cgroup, the spec and the record the same way."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from cri_api.v1 import api_pb2 as pb

from pycrid.core.containers.parts import ContainerParts, state_name
from pycrid.core.nri_objects import resources_from_cri
from pycrid.errors import FailedPrecondition
from pycrid.oci.resources import (
    apply,
    cri_from_nri,
    merge_update,
    record_of,
    update_payload,
    validate,
)
from pycrid.operations import detached


@detached("UpdateContainerResources")
async def update_resources(parts: ContainerParts, prefix: str,
                           linux: pb.LinuxContainerResources | None) -> None:
    """UpdateContainerResources: NRI UpdateContainer may replace the request (a refusal
    fails the call), the result goes to the live cgroup and the spec, PostUpdate."""
    async with parts.nri.blocking_sync():
        rec = parts.find(prefix, visible=True)
        async with parts.locks(rec.id).write():
            rec = parts.current(rec.id)
            if rec.state not in (pb.CONTAINER_CREATED, pb.CONTAINER_RUNNING):
                raise FailedPrecondition(f"container {rec.id} is in "
                                         f"{state_name(rec.state)} state: cannot update it")
            linux = linux or pb.LinuxContainerResources()
            validate(linux, parts.resource_policy)  # before NRI or runc see it
            requested = resources_from_cri(linux)
            final = await parts.nri.update_container(rec, requested)
            if final is not requested:  # a plugin's answer replaces the request
                linux = cri_from_nri(final)
            # containerd's updateOCIResource: the same rules as at create.
            await _set_resources(
                parts, rec.id, lambda current: apply(current, linux, parts.resource_policy))
            await parts.nri.post_update(rec, final)


async def apply_resources(parts: ContainerParts, cid: str, resources: dict[str, Any]) -> None:
    """An NRI plugin's new cgroup limits (only the changed fields) for a created or
    running container, laid over the current ones."""
    rec = parts.current(cid)
    if rec.state not in (pb.CONTAINER_CREATED, pb.CONTAINER_RUNNING):
        raise FailedPrecondition(f"container {cid} is {state_name(rec.state)}")
    await _set_resources(parts, cid, lambda current: merge_update(current, resources))


async def _set_resources(parts: ContainerParts, cid: str,
                         new: Callable[[Mapping[str, Any]], dict[str, Any]]) -> None:
    """Both update paths end here: ``new`` turns the spec's resources into the next
    ones, which go whole to ``runc update`` (memory and memsw together, so raising and
    lowering both pass the v1 kernel's checks), then to the spec and the record, so
    status and restarts see them."""
    spec = parts.bundles.read_spec(cid)
    linux = spec.setdefault("linux", {})
    resources = new(linux.get("resources") or {})
    await parts.runtime.update(cid, update_payload(resources))
    linux["resources"] = resources
    await parts.bundles.write_spec(cid, spec)
    parts.store.update(cid, resources=record_of(spec))
