"""Mount lists for pause and app containers (CRI-TO-OCI.md §1.6, §2.6, §2.7).

Pure: host facts (which sandbox files exist, symlink-resolved host paths,
whether a source mount is shared) are the caller's job; this module only
turns CRI mounts and sandbox paths into OCI mount entries in the right order.
"""

from __future__ import annotations

import hashlib
import posixpath
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from cri_api.v1 import api_pb2 as pb

from pycrid.errors import InvalidArgument
from pycrid.oci.defaults import Spec
from pycrid.oci.spec_inputs import NO_HANDLER, HandlerOptions

HOST_SHM = "/dev/shm"
_SANDBOX_FILE_OPTS = ["rbind", "ro", "nosuid", "nodev", "noexec"]


@dataclass(frozen=True)
class SandboxFiles:
    """Host paths of the per-pod files (§1.5); None means the file does not exist."""

    hostname: str | None = None
    hosts: str | None = None
    resolv_conf: str | None = None
    shm: str | None = None


@dataclass(frozen=True)
class ImageVolume:
    """An image-declared VOLUME: ``source`` must be filled with the image's content."""

    destination: str
    source: str


def clean(path: str) -> str:
    """Go's filepath.Clean for absolute POSIX paths (normpath keeps a leading //)."""
    cleaned = posixpath.normpath(path)
    return "/" + cleaned.lstrip("/") if cleaned.startswith("//") else cleaned


def sandbox_mounts(
    base: list[Spec], files: SandboxFiles, *, host_ipc: bool, bind_sys: bool
) -> list[Spec]:
    """§1.6: base mounts minus the default /dev/shm, then /dev/shm and resolv.conf."""
    mounts = [m for m in base if m["destination"] != "/dev/shm"]
    if bind_sys:
        mounts = [sys_bind() if m["destination"] == "/sys" else m for m in mounts]
    shm = HOST_SHM if host_ipc else files.shm
    if shm is not None:
        mounts.append({"destination": "/dev/shm", "type": "bind", "source": shm,
                       "options": list(_SANDBOX_FILE_OPTS)})
    if files.resolv_conf is not None:
        mounts.append({"destination": "/etc/resolv.conf", "type": "bind",
                       "source": files.resolv_conf, "options": list(_SANDBOX_FILE_OPTS)})
    return mounts


def sys_bind() -> Spec:
    """Host-network pods in a user ns cannot mount a fresh sysfs; bind the host's."""
    return {"destination": "/sys", "type": "bind", "source": "/sys",
            "options": ["rbind", "rro", "nosuid", "nodev", "noexec"]}


def image_volumes(
    config: pb.ContainerConfig, image_config: dict[str, Any], *, container_id: str,
    volumes_dir: str,
) -> list[ImageVolume]:
    """§2.7: image VOLUMEs not covered by a CRI mount, each with its own host dir.

    The dir name is a sha256 of container id and path (64 hex, like containerd's
    random id) so the builder stays deterministic and the caller can recompute it.
    """
    taken = {clean(m.container_path) for m in config.mounts}
    volumes = (image_config.get("config") or {}).get("Volumes") or {}
    out: list[ImageVolume] = []
    for raw in sorted(volumes):
        dest = clean(raw if raw.startswith("/") else "/" + raw)
        if dest in taken:
            continue
        taken.add(dest)
        digest = hashlib.sha256(f"{container_id}\0{dest}".encode()).hexdigest()
        out.append(ImageVolume(dest, posixpath.join(volumes_dir, digest)))
    return out


#: The CRI's name for a failed image volume (cri-api pkg/errors): containerd and CRI-O
#: start such errors with it, and people and tools look for it in the kubelet's events.
IMAGE_VOLUME_FAILED = "ImageVolumeMountFailed"


def is_image_mount(mount: pb.Mount) -> bool:
    """An image volume (KEP-4639): the image named in ``Mount.image`` is the source."""
    return mount.HasField("image") and bool(mount.image.image)


def check_image_mount(mount: pb.Mount) -> None:
    """containerd's rules for an image volume: no host_path, and read-only."""
    where = f"{IMAGE_VOLUME_FAILED}: mount {mount.container_path!r} of image {mount.image.image!r}"
    if mount.host_path:
        raise InvalidArgument(f"{where}: an image volume takes no host_path "
                              f"(got {mount.host_path!r})")
    if not mount.readonly:
        raise InvalidArgument(f"{where}: an image volume must be read-only (readonly: true)")


def cri_mount(mount: pb.Mount, *, rro_supported: bool = False,
              sandboxed: bool = False) -> tuple[Spec, str | None]:
    """One CRI Mount as an OCI bind mount, plus the rootfs propagation it needs.

    An image volume arrives mounted: the caller set its host_path to the mounted image.
    Under gVisor (``sandboxed``) a bind mount is one tree served by its gofer, mounts
    below it on the host included: a read-only one is read-only all the way down (so
    recursive read-only is plain "ro" there), and nothing is shared back with the host.
    """
    if is_image_mount(mount) and not mount.host_path:
        raise InvalidArgument(f"{IMAGE_VOLUME_FAILED}: mount {mount.container_path!r}: "
                              f"image {mount.image.image!r} has not been mounted")
    options = ["rbind"]
    needs: str | None = None
    prop = mount.propagation
    if prop == pb.PROPAGATION_HOST_TO_CONTAINER:
        options.append("rslave")
        needs = "rslave"
    elif prop == pb.PROPAGATION_BIDIRECTIONAL:
        if sandboxed:
            raise InvalidArgument(
                f"mount {mount.container_path!r}: propagation Bidirectional: gVisor (runsc) "
                "cannot share a container's mounts with the host")
        options.append("rshared")
        needs = "rshared"
    else:
        options.append("rprivate")
    if mount.recursive_read_only:
        if not mount.readonly:
            raise InvalidArgument(
                f"mount {mount.container_path!r}: recursive_read_only needs readonly"
            )
        if prop != pb.PROPAGATION_PRIVATE:
            raise InvalidArgument(
                f"mount {mount.container_path!r}: recursive_read_only needs private propagation"
            )
        if not rro_supported:
            raise InvalidArgument(
                f"mount {mount.container_path!r}: the runtime handler lacks recursive read-only"
            )
        options.append("ro" if sandboxed else "rro")
    else:
        options.append("ro" if mount.readonly else "rw")
    entry: Spec = {"destination": mount.container_path, "type": "bind",
                   "source": mount.host_path, "options": options}
    if mount.uidMappings:
        entry["uidMappings"] = _idmap(mount.uidMappings)
    if mount.gidMappings:
        entry["gidMappings"] = _idmap(mount.gidMappings)
    return entry, needs


def _idmap(maps: Iterable[pb.IDMapping]) -> list[Spec]:
    return [{"containerID": m.container_id, "hostID": m.host_id, "size": m.length}
            for m in maps]


def _plain(dest: str, source: str, readonly: bool,
           userns: pb.UserNamespace | None = None) -> pb.Mount:
    """A mount the runtime adds; in a pod's user namespace idmapped with the pod's
    mappings, so that its root owns what the node's root does (containerd's
    linuxContainerMounts and volumeMounts)."""
    out = pb.Mount(container_path=dest, host_path=source, readonly=readonly)
    if userns is not None:
        out.uidMappings.extend(userns.uids)
        out.gidMappings.extend(userns.gids)
    return out


def container_mounts(
    base: list[Spec],
    cgroup_mount: Spec,
    config: pb.ContainerConfig,
    files: SandboxFiles,
    volumes: Sequence[ImageVolume],
    *,
    handler: HandlerOptions = NO_HANDLER,
    userns: pb.UserNamespace | None = None,
) -> tuple[list[Spec], str | None]:
    """§2.6: filtered base + cgroup mount, then CRI mounts and extras sorted by depth.
    In a pod's user namespace (``userns``) the pod files and image VOLUMEs are idmapped;
    /dev/shm is not (a tmpfs of mode 1777: containerd leaves it unmapped too).

    Returns the mounts and the rootfsPropagation ("rslave"/"rshared") or None.
    """
    sc = config.linux.security_context
    readonly_rootfs, host_ipc = sc.readonly_rootfs, sc.namespace_options.ipc == pb.NODE
    supplied = list(config.mounts)
    taken = {clean(m.container_path) for m in supplied}
    extras = [
        ("/etc/hostname", files.hostname, readonly_rootfs, userns),
        ("/etc/hosts", files.hosts, readonly_rootfs, userns),
        ("/etc/resolv.conf", files.resolv_conf, readonly_rootfs, userns),
        ("/dev/shm", HOST_SHM if host_ipc else files.shm, False, None),
        *((v.destination, v.source, False, userns) for v in volumes),
    ]
    for dest, source, readonly, mapped in extras:
        if source is not None and clean(dest) not in taken:
            supplied.append(_plain(dest, source, readonly, mapped))
            taken.add(clean(dest))
    converted: list[Spec] = []
    propagation: str | None = None
    for mount in supplied:
        entry, needs = cri_mount(mount, rro_supported=handler.rro_supported,
                                 sandboxed=handler.sandboxed)
        converted.append(entry)
        if needs == "rshared" or (needs == "rslave" and propagation != "rshared"):
            propagation = needs
    converted.sort(key=lambda m: clean(m["destination"]).count("/"))
    kept = [
        m for m in [*base, cgroup_mount]
        if clean(m["destination"]) not in taken
        and not ("/dev" in taken and clean(m["destination"]).startswith("/dev/"))
    ]
    return kept + converted, propagation
