"""containerd's view of pycrid's pods and containers: records from memory, specs and image
labels from the files behind them.

Exactly the objects pycrid has records of, nothing else: a pod (as its sandbox container)
and every container, from the moment its OCI spec is on disk (before that no cgroup
exists for cAdvisor to ask about) until its record is deleted.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable
from typing import TYPE_CHECKING

from pycrid.cadvisor import objects
from pycrid.cadvisor.proto import containers_pb2, task_pb2
from pycrid.errors import NotFound
from pycrid.sandbox.controller import SandboxAnchor
from pycrid.store.records import ContainerRecord, RecordStore, SandboxRecord

if TYPE_CHECKING:
    from pycrid.core.cri_service import CRIService

log = logging.getLogger(__name__)

#: Image labels are read once per image (an image id names immutable content).
_IMAGE_CACHE_SIZE = 256


class ContainerdView:
    def __init__(self, *, sandboxes: RecordStore[SandboxRecord],
                 containers: RecordStore[ContainerRecord],
                 anchor: Callable[[SandboxRecord], SandboxAnchor],
                 container_spec: Callable[[str], str],
                 image_config: Callable[[str], bytes]) -> None:
        self.sandboxes = sandboxes
        self.containers = containers
        #: Which process and cgroup stand for a pod (its sandbox controller's answer).
        self.anchor = anchor
        #: The path of a container's OCI config.json.
        self.container_spec = container_spec
        #: An image's config JSON by image id.
        self.image_config = image_config
        self._image_labels: dict[str, dict[str, str]] = {}

    def ids(self) -> list[str]:
        return self.sandboxes.ids() + self.containers.ids()

    # ---- containers (blocking: they read files; call from a worker thread) -------------

    def container(self, cid: str, namespace: str) -> containers_pb2.Container:
        """containerd's record of ``cid`` (a pod's sandbox or a container)."""
        pod = self.sandboxes.get(cid)
        if pod is not None:
            anchor = self.anchor(pod)
            return objects.container_message(
                id=pod.id, labels=objects.labels(pod.config.labels,
                                                 self._labels_of(pod.image_id),
                                                 objects.SANDBOX),
                image=pod.image_name, spec=self._spec(anchor.spec, cid, namespace),
                created_at=pod.created_at, updated_at=pod.created_at)
        ctr = self.containers.get(cid)
        if ctr is None:
            raise _not_found(cid, namespace)
        return objects.container_message(
            id=ctr.id, labels=objects.labels(ctr.config.labels, self._labels_of(ctr.image_id),
                                             objects.CONTAINER),
            image=ctr.image_name, spec=self._spec(self.container_spec(cid), cid, namespace),
            created_at=ctr.created_at, updated_at=ctr.created_at)

    def _spec(self, path: str, cid: str, namespace: str) -> bytes:
        if not path:  # an anchor without a spec of its own: an empty one still decodes
            return b"{}"
        try:
            with open(path, "rb") as f:
                return f.read()
        except FileNotFoundError:  # not written yet, or already removed
            raise _not_found(cid, namespace) from None

    def _labels_of(self, image_id: str) -> dict[str, str]:
        if not image_id:
            return {}
        cached = self._image_labels.get(image_id)
        if cached is not None:
            return cached
        try:
            config = json.loads(self.image_config(image_id))
            found = (config.get("config") or {}).get("Labels") or {}
            labels = {str(k): str(v) for k, v in found.items()}
        except (NotFound, OSError, ValueError, AttributeError) as e:
            log.debug("labels of image %s not read: %s", image_id, e)
            return {}
        if len(self._image_labels) >= _IMAGE_CACHE_SIZE:
            self._image_labels.clear()
        self._image_labels[image_id] = labels
        return labels

    # ---- tasks (memory only) -----------------------------------------------------------

    def task(self, cid: str, namespace: str) -> task_pb2.Process:
        """The task of ``cid``: NotFound for an unknown id or one with no task yet."""
        task = self._task(cid)
        if task is None:
            if self.sandboxes.get(cid) is None and self.containers.get(cid) is None:
                raise _not_found(cid, namespace)
            raise NotFound(f'no running task found: task {cid} not found')
        return task.message(cid)

    def tasks(self) -> list[task_pb2.Process]:
        return [t.message(cid) for cid in self.ids() if (t := self._task(cid)) is not None]

    def _task(self, cid: str) -> objects.Task | None:
        pod = self.sandboxes.get(cid)
        if pod is not None:
            return objects.sandbox_task(pod, self.anchor(pod).pid)
        ctr = self.containers.get(cid)
        return objects.container_task(ctr) if ctr is not None else None


def _not_found(cid: str, namespace: str) -> NotFound:
    # containerd's wording, so tools that match on it read it the same way.
    return NotFound(f'container "{cid}" in namespace "{namespace}": not found')




def view_of(core: CRIService) -> ContainerdView:
    """The view over a CRI core's stores, its pods' anchors and its bundles."""
    return ContainerdView(
        sandboxes=core.pods.store, containers=core.containers.store,
        anchor=core.anchors.of,
        container_spec=lambda cid: os.path.join(core.containers.paths.bundle(cid),
                                                "config.json"),
        image_config=core.images.content.read)


__all__ = ["ContainerdView", "view_of"]
