"""App container bundles on snapshots: the ContainerBundles the daemon uses.

A bundle is a writable snapshot of the image mounted as its rootfs, a read-only view
per image volume, the image's VOLUMEs copied out of the rootfs, and the spec
oci/container_spec.py builds. Every path is derived from the container's id
(``ContainerPaths``), so ``remove`` undoes a half-made bundle, removes a finished one,
and cleans up after a crash.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import os
import shutil
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from cri_api.v1 import api_pb2 as pb

from pycrid.cri_fields import set_image_ref
from pycrid.errors import FailedPrecondition, InvalidArgument, NotFound
from pycrid.faults import failpoint
from pycrid.host import space
from pycrid.host.mounts import mount, mounts_under, unmount
from pycrid.images.snapshots import Snapshotter
from pycrid.oci.container_spec import ContainerSpecRequest, container_spec
from pycrid.oci.spec import pod_idmap
from pycrid.oci.spec_inputs import NO_HANDLER, HandlerOptions, HostInput, ImageInput, SpecPolicy
from pycrid.oci.spec_mounts import IMAGE_VOLUME_FAILED
from pycrid.runtime.bundle import (
    ContainerPaths,
    copy_image_volume,
    prepare_rootfs,
    read_etc,
    read_spec,
    remove_bundle,
    write_spec,
)
from pycrid.runtime.checkpoint_archive import copy_files
from pycrid.runtime.container_bundles import (
    ContainerBundle,
    ContainerBundleRequest,
    ContainerBundles,
    ContainerPod,
    VolumeImage,
)
from pycrid.runtime.devices import cri_devices, nodes_under
from pycrid.runtime.handlers import HandlerSpec
from pycrid.runtime.image_volumes import PREFIX as IMAGE_VOLUMES
from pycrid.runtime.image_volumes import mount_image_volume, remove_image_volumes
from pycrid.runtime.mapped_rootfs import RootfsMapping
from pycrid.runtime.rootfs_diff import apply_diff, write_diff
from pycrid.tasks import stoppable_thread


@dataclass(frozen=True)
class BundleSettings:
    """What every container's spec takes from the host and the node's configuration."""

    host: HostInput = field(default_factory=HostInput)
    policy: SpecPolicy = field(default_factory=SpecPolicy)
    #: Spec options and features of each runtime handler, by name.
    handlers: Mapping[str, HandlerSpec] = field(default_factory=dict)
    default_handler: str = "runc"
    #: A chowned copy of the image for pods in a user namespace where idmapped layers
    #: fail (containerd's slow_chown).
    slow_chown: bool = False


class SnapshotBundles(ContainerBundles):
    def __init__(self, snapshotter: Snapshotter, paths: ContainerPaths,
                 settings: BundleSettings) -> None:
        self.snapshotter = snapshotter
        self.paths = paths
        self.settings = settings
        # Searchable, not listable: the root of a pod in a user namespace passes through
        # to its bundle (which is its own, 0710).
        containers = os.path.join(paths.state_dir, "containers")
        os.makedirs(containers, mode=0o711, exist_ok=True)
        os.chmod(containers, 0o711)
        os.makedirs(os.path.join(paths.root_dir, "containers"), mode=0o700, exist_ok=True)

    async def build(self, req: ContainerBundleRequest) -> ContainerBundle:
        # Both live under the root (the layer among the snapshots, volumes beside it).
        with space.writing(f"the writable layer and volumes of container {req.id}",
                           self.paths.volumes(req.id)):
            return await asyncio.to_thread(self._build, req)

    async def write_spec(self, container_id: str, spec: dict[str, Any]) -> None:
        bundle = self.paths.bundle(container_id)
        with space.writing(f"the spec of container {container_id}", bundle):
            await asyncio.to_thread(write_spec, bundle, spec)

    def read_spec(self, container_id: str) -> dict[str, Any]:
        return read_spec(self.paths.bundle(container_id))

    async def remove(self, container_id: str) -> Sequence[str]:
        return await asyncio.to_thread(self._remove, container_id)

    async def rootfs_diff(self, container_id: str, dest: str) -> None:
        upper = self.snapshotter.upper_dir(container_id)
        lowers = self._lowers(container_id)
        await stoppable_thread(lambda stop: write_diff(upper, lowers, dest, stop))

    async def copy_image(self, container_id: str, chain_top: str, dest: str) -> None:
        key = f"{IMAGE_VOLUMES}{container_id}/checkpoint"  # removed with the container
        target = os.path.join(self.paths.bundle(container_id), "checkpoint-image")

        def copy(stop: threading.Event) -> None:
            os.makedirs(target, mode=0o700, exist_ok=True)
            try:
                for m in self.snapshotter.view(key, chain_top,
                                               labels={"pycrid.io/container": container_id}):
                    mount(m, target)
                copy_files(target, dest, stop)
            finally:
                for mp in reversed(mounts_under(target)):
                    unmount(mp, detach=True)
                with contextlib.suppress(NotFound):
                    self.snapshotter.remove(key)
                with contextlib.suppress(OSError):
                    os.rmdir(target)

        await stoppable_thread(copy)

    def image_layers(self, chain_top: str) -> list[str]:
        return [self.snapshotter.upper_dir(chain_top), *self._lowers(chain_top)]

    def _apply_diff(self, cid: str, diff: str) -> None:
        apply_diff(diff, self.snapshotter.upper_dir(cid), self._lowers(cid))

    def _lowers(self, key: str) -> list[str]:
        """The directories of the layers under snapshot ``key``, top first."""
        out: list[str] = []
        parent = self.snapshotter.stat(key).parent
        while parent:
            out.append(self.snapshotter.upper_dir(parent))
            parent = self.snapshotter.stat(parent).parent
        return out

    def _build(self, req: ContainerBundleRequest) -> ContainerBundle:
        """Rootfs (a restore's changes applied first), image volumes and spec."""
        cid = req.id
        bundle = self.paths.bundle(cid)
        mapping = self._mapping(req.pod)
        fill = (functools.partial(self._apply_diff, cid, req.rootfs_diff)
                if req.rootfs_diff else None)
        rootfs = prepare_rootfs(self.snapshotter, cid, req.image.chain_top, bundle, mapping,
                                fill)
        failpoint("container.rootfs")
        config = self._mount_image_volumes(cid, req.config, req.image.volumes, mapping)
        volumes_dir = os.path.join(self.paths.volumes(cid), "volumes")
        privileged = config.linux.security_context.privileged
        devices = cri_devices(list(config.devices))
        host_devices = nodes_under("/dev", "/dev") if privileged else ()
        spec = container_spec(
            ContainerSpecRequest(
                config, req.pod.config, container_id=cid, sandbox_id=req.pod.id,
                image_name=config.image.image, namespaces=req.pod.namespaces,
                files=req.pod.files, volumes_dir=volumes_dir, target_pid=req.target_pid,
                devices=devices, host_devices=host_devices),
            ImageInput(req.image.config, etc_passwd=read_etc(rootfs, "passwd"),
                       etc_group=read_etc(rootfs, "group")),
            host=dataclasses.replace(self.settings.host, hostname=os.uname().nodename),
            policy=self.settings.policy,
            handler=self._handler_options(req.pod.runtime_handler, config))
        for m in spec["mounts"]:
            if m["source"].startswith(volumes_dir + os.sep):
                copy_image_volume(rootfs, m["destination"], m["source"])
        for m in config.mounts:
            if m.host_path and not os.path.exists(m.host_path):
                os.makedirs(m.host_path, mode=0o755, exist_ok=True)  # as containerd does
        return ContainerBundle(spec, config)

    def _mapping(self, pod: ContainerPod) -> RootfsMapping | None:
        """How the layers must look to a pod in a user namespace (None: as they are)."""
        idmap = pod_idmap(pod.config.linux.security_context.namespace_options)
        if idmap is None:
            return None
        if pod.namespaces.user is None:
            raise FailedPrecondition(f"pod {pod.id} has no pinned user namespace (made "
                                     "before this version knew user-namespace pods?)")
        return RootfsMapping(idmap, pod.namespaces.user, self.settings.slow_chown)

    def _mount_image_volumes(self, cid: str, config: pb.ContainerConfig,
                             images: Mapping[int, VolumeImage],
                             mapping: RootfsMapping | None) -> pb.ContainerConfig:
        """Mount each image volume (runtime/image_volumes.py); returns the config with
        their host paths and image ids set, which ContainerStatus.mounts reports
        (containerd fills in host_path; cri-api's ImageSpec.image_ref is the id that
        PullImage answered)."""
        if not images:
            return config
        resolved = pb.ContainerConfig()
        resolved.CopyFrom(config)
        for i, img in images.items():
            m = resolved.mounts[i]
            m.host_path = mount_image_volume(
                self.snapshotter, container_id=cid, index=i, parent=img.chain_top,
                bundle=self.paths.bundle(cid), sub_path=m.image_sub_path,
                what=f"{IMAGE_VOLUME_FAILED}: mount {m.container_path!r} of image "
                     f"{m.image.image!r}", mapping=mapping)
            set_image_ref(m.image, img.image_id)
        failpoint("container.image_volumes")
        return resolved

    def _handler_options(self, name: str, config: pb.ContainerConfig) -> HandlerOptions:
        """The spec options that come from the pod's runtime handler."""
        handler = self.settings.handlers.get(name or self.settings.default_handler)
        if handler is None:
            return NO_HANDLER
        if not handler.features.user_namespaces:
            # runc without idmapped mounts ignores a mapping: refuse instead of dropping it.
            for m in config.mounts:
                if m.uidMappings or m.gidMappings:
                    raise InvalidArgument(
                        f"mount {m.container_path!r} asks for an idmapped mount, which runtime "
                        f"handler {handler.name!r} does not support (its runc has none)")
        return HandlerOptions(
            base_spec=handler.base_spec, pod_annotations=handler.pod_annotations,
            container_annotations=handler.container_annotations,
            privileged_without_host_devices=handler.privileged_without_host_devices,
            rro_supported=handler.features.recursive_read_only_mounts,
            sandboxed=handler.sandboxed, capabilities=handler.capabilities)

    def _remove(self, cid: str) -> Sequence[str]:
        """Bundle (mounts first), rootfs snapshot, image volume views, copied VOLUMEs;
        returns the parents of the snapshots removed."""
        released = remove_bundle(self.snapshotter, cid, self.paths.bundle(cid))
        released += remove_image_volumes(self.snapshotter, cid)
        shutil.rmtree(self.paths.volumes(cid), ignore_errors=True)
        return released
