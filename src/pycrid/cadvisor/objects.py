"""pycrid's pods and containers as containerd's CRI plugin records them (pure).

A pod is one containerd container of kind ``sandbox`` (what its sandbox controller
names as its anchor: the pause), each of its containers one of kind ``container``; the
ids are pycrid's, which is what cAdvisor's containerd driver expects to find at the end
of a cgroup path (pycrid's layout is containerd's: ``<parent>/<id>``, or
``cri-containerd-<id>.scope`` with systemd). Labels are built the way containerd's
``buildLabels`` does: the image's, then the CRI config's over them, then the kind.
cAdvisor reads ``io.kubernetes.*`` from them to name a cgroup's pod and container, and
gathers network counters only for the kind ``sandbox``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from google.protobuf.any_pb2 import Any as AnyPb
from google.protobuf.timestamp_pb2 import Timestamp

from pycrid.cadvisor.proto import containers_pb2, task_pb2
from pycrid.store.records import ContainerRecord, SandboxRecord

KIND_LABEL = "io.cri-containerd.kind"
SANDBOX = "sandbox"
CONTAINER = "container"
#: containerd's typeurl of an OCI runtime spec carried as JSON.
SPEC_TYPE_URL = "types.containerd.io/opencontainers/runtime-spec/1/Spec"
#: The runtime type of every pycrid handler (runc; conmon watches it, not a shim).
RUNTIME_TYPE = "io.containerd.runc.v2"
SNAPSHOTTER = "overlayfs"
#: containerd refuses a label whose key and value together are longer.
MAX_LABEL = 4096


def labels(cri: Mapping[str, str], image: Mapping[str, str], kind: str) -> dict[str, str]:
    """containerd's label set: image labels (those it would accept), CRI labels, kind."""
    out = {k: v for k, v in image.items() if k and len(k) + len(v) <= MAX_LABEL}
    out.update(cri)
    out[KIND_LABEL] = kind
    return out


def _timestamp(ns: int) -> Timestamp:
    ts = Timestamp()
    ts.FromNanoseconds(ns)
    return ts


def container_message(*, id: str, labels: Mapping[str, str], image: str, spec: bytes,
                      created_at: int, updated_at: int) -> containers_pb2.Container:
    """One containerd container record; ``spec`` is the OCI config.json's bytes."""
    return containers_pb2.Container(
        id=id, labels=dict(labels), image=image,
        runtime=containers_pb2.Container.Runtime(name=RUNTIME_TYPE),
        spec=AnyPb(type_url=SPEC_TYPE_URL, value=spec),
        snapshotter=SNAPSHOTTER, snapshot_key=id,
        created_at=_timestamp(created_at), updated_at=_timestamp(updated_at or created_at))


@dataclass(frozen=True)
class Task:
    """A task as containerd's Tasks.Get reports it: the init process's pid and state."""

    status: task_pb2.Status
    pid: int = 0
    exit_status: int = 0
    #: ns since the epoch (0: unknown)
    exited_at: int = 0
    exit_reason: task_pb2.ExitReason = task_pb2.NONE

    def message(self, container_id: str) -> task_pb2.Process:
        msg = task_pb2.Process(container_id=container_id, pid=self.pid, status=self.status,
                               exit_status=self.exit_status, exit_reason=self.exit_reason)
        if self.exited_at:
            msg.exited_at.CopyFrom(_timestamp(self.exited_at))
        return msg


def container_task(rec: ContainerRecord) -> Task | None:
    """The task of a container, or None before runc created it (containerd has no task
    then either; cAdvisor retries on NotFound). pycrid keeps an exited container's runc
    state (and its cgroup) until RemoveContainer, so an exited one is STOPPED."""
    if rec.unknown:
        return Task(task_pb2.UNKNOWN, rec.pid)
    if rec.finished_at:
        reason = task_pb2.OOMKILLED if rec.reason == "OOMKilled" else task_pb2.NONE
        return Task(task_pb2.STOPPED, 0, rec.exit_code & 0xFFFFFFFF, rec.finished_at, reason)
    if rec.pid <= 0:
        return None
    return Task(task_pb2.RUNNING if rec.started_at else task_pb2.CREATED, rec.pid)


def sandbox_task(rec: SandboxRecord, pid: int) -> Task | None:
    """The task of a pod's sandbox, ``pid`` being its anchor's process: running while the
    pod is ready (or still being set up around a started sandbox), stopped after."""
    if rec.ready or rec.creating:
        return Task(task_pb2.RUNNING, pid) if pid > 0 else None
    return Task(task_pb2.STOPPED)


__all__ = ["CONTAINER", "KIND_LABEL", "SANDBOX", "SPEC_TYPE_URL", "Task", "container_message",
           "container_task", "labels", "sandbox_task"]
