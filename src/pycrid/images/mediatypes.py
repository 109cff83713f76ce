"""OCI and Docker media types, descriptors and platforms: plain data shared by the image parts."""

from __future__ import annotations

import hashlib
import platform as _platform
import re
from dataclasses import dataclass, field
from typing import Any

from pycrid.errors import DataLoss, InvalidArgument

MT_OCI_INDEX = "application/vnd.oci.image.index.v1+json"
MT_OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
MT_OCI_CONFIG = "application/vnd.oci.image.config.v1+json"
MT_OCI_LAYER = "application/vnd.oci.image.layer.v1.tar"
MT_OCI_LAYER_GZIP = "application/vnd.oci.image.layer.v1.tar+gzip"
MT_OCI_LAYER_ZSTD = "application/vnd.oci.image.layer.v1.tar+zstd"
MT_OCI_LAYER_NONDIST_GZIP = "application/vnd.oci.image.layer.nondistributable.v1.tar+gzip"
MT_DOCKER_LIST = "application/vnd.docker.distribution.manifest.list.v2+json"
MT_DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
MT_DOCKER_CONFIG = "application/vnd.docker.container.image.v1+json"
MT_DOCKER_LAYER_GZIP = "application/vnd.docker.image.rootfs.diff.tar.gzip"
MT_DOCKER_LAYER = "application/vnd.docker.image.rootfs.diff.tar"

INDEX_TYPES = frozenset({MT_OCI_INDEX, MT_DOCKER_LIST})
MANIFEST_TYPES = frozenset({MT_OCI_MANIFEST, MT_DOCKER_MANIFEST})
#: What a registry is asked for when resolving a reference (the Accept header).
ACCEPT_MANIFESTS = (MT_OCI_INDEX, MT_DOCKER_LIST, MT_OCI_MANIFEST, MT_DOCKER_MANIFEST)

_DIGEST_RE = re.compile(r"^sha256:[a-f0-9]{64}$")


def validate_digest(digest: str) -> str:
    """Return ``digest`` if it is a sha256 digest we can verify, else raise InvalidArgument."""
    if not _DIGEST_RE.match(digest):
        raise InvalidArgument(f"unsupported or malformed digest {digest!r} (want sha256:<64 hex>)")
    return digest


def sha256_digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def verify_bytes(data: bytes, digest: str, what: str) -> None:
    got = sha256_digest(data)
    if got != digest:
        raise DataLoss(f"{what}: digest mismatch: expected {digest}, got {got}")


@dataclass(frozen=True)
class Platform:
    os: str
    architecture: str
    variant: str = ""

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> Platform:
        return cls(
            os=str(obj.get("os", "")),
            architecture=str(obj.get("architecture", "")),
            variant=str(obj.get("variant", "")),
        )

    def __str__(self) -> str:
        s = f"{self.os}/{self.architecture}"
        return f"{s}/{self.variant}" if self.variant else s


def host_platform() -> Platform:
    """The platform images are resolved to: this machine's, in GOARCH spelling."""
    machine = _platform.machine().lower()
    arch, variant = {
        "x86_64": ("amd64", ""),
        "amd64": ("amd64", ""),
        "aarch64": ("arm64", "v8"),
        "arm64": ("arm64", "v8"),
        "armv7l": ("arm", "v7"),
        "armv6l": ("arm", "v6"),
        "i386": ("386", ""),
        "i686": ("386", ""),
        "ppc64le": ("ppc64le", ""),
        "s390x": ("s390x", ""),
        "riscv64": ("riscv64", ""),
    }.get(machine, (machine, ""))
    return Platform(os="linux", architecture=arch, variant=variant)


@dataclass(frozen=True)
class Descriptor:
    media_type: str
    digest: str
    size: int
    platform: Platform | None = None
    annotations: dict[str, str] = field(default_factory=dict, hash=False, compare=False)

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> Descriptor:
        try:
            digest = validate_digest(str(obj["digest"]))
            size = int(obj["size"])
        except (KeyError, TypeError, ValueError) as e:
            raise DataLoss(f"malformed descriptor {obj!r}: {e}") from None
        if size < 0:
            raise DataLoss(f"malformed descriptor {obj!r}: negative size")
        plat = obj.get("platform")
        return cls(
            media_type=str(obj.get("mediaType", "")),
            digest=digest,
            size=size,
            platform=Platform.from_json(plat) if isinstance(plat, dict) else None,
            annotations={str(k): str(v) for k, v in (obj.get("annotations") or {}).items()},
        )
