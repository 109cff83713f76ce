"""Parsing of image indexes, manifests and configs, and choosing this machine's platform.

Pure functions over bytes from a registry we do not trust: anything malformed is
``DataLoss`` with a message that says what was wrong, never a KeyError or TypeError
escaping from deep inside. Docker schema 1 manifests are refused outright
(``InvalidArgument``): registries have not served them for years and they carry no
content-addressed config.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from pycrid.errors import DataLoss, InvalidArgument, NotFound
from pycrid.images.mediatypes import (
    INDEX_TYPES,
    MANIFEST_TYPES,
    MT_OCI_INDEX,
    MT_OCI_MANIFEST,
    Descriptor,
    Platform,
)

MT_DOCKER_SCHEMA1 = "application/vnd.docker.distribution.manifest.v1+json"
MT_DOCKER_SCHEMA1_SIGNED = "application/vnd.docker.distribution.manifest.v1+prettyjws"
SCHEMA1_TYPES = frozenset({MT_DOCKER_SCHEMA1, MT_DOCKER_SCHEMA1_SIGNED})
_SCHEMA1_MSG = "Docker schema 1 manifests are not supported; push the image again with a " \
               "current tool (schema 2 or OCI)"


@dataclass(frozen=True)
class Manifest:
    config: Descriptor
    layers: list[Descriptor]
    media_type: str
    annotations: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class ImageConfig:
    diff_ids: list[str]
    user: str
    platform: Platform
    raw: dict[str, Any]


# ---- helpers -----------------------------------------------------------------------------


def _load(data: bytes, what: str) -> dict[str, Any]:
    if not isinstance(data, bytes | bytearray | memoryview):
        raise DataLoss(f"{what}: expected bytes, got {type(data).__name__}")
    try:
        doc = json.loads(bytes(data))
    except (ValueError, RecursionError) as e:
        raise DataLoss(f"{what} is not valid JSON: {_short(str(e))}") from None
    if not isinstance(doc, dict):
        raise DataLoss(f"{what} is not a JSON object but {_json_type(doc)}")
    return doc


def _short(s: str, n: int = 200) -> str:
    return s if len(s) <= n else s[:n] + "..."


def _json_type(v: Any) -> str:
    return {dict: "an object", list: "an array", str: "a string", bool: "a boolean",
            int: "a number", float: "a number", type(None): "null"}.get(type(v), type(v).__name__)


def _is_schema1(doc: dict[str, Any]) -> bool:
    v, mt = doc.get("schemaVersion"), doc.get("mediaType")
    return ((type(v) is int and v == 1) or (isinstance(mt, str) and mt in SCHEMA1_TYPES)
            or "fsLayers" in doc or ("signatures" in doc and "config" not in doc))


def _check_schema2(doc: dict[str, Any], what: str) -> None:
    if _is_schema1(doc):
        raise InvalidArgument(_SCHEMA1_MSG)
    v = doc.get("schemaVersion")
    if v != 2 or isinstance(v, bool):
        raise DataLoss(f"{what}: schemaVersion is {v!r}, want 2")


def _media_type(doc: dict[str, Any], what: str) -> str:
    mt = doc.get("mediaType", "")
    if not isinstance(mt, str):
        raise DataLoss(f"{what}: mediaType is {_json_type(mt)}, not a string")
    return mt


def _annotations(obj: dict[str, Any], what: str) -> dict[str, str]:
    ann = obj.get("annotations")
    if ann is None:
        return {}
    if not isinstance(ann, dict) or not all(isinstance(v, str) for v in ann.values()):
        raise DataLoss(f"{what}: annotations must be an object of strings")
    return {str(k): v for k, v in ann.items()}


def descriptor(obj: Any, what: str) -> Descriptor:
    """A descriptor from JSON, checked field by field (types as well as presence)."""
    if not isinstance(obj, dict):
        raise DataLoss(f"{what} is {_json_type(obj)}, not a descriptor object")
    mt, digest, size = obj.get("mediaType", ""), obj.get("digest"), obj.get("size")
    if not isinstance(mt, str):
        raise DataLoss(f"{what}: mediaType is {_json_type(mt)}, not a string")
    if not isinstance(digest, str):
        raise DataLoss(f"{what}: digest is missing or not a string")
    if not isinstance(size, int) or isinstance(size, bool) or size < 0:
        raise DataLoss(f"{what}: size is missing or not a non-negative integer")
    _annotations(obj, what)
    plat = obj.get("platform")
    if plat is not None and (not isinstance(plat, dict) or not all(
            isinstance(plat.get(k, ""), str) for k in ("os", "architecture", "variant"))):
        raise DataLoss(f"{what}: platform must be an object with string os/architecture/variant")
    try:
        return Descriptor.from_json(obj)
    except (DataLoss, InvalidArgument, ValueError, TypeError, AttributeError) as e:
        raise DataLoss(f"{what}: {_short(str(e))}") from None


# ---- public parsing ---------------------------------------------------------------------


def detect_media_type(data: bytes, header_type: str) -> str:
    """The media type of a manifest or index, for registries that send a generic one.

    A specific ``header_type`` is trusted unless the document names another type
    itself; a generic one (``application/json``, ``application/octet-stream``, none)
    is replaced by what the document's shape says.
    """
    base = header_type.split(";", 1)[0].strip().lower()
    known = INDEX_TYPES | MANIFEST_TYPES
    doc = _load(data, "manifest")
    declared = _media_type(doc, "manifest")
    if _is_schema1(doc) or base in SCHEMA1_TYPES:
        return MT_DOCKER_SCHEMA1
    if declared in known:
        if base in known and base != declared:
            raise DataLoss(f"manifest: the registry says it is {base} but it declares "
                           f"itself {declared}")
        return declared
    if declared:
        raise DataLoss(f"manifest: unsupported media type {_short(declared)!r}")
    if base in known:
        return base
    if "manifests" in doc:
        return MT_OCI_INDEX
    if "config" in doc or "layers" in doc:
        return MT_OCI_MANIFEST
    raise DataLoss("manifest: neither an index nor an image manifest (no 'manifests', "
                   "no 'config' and 'layers')")


def parse_index(data: bytes) -> list[Descriptor]:
    """The entries of an OCI index or Docker manifest list."""
    doc = _load(data, "image index")
    _check_schema2(doc, "image index")
    mt = _media_type(doc, "image index")
    if mt and mt not in INDEX_TYPES:
        raise DataLoss(f"image index: mediaType is {_short(mt)!r}, not an index")
    entries = doc.get("manifests")
    if not isinstance(entries, list):
        raise DataLoss("image index: 'manifests' is missing or not an array")
    return [descriptor(e, f"image index entry {i}") for i, e in enumerate(entries)]


def parse_manifest(data: bytes) -> Manifest:
    """An image manifest (OCI or Docker schema 2)."""
    doc = _load(data, "image manifest")
    _check_schema2(doc, "image manifest")
    mt = _media_type(doc, "image manifest")
    if mt in INDEX_TYPES or (not mt and "manifests" in doc and "config" not in doc):
        raise DataLoss("image manifest: got an index where an image manifest was expected")
    if mt and mt not in MANIFEST_TYPES:
        raise DataLoss(f"image manifest: unsupported mediaType {_short(mt)!r}")
    if "config" not in doc:
        raise DataLoss("image manifest: 'config' is missing")
    config = descriptor(doc["config"], "image manifest config")
    layers = doc.get("layers")
    if not isinstance(layers, list):
        raise DataLoss("image manifest: 'layers' is missing or not an array")
    return Manifest(
        config=config,
        layers=[descriptor(x, f"image manifest layer {i}") for i, x in enumerate(layers)],
        media_type=mt or MT_OCI_MANIFEST,
        annotations=_annotations(doc, "image manifest"),
    )


def parse_image_config(data: bytes) -> ImageConfig:
    """The parts of an image config the runtime needs; the whole document stays in ``raw``."""
    doc = _load(data, "image config")
    rootfs = doc.get("rootfs")
    if not isinstance(rootfs, dict):
        raise DataLoss("image config: 'rootfs' is missing or not an object")
    if rootfs.get("type") != "layers":
        raise DataLoss(f"image config: rootfs type is {rootfs.get('type')!r}, want 'layers'")
    diff_ids = rootfs.get("diff_ids")
    if not isinstance(diff_ids, list):
        raise DataLoss("image config: rootfs.diff_ids is missing or not an array")
    for i, d in enumerate(diff_ids):
        if not isinstance(d, str) or not _is_sha256(d):
            raise DataLoss(f"image config: diff_id {i} is not a sha256 digest")
    cfg = doc.get("config")
    if cfg is None:
        cfg = {}
    if not isinstance(cfg, dict):
        raise DataLoss("image config: 'config' is not an object")
    user = cfg.get("User")
    if user is None:
        user = ""
    if not isinstance(user, str):
        raise DataLoss("image config: config.User is not a string")
    for key in ("os", "architecture", "variant"):
        if not isinstance(doc.get(key, ""), str):
            raise DataLoss(f"image config: {key!r} is not a string")
    platform = normalize(Platform(os=doc.get("os", ""), architecture=doc.get("architecture", ""),
                                  variant=doc.get("variant", "")))
    return ImageConfig(diff_ids=list(diff_ids), user=user, platform=platform, raw=doc)


def _is_sha256(d: str) -> bool:
    return len(d) == 71 and d.startswith("sha256:") and all(
        c in "0123456789abcdef" for c in d[7:])


# ---- platforms ---------------------------------------------------------------------------


_ARCH_ALIASES = {
    "x86_64": "amd64", "x86-64": "amd64", "aarch64": "arm64", "armhf": "arm", "armel": "arm",
    "i386": "386", "i686": "386",
}
#: Variants of an architecture, oldest first; a machine runs its own and every older one.
_VARIANTS = {
    "arm": ["v5", "v6", "v7", "v8"],
    "arm64": ["v8", "v8.1", "v8.2", "v8.3", "v8.4", "v8.5", "v8.6", "v8.7", "v8.8", "v8.9",
              "v9", "v9.1", "v9.2", "v9.3", "v9.4", "v9.5"],
    "amd64": ["v1", "v2", "v3", "v4"],
}
_DEFAULT_VARIANT = {"arm": "v7", "arm64": "v8", "amd64": "v1"}


def normalize(p: Platform) -> Platform:
    """containerd's spelling: GOARCH names, arm64 ``""`` is ``v8``, ``7`` is ``v7`` and so on."""
    os_ = p.os.lower()
    if os_ == "macos":
        os_ = "darwin"
    raw_arch = p.architecture.lower()
    arch = _ARCH_ALIASES.get(raw_arch, raw_arch)
    variant = p.variant.lower()
    if raw_arch == "armhf" and not variant:
        variant = "v7"
    elif raw_arch == "armel" and not variant:
        variant = "v6"
    if arch in _VARIANTS:
        if variant and variant[0].isdigit():
            variant = "v" + variant
        if arch == "arm64" and variant == "8":
            variant = "v8"
        variant = variant or _DEFAULT_VARIANT[arch]
    return Platform(os=os_, architecture=arch, variant=variant)


def _rank(want: Platform, have: Platform) -> int | None:
    """0 for an exact match, n for the n-th older variant, None when ``have`` cannot run."""
    w, h = normalize(want), normalize(have)
    if w.os != h.os or w.architecture != h.architecture:
        return None
    if w.variant == h.variant:
        return 0
    order = _VARIANTS.get(w.architecture)
    if order is None or w.variant not in order or h.variant not in order:
        return None
    # Fall back only to older variants: an arm/v7 machine runs v6 and v5, not v8.
    distance = order.index(w.variant) - order.index(h.variant)
    return distance if distance > 0 else None


def platform_matches(want: Platform, have: Platform) -> bool:
    return _rank(want, have) is not None


def select_platform(manifests: list[Descriptor], want: Platform, ref: str = "") -> Descriptor:
    """The entry of an index this machine should run: exact platform first, then the
    closest older variant, index order breaking ties; NotFound when none fits.

    Entries without a platform are a last resort (containerd lets them match, then
    checks the config); entries that are not image manifests are never chosen.
    """
    best: tuple[int, int, Descriptor] | None = None
    unplatformed: Descriptor | None = None
    for i, d in enumerate(manifests):
        if d.media_type and d.media_type not in MANIFEST_TYPES:
            continue
        if d.platform is None:
            unplatformed = unplatformed or d
            continue
        r = _rank(want, d.platform)
        if r is not None and (best is None or (r, i) < best[:2]):
            best = (r, i, d)
    if best is not None:
        return best[2]
    if unplatformed is not None:
        return unplatformed
    have = sorted({str(d.platform) for d in manifests if d.platform is not None})
    where = f" of {ref}" if ref else ""
    listed = f" (it has: {', '.join(have)})" if have else ""
    raise NotFound(f"no manifest for {want} in index{where}{listed}")
