"""The container bundle interface: what the core asks of whoever makes an app
container's bundle (its rootfs, image volumes and ``config.json``).

The container side's counterpart of the sandbox controller (sandbox/controller.py),
which makes a pod's: the core decides (ids, records, NRI, the runtime calls) and
hands this part a typed request; the part owns the files. The implementation on
snapshots is runtime/snapshot_bundles.py.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from cri_api.v1 import api_pb2 as pb

from pycrid.oci.spec import Namespaces
from pycrid.oci.spec_mounts import SandboxFiles


@dataclass(frozen=True)
class VolumeImage:
    """The image a CRI image-volume mount shows (KEP-4639), resolved by the core."""

    #: The image's id (what PullImage answered: ContainerStatus reports it).
    image_id: str
    #: The chain id of its top layer: the snapshot the read-only view is made of.
    chain_top: str


@dataclass(frozen=True)
class ContainerImage:
    """The container's image, resolved by the core."""

    #: The OCI image config JSON.
    config: dict[str, Any]
    #: The chain id of its top layer (None: an image without layers).
    chain_top: str | None
    #: The image of each image-volume mount, by the mount's index in the config.
    volumes: Mapping[int, VolumeImage] = field(default_factory=dict)


@dataclass(frozen=True)
class ContainerPod:
    """What the container's pod gives it."""

    id: str
    #: The pod's config, its cgroup parent as the create asked for it.
    config: pb.PodSandboxConfig
    #: The namespaces the container joins, the files it mounts (the sandbox controller's).
    namespaces: Namespaces
    files: SandboxFiles
    #: The pod's runtime handler ("": the default).
    runtime_handler: str = ""


@dataclass(frozen=True)
class ContainerBundleRequest:
    id: str
    config: pb.ContainerConfig
    pod: ContainerPod
    image: ContainerImage
    #: The pid of the running container whose PID namespace a TARGET one joins.
    target_pid: int | None = None
    #: A directory with a checkpoint's rootfs-diff.tar and deleted.files: applied to the
    #: new writable layer before it is mounted (a restore; "" for none).
    rootfs_diff: str = ""


@dataclass(frozen=True)
class ContainerBundle:
    """What ``build`` made."""

    #: The spec, not written yet: NRI plugins may adjust it first.
    spec: dict[str, Any]
    #: The config with the image volumes' host paths and image ids filled in, which
    #: ContainerStatus.mounts reports.
    config: pb.ContainerConfig


class ContainerBundles(abc.ABC):
    @abc.abstractmethod
    async def build(self, req: ContainerBundleRequest) -> ContainerBundle:
        """Make the rootfs and image volumes and build the spec. A failure leaves what
        was made for ``remove``, as every other step of a create does."""

    @abc.abstractmethod
    async def write_spec(self, container_id: str, spec: dict[str, Any]) -> None:
        """Write the bundle's config.json (the built spec, or one with new resources)."""

    @abc.abstractmethod
    def read_spec(self, container_id: str) -> dict[str, Any]:
        """The bundle's config.json; NotFound when there is none."""

    @abc.abstractmethod
    async def rootfs_diff(self, container_id: str, dest: str) -> None:
        """Write the changes of the container's writable layer into ``dest`` (a
        checkpoint's rootfs-diff.tar and deleted.files); the container should be frozen.
        Cancelling stops it."""

    @abc.abstractmethod
    async def copy_image(self, container_id: str, chain_top: str, dest: str) -> None:
        """Copy the files of an image (a checkpoint image) into ``dest``, through a
        read-only view of its layers that is gone when this returns."""

    @abc.abstractmethod
    def image_layers(self, chain_top: str) -> list[str]:
        """The directories of an image's layers, top first (to read a few files)."""

    @abc.abstractmethod
    async def remove(self, container_id: str) -> Sequence[str]:
        """Every file of the container but its log (idempotent; also undoes a partial
        build). Returns the parents of the snapshots removed: image chains that may
        now be collected."""
