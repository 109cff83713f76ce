"""Which cgroup and which process stand for a pod: the one answer stats, NRI and the
kubelet's cAdvisor (through containerd's API) all use.

The pod's sandbox controller answers first (sandbox/controller.py ``anchor``): a pause
is its own cgroup and process. A pod without a process of its own (pinned namespaces,
drop_infra_ctr) gets one of its running containers as its process, the first in record
order: that container is in the pod's network namespace, which is what the pid is asked
for (CRI-O answers cAdvisor the same way for a pod whose infra container it dropped,
cri-o/cri-o#4613; when that container exits, the next one stands in).
"""

from __future__ import annotations

import dataclasses

from cri_api.v1 import api_pb2 as pb

from pycrid.sandbox.controller import SandboxAnchor, SandboxController
from pycrid.store.records import ContainerRecord, RecordStore, SandboxRecord


class PodAnchors:
    def __init__(self, *, controller: SandboxController,
                 sandboxes: RecordStore[SandboxRecord],
                 containers: RecordStore[ContainerRecord]) -> None:
        self.controller = controller
        self.sandboxes = sandboxes
        self.containers = containers

    def refresh(self, sandbox_id: str) -> None:
        """After one of the pod's containers started or exited (and for every pod after a
        restart): its controller learns which container stands for the pod now."""
        pod = self.sandboxes.get(sandbox_id)
        if pod is not None and pod.ready and not self.controller.anchor(pod).pid:
            # Only a pod without a process of its own needs a stand-in (and the walk over
            # every container that finds one).
            self.controller.stand_in(pod, self._running_pid(pod.id))

    def _running_pid(self, sandbox_id: str) -> int:
        return next((c.pid for c in self.containers.all()
                     if c.sandbox_id == sandbox_id and c.state == pb.CONTAINER_RUNNING
                     and c.pid > 0), 0)

    def of(self, pod: SandboxRecord) -> SandboxAnchor:
        """Memory only (a pause being created: its pid file)."""
        own = self.controller.anchor(pod)
        if own.pid or not pod.ready:
            return own
        return dataclasses.replace(own, pid=self._running_pid(pod.id))


__all__ = ["PodAnchors"]
