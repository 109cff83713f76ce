"""CRI container events (``GetContainerEvents``), as containerd emits them.

Containers: CREATED after CreateContainer, STARTED after StartContainer,
STOPPED when the exit is recorded (whoever records it: the exit monitor, a
stop, a failed start, recovery), DELETED after RemoveContainer. Pods, under
their sandbox id: CREATED and STARTED at the end of RunPodSandbox, STOPPED
when the pod stops being ready, DELETED after RemovePodSandbox. Each event
carries the pod's record and its containers' records as they were at that
moment (records are immutable, so this costs a tuple), and the CRI layer turns
them into ``PodSandboxStatus``/``ContainerStatus`` when it sends.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from cri_api.v1 import api_pb2 as pb

from pycrid.events.broadcast import Broadcast
from pycrid.store.records import ContainerRecord, RecordStore, SandboxRecord

CREATED = pb.CONTAINER_CREATED_EVENT
STARTED = pb.CONTAINER_STARTED_EVENT
STOPPED = pb.CONTAINER_STOPPED_EVENT
DELETED = pb.CONTAINER_DELETED_EVENT


@dataclass(frozen=True)
class ContainerEvent:
    container_id: str
    kind: pb.ContainerEventType.ValueType
    at_ns: int
    #: The pod as it was (None once it is gone).
    sandbox: SandboxRecord | None
    containers: tuple[ContainerRecord, ...]


class ContainerEvents:
    def __init__(self, sandboxes: RecordStore[SandboxRecord],
                 containers: RecordStore[ContainerRecord]) -> None:
        self.sandboxes = sandboxes
        self.containers = containers
        self.broadcast: Broadcast[ContainerEvent] = Broadcast()

    def emit(self, kind: pb.ContainerEventType.ValueType, object_id: str,
             sandbox_id: str) -> None:
        members = tuple(c for c in self.containers.all()
                        if c.sandbox_id == sandbox_id and not c.creating)
        self.broadcast.publish(ContainerEvent(object_id, kind, time.time_ns(),
                                              self.sandboxes.get(sandbox_id), members))
