"""UpdatePodSandboxResources: NRI UpdatePodSandbox (a refusal fails the call), the new
values recorded in the pod's config, PostUpdatePodSandbox. The pod cgroup itself is the
kubelet's (cgroupfs driver), as with containerd's pause-container sandboxes."""

from __future__ import annotations

from cri_api.v1 import api_pb2 as pb

from pycrid.core.nri_objects import resources_from_cri
from pycrid.core.pods.pod_parts import PodParts
from pycrid.operations import detached


@detached("UpdatePodSandboxResources")
async def update_pod_resources(parts: PodParts, prefix: str,
                               overhead: pb.LinuxContainerResources | None,
                               resources: pb.LinuxContainerResources | None) -> None:
    async with parts.nri.blocking_sync():
        rec = parts.find(prefix, visible=True)
        async with parts.locks(rec.id).write():
            rec = parts.find(rec.id)
            empty = pb.LinuxContainerResources()
            await parts.nri.update_pod(rec, resources_from_cri(overhead or empty),
                                       resources_from_cri(resources or empty))
            config = pb.PodSandboxConfig()
            config.CopyFrom(rec.config)
            if overhead is not None:
                config.linux.overhead.CopyFrom(overhead)
            if resources is not None:
                config.linux.resources.CopyFrom(resources)
            rec = parts.store.update(rec.id, config=config)
            await parts.nri.post_update_pod(rec)
