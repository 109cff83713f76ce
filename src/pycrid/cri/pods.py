"""Pod and container records as CRI protobufs (CRI-TO-OCI.md §3). No behaviour here."""

from __future__ import annotations

import json
from typing import Any

from cri_api.v1 import api_pb2 as pb
from google.protobuf.json_format import MessageToDict

from pycrid.core.events import ContainerEvent
from pycrid.oci.resources import cri_resources
from pycrid.store.pods import ContainerRecord, SandboxRecord

RUNTIME_TYPE = "pycrid.runtime.v1.runc"


def sandbox_state(rec: SandboxRecord) -> pb.PodSandboxState.ValueType:
    return pb.SANDBOX_READY if rec.ready else pb.SANDBOX_NOTREADY


def sandbox_pb(rec: SandboxRecord) -> Any:
    return pb.PodSandbox(id=rec.id, metadata=rec.config.metadata, state=sandbox_state(rec),
                         created_at=rec.created_at, labels=rec.config.labels,
                         annotations=rec.config.annotations,
                         runtime_handler=rec.runtime_handler)


def sandbox_status_pb(rec: SandboxRecord) -> Any:
    status = pb.PodSandboxStatus(
        id=rec.id, metadata=rec.config.metadata, state=sandbox_state(rec),
        created_at=rec.created_at, network=pb.PodSandboxNetworkStatus(
            ip=rec.ips[0] if rec.ips else "",
            additional_ips=[pb.PodIP(ip=ip) for ip in rec.ips[1:]]),
        labels=rec.config.labels, annotations=rec.config.annotations,
        runtime_handler=rec.runtime_handler)
    status.linux.namespaces.options.CopyFrom(
        rec.config.linux.security_context.namespace_options)
    return status


def verbose_info(rec: SandboxRecord | ContainerRecord, details: dict[str, Any]) -> dict[str, str]:
    """The ``info`` map of a verbose status: the core's details plus the request config."""
    info = {**details, "runtimeType": RUNTIME_TYPE, "config": MessageToDict(rec.config)}
    return {"info": json.dumps(info)}


def container_pb(rec: ContainerRecord) -> Any:
    # ListContainers: image_ref and image_id are the image id (containerd does the same).
    return pb.Container(id=rec.id, pod_sandbox_id=rec.sandbox_id, metadata=rec.config.metadata,
                        image=rec.config.image, image_ref=rec.image_id, image_id=rec.image_id,
                        state=rec.state, created_at=rec.created_at, labels=rec.config.labels,
                        annotations=rec.config.annotations)


def container_status_pb(rec: ContainerRecord) -> Any:
    state = rec.state
    status = pb.ContainerStatus(
        id=rec.id, metadata=rec.config.metadata, state=state, created_at=rec.created_at,
        exit_code=rec.exit_code, image=pb.ImageSpec(image=rec.image_name),
        image_ref=rec.image_ref, image_id=rec.image_id, reason=rec.reason,
        message=rec.message, labels=rec.config.labels, annotations=rec.config.annotations,
        mounts=rec.config.mounts, log_path=rec.log_path,
        stop_signal=pb.Signal.Value(rec.stop_signal) if rec.stop_signal in pb.Signal.keys()
        else pb.SIGTERM)
    if state != pb.CONTAINER_CREATED:
        status.started_at = rec.started_at
    if state in (pb.CONTAINER_EXITED, pb.CONTAINER_UNKNOWN):
        status.finished_at = rec.finished_at
    status.user.linux.uid = rec.uid
    status.user.linux.gid = rec.gid
    status.user.linux.supplemental_groups.extend(rec.groups)
    status.resources.linux.CopyFrom(cri_resources(rec.resources))  # §3: from the spec
    return status



def container_event_pb(event: ContainerEvent) -> Any:
    """A GetContainerEvents item: the pod and its containers as they were at the event."""
    resp = pb.ContainerEventResponse(
        container_id=event.container_id, container_event_type=event.kind,
        created_at=event.at_ns,
        containers_statuses=[container_status_pb(c) for c in event.containers])
    if event.sandbox is not None:
        resp.pod_sandbox_status.CopyFrom(sandbox_status_pb(event.sandbox))
    return resp
