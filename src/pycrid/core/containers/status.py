"""ListContainers and ContainerStatus's verbose info (the status itself is the record's)."""

from __future__ import annotations

from typing import Any

from cri_api.v1 import api_pb2 as pb

from pycrid.core.containers.parts import ContainerParts, labels_match
from pycrid.errors import NotFound
from pycrid.store.records import ContainerPhase, ContainerRecord


def list_containers(parts: ContainerParts,
                    flt: pb.ContainerFilter | None) -> list[ContainerRecord]:
    recs = parts.store.visible()
    if flt is None:
        return recs
    if flt.id:
        recs = [r for r in recs if r.id.startswith(flt.id)]
    if flt.pod_sandbox_id:
        recs = [r for r in recs if r.sandbox_id.startswith(flt.pod_sandbox_id)]
    if flt.HasField("state"):
        recs = [r for r in recs if r.state == flt.state.state]
    if flt.label_selector:
        recs = [r for r in recs if labels_match(flt.label_selector, r.config.labels)]
    return recs


def container_details(parts: ContainerParts, rec: ContainerRecord) -> dict[str, Any]:
    """ContainerStatus verbose info (containerd's keys)."""
    try:
        spec: dict[str, Any] | None = parts.bundles.read_spec(rec.id)
    except NotFound:
        spec = None
    removing = rec.phase is ContainerPhase.REMOVING
    return {"sandboxID": rec.sandbox_id, "pid": rec.pid, "removing": removing,
            "snapshotKey": rec.id, "snapshotter": parts.images.snapshotter.name,
            "runtimeSpec": spec}
