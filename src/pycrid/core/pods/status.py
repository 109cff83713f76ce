"""PodSandboxStatus and ListPodSandbox: answered from the records, plus (verbose) what
the controller and the network report, under containerd's keys."""

from __future__ import annotations

from typing import Any

from cri_api.v1 import api_pb2 as pb

from pycrid.core.containers import labels_match
from pycrid.core.pods.pod_parts import PodParts
from pycrid.oci.resources import resources_json
from pycrid.store.records import SandboxRecord


def list_pods(parts: PodParts, flt: pb.PodSandboxFilter | None) -> list[SandboxRecord]:
    recs = parts.store.visible()
    if flt is None:
        return recs
    if flt.id:
        recs = [r for r in recs if r.id.startswith(flt.id)]
    if flt.HasField("state"):
        want_ready = flt.state.state == pb.SANDBOX_READY
        recs = [r for r in recs if r.ready == want_ready]
    if flt.label_selector:
        recs = [r for r in recs if labels_match(flt.label_selector, r.config.labels)]
    return recs


async def pod_details(parts: PodParts, rec: SandboxRecord) -> dict[str, Any]:
    """PodSandboxStatus verbose info (containerd's keys)."""
    status = await parts.controller.status(rec.id, verbose=True)
    return {"pid": rec.pid, "processStatus": status.state.value,
            "netNamespaceClosed": bool(rec.netns) and not parts.network.netns_pinned(rec.netns),
            "netns": rec.netns, "image": rec.image_name, "snapshotKey": rec.id,
            "cniResult": parts.network.results(rec.id),
            "snapshotter": parts.images.snapshotter.name,
            "runtimeSpec": status.info.get("runtimeSpec"), **_recorded_resources(rec)}


def _recorded_resources(rec: SandboxRecord) -> dict[str, Any]:
    """Verbose info ``overhead`` and ``resources`` (containerd's keys, ``{"linux": ...}``):
    from RunPodSandbox, replaced by UpdatePodSandboxResources."""
    linux = rec.config.linux
    return {key: {"linux": resources_json(getattr(linux, key))}
            for key in ("overhead", "resources") if linux.HasField(key)}
