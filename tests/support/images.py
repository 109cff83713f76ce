"""Real, small images for the pull tests: built from layer tarballs, pushed over the real API.

Everything is computed here, not copied from a registry: layer digests over the
compressed bytes, diff_ids over the uncompressed tar, the config and manifest digests
over the exact bytes that are pushed. A test compares what pycrid stored against the
:class:`ImageBuild` it was fed.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from tests.support.layers import Entry, compress, tar_bytes
from tests.support.registry import Creds, LocalRegistry, RegistryError

Platform = tuple[str, ...]  # ("linux", "amd64") or ("linux", "arm64", "v8")

OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
OCI_CONFIG = "application/vnd.oci.image.config.v1+json"
DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
DOCKER_LIST = "application/vnd.docker.distribution.manifest.list.v2+json"
DOCKER_CONFIG = "application/vnd.docker.container.image.v1+json"

_LAYER_TYPES = {
    ("oci", "none"): "application/vnd.oci.image.layer.v1.tar",
    ("oci", "gzip"): "application/vnd.oci.image.layer.v1.tar+gzip",
    ("oci", "zstd"): "application/vnd.oci.image.layer.v1.tar+zstd",
    ("docker", "none"): "application/vnd.docker.image.rootfs.diff.tar",
    ("docker", "gzip"): "application/vnd.docker.image.rootfs.diff.tar.gzip",
}


def digest_of(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _json(obj: Any) -> bytes:
    # Stable bytes: the digest of a build never changes between runs.
    return json.dumps(obj, indent=2, sort_keys=True).encode()


_COMPRESSED: dict[tuple[str, str], bytes] = {}


def _compressed(tar: bytes, compression: str) -> bytes:
    # The standard set reuses the busybox layer in five images; gzip -9 of it is ~0.2 s.
    if len(tar) > 16 << 20:
        return compress(tar, compression)  # big layers are built once; do not pin them
    key = (digest_of(tar), compression)
    if key not in _COMPRESSED:
        _COMPRESSED[key] = compress(tar, compression)
    return _COMPRESSED[key]


@dataclass(frozen=True)
class ImageBuild:
    """One manifest (or index) with everything needed to push it.

    ``blobs`` maps digest to bytes for the config and layers; an index has no blobs of
    its own and lists its manifests in ``children`` (pushed first, by digest).
    """

    manifest: bytes
    manifest_digest: str
    media_type: str
    config: bytes
    blobs: dict[str, bytes]
    layer_digests: tuple[str, ...] = ()
    diff_ids: tuple[str, ...] = ()
    platform: Platform | None = None
    children: tuple[ImageBuild, ...] = ()

    @property
    def config_digest(self) -> str:
        return digest_of(self.config) if self.config else ""

    @property
    def config_json(self) -> dict[str, Any]:
        return dict(json.loads(self.config)) if self.config else {}

    @property
    def is_index(self) -> bool:
        return self.media_type in (OCI_INDEX, DOCKER_LIST)


def _descriptor(media_type: str, data: bytes, **extra: Any) -> dict[str, Any]:
    return {"mediaType": media_type, "digest": digest_of(data), "size": len(data), **extra}


def build_image(
    layer_tars: list[bytes],
    *,
    compression: str = "gzip",
    media: str = "oci",
    config: dict[str, Any] | None = None,
    platform: Platform = ("linux", "amd64"),
    annotations: dict[str, str] | None = None,
) -> ImageBuild:
    """An image from uncompressed layer tars, bottom first.

    ``config`` is the runtime part of the image config (``Env``, ``Cmd``, ``Entrypoint``,
    ``User``, ``WorkingDir``, ``Labels``...); ``media`` is "oci" or "docker" (schema 2,
    which has no zstd).
    """
    layer_type = _LAYER_TYPES.get((media, compression))
    if layer_type is None:
        raise ValueError(f"no {compression!r} layers in {media!r} images")
    blobs: dict[str, bytes] = {}
    layers, diff_ids = [], []
    for tar in layer_tars:
        blob = _compressed(tar, compression)
        blobs[digest_of(blob)] = blob
        layers.append(_descriptor(layer_type, blob))
        diff_ids.append(digest_of(tar))
    image_config: dict[str, Any] = {
        "created": "2024-01-01T00:00:00Z",
        "os": platform[0],
        "architecture": platform[1],
        "config": dict(config or {}),
        "rootfs": {"type": "layers", "diff_ids": diff_ids},
        "history": [{"created": "2024-01-01T00:00:00Z", "created_by": f"pycrid test layer {i}"}
                    for i in range(len(layer_tars))],
    }
    if len(platform) > 2:
        image_config["variant"] = platform[2]
    config_bytes = _json(image_config)
    blobs[digest_of(config_bytes)] = config_bytes
    manifest_type = OCI_MANIFEST if media == "oci" else DOCKER_MANIFEST
    manifest: dict[str, Any] = {
        "schemaVersion": 2,
        "mediaType": manifest_type,
        "config": _descriptor(OCI_CONFIG if media == "oci" else DOCKER_CONFIG, config_bytes),
        "layers": layers,
    }
    if annotations:
        manifest["annotations"] = annotations
    manifest_bytes = _json(manifest)
    return ImageBuild(
        manifest=manifest_bytes, manifest_digest=digest_of(manifest_bytes),
        media_type=manifest_type, config=config_bytes, blobs=blobs,
        layer_digests=tuple(d["digest"] for d in layers), diff_ids=tuple(diff_ids),
        platform=tuple(platform),
    )


def build_index(images: list[tuple[ImageBuild, Platform]], media: str = "oci") -> ImageBuild:
    """An OCI index or Docker manifest list over already-built images."""
    index_type = OCI_INDEX if media == "oci" else DOCKER_LIST
    manifests = []
    for image, plat in images:
        p: dict[str, str] = {"os": plat[0], "architecture": plat[1]}
        if len(plat) > 2:
            p["variant"] = plat[2]
        manifests.append(_descriptor(image.media_type, image.manifest, platform=p))
    index = _json({"schemaVersion": 2, "mediaType": index_type, "manifests": manifests})
    return ImageBuild(
        manifest=index, manifest_digest=digest_of(index), media_type=index_type,
        config=b"", blobs={}, children=tuple(image for image, _ in images),
    )


# ---------------------------------------------------------------------------
# Root filesystems


PASSWD = (
    b"root:x:0:0:root:/root:/bin/sh\n"
    b"app:x:1000:1000:app:/home/app:/bin/sh\n"
    b"nobody:x:65534:65534:nobody:/nonexistent:/bin/false\n"
)
GROUP = b"root:x:0:\napp:x:1000:\nnogroup:x:65534:\n"
APPLETS = ("sh", "ls", "cat", "echo", "sleep", "true", "false", "id", "env", "mkdir", "ps",
           "touch", "rm", "test", "wc", "head", "grep", "stat", "readlink", "kill")


@functools.cache
def _host_busybox() -> bytes:
    return Path(shutil.which("busybox") or "/bin/busybox").read_bytes()


def busybox_rootfs_entries() -> list[Entry]:
    """The entries of :func:`busybox_rootfs_tar`, for tests that build on them."""
    entries = [
        Entry("bin", "dir"), Entry("etc", "dir"), Entry("root", "dir", mode=0o700),
        Entry("home", "dir"), Entry("home/app", "dir", uid=1000, gid=1000),
        Entry("tmp", "dir", mode=0o1777), Entry("proc", "dir"), Entry("sys", "dir"),
        Entry("dev", "dir"), Entry("var", "dir"), Entry("var/tmp", "dir", mode=0o1777),
        Entry("bin/busybox", data=_host_busybox(), mode=0o755),
    ]
    entries += [Entry(f"bin/{a}", "symlink", linkname="busybox") for a in APPLETS]
    entries += [Entry("etc/passwd", data=PASSWD), Entry("etc/group", data=GROUP)]
    return entries


@functools.cache
def _busybox_tar_base() -> bytes:
    return tar_bytes(busybox_rootfs_entries())


def busybox_rootfs_tar(extra: list[Entry] | None = None) -> bytes:
    """A minimal runnable rootfs: the host's static busybox, applet links, passwd/group
    (root, app uid 1000, nobody), /tmp 1777; ``extra`` entries are appended."""
    if not extra:
        return _busybox_tar_base()
    return tar_bytes(busybox_rootfs_entries() + list(extra))


PAUSE_C = r"""
#include <signal.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static void bye(int sig) { (void)sig; _exit(0); }
static void reap(int sig) { (void)sig; while (waitpid(-1, 0, WNOHANG) > 0) {} }

int main(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = bye;
    sigaction(SIGINT, &sa, 0);
    sigaction(SIGTERM, &sa, 0);
    sa.sa_handler = reap;
    sa.sa_flags = SA_NOCLDSTOP | SA_RESTART;
    sigaction(SIGCHLD, &sa, 0);
    for (;;) pause();
}
"""


def _cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "pycrid-tests"


@functools.cache
def pause_binary() -> bytes | None:
    """A static pause program compiled with ``gcc -static -Os``, cached by source hash.

    None when gcc or a static libc is missing; :func:`pause_image` then falls back to
    busybox running ``sleep infinity`` (which also dies on SIGTERM, but does not reap).
    """
    cache = _cache_dir() / f"pause-{hashlib.sha256(PAUSE_C.encode()).hexdigest()[:16]}"
    if cache.exists():
        return cache.read_bytes()
    gcc = shutil.which("gcc")
    if gcc is None:
        return None
    cache.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        src, out = Path(tmp) / "pause.c", Path(tmp) / "pause"
        src.write_text(PAUSE_C)
        proc = subprocess.run([gcc, "-static", "-Os", "-s", "-o", str(out), str(src)],
                              capture_output=True, timeout=120, check=False)
        if proc.returncode != 0:
            return None
        data = out.read_bytes()
        # Publish atomically: parallel sessions may race to fill the cache.
        tmp_cache = cache.with_suffix(f".{os.getpid()}")
        tmp_cache.write_bytes(data)
        tmp_cache.chmod(0o755)
        tmp_cache.replace(cache)
    return data


def pause_tar() -> bytes:
    """The pause image's one layer: ``/pause`` (or busybox rootfs if gcc cannot link statically)."""
    binary = pause_binary()
    if binary is None:
        return busybox_rootfs_tar()
    return tar_bytes([Entry("pause", data=binary, mode=0o755), Entry("etc", "dir"),
                      Entry("etc/passwd", data=PASSWD), Entry("etc/group", data=GROUP)])


def pause_image(compression: str = "gzip") -> ImageBuild:
    """The pause image: ``Entrypoint ["/pause"]``, user 65535 like the upstream one."""
    if pause_binary() is None:
        cfg: dict[str, Any] = {"Cmd": ["sleep", "infinity"]}
    else:
        cfg = {"Entrypoint": ["/pause"], "User": "65535:65535"}
    return build_image([pause_tar()], compression=compression, config=cfg)


def big_layer(size_mb: int, *, name: str = "big.bin", seed: int | None = None) -> bytes:
    """An uncompressed layer tar with one ``size_mb`` MiB file of random bytes.

    Random data does not compress, so the blob is as large as asked with any
    compression; gzip on it still costs time (~1 s per 50 MiB), so prefer
    ``compression="none"`` when only the transfer matters. ``seed`` makes it repeatable.
    """
    size = size_mb * 1024 * 1024
    if seed is None:
        data = os.urandom(size)
    else:
        # A counter-mode stream from sha256: deterministic and fast enough for tens of MiB.
        chunks, counter, have = [], 0, 0
        key = seed.to_bytes(8, "little")
        while have < size:
            block = hashlib.sha512(key + counter.to_bytes(8, "little")).digest()
            chunks.append(block)
            have += len(block)
            counter += 1
        data = b"".join(chunks)[:size]
    return tar_bytes([Entry(name, data=data)])


# ---------------------------------------------------------------------------
# Pushing


def push(registry: LocalRegistry, repo: str, ref: str, build: ImageBuild,
         creds: Creds | None = None) -> str:
    """Push ``build`` as ``repo:ref`` (ref may be a tag or its digest); return its digest.

    Blobs already in the repository (HEAD 200) are skipped; the rest go up as one
    POST then one PUT with the whole body. An index pushes its children by digest
    first. ``creds`` defaults to the registry's first user.
    """
    client = registry.client(creds)
    return _push(client, repo, ref, build)


def _push(client: Any, repo: str, ref: str, build: ImageBuild) -> str:
    for child in build.children:
        _push(client, repo, child.manifest_digest, child)
    for digest, blob in build.blobs.items():
        head = client.request("HEAD", f"/v2/{repo}/blobs/{digest}")
        if head.status == 200:
            continue
        start = client.request("POST", f"/v2/{repo}/blobs/uploads/")
        if start.status != 202:
            raise RegistryError(f"upload start for {repo}: {start.status} {start.body!r}")
        loc = _path_of(start.headers["location"])
        sep = "&" if "?" in loc else "?"
        put = client.request("PUT", f"{loc}{sep}digest={digest}", body=blob,
                             headers={"Content-Type": "application/octet-stream"})
        if put.status != 201:
            raise RegistryError(f"upload of {digest} to {repo}: {put.status} {put.body!r}")
    resp = client.request("PUT", f"/v2/{repo}/manifests/{ref}", body=build.manifest,
                          headers={"Content-Type": build.media_type})
    if resp.status != 201:
        raise RegistryError(f"manifest {repo}:{ref}: {resp.status} {resp.body!r}")
    got = resp.headers.get("docker-content-digest")
    if got != build.manifest_digest:
        raise RegistryError(f"registry says {got}, we computed {build.manifest_digest}")
    return build.manifest_digest


def _path_of(location: str) -> str:
    # 2.8 answers an absolute URL; the spec also allows a relative one.
    u = urlsplit(location)
    return u.path + (f"?{u.query}" if u.query else "")


# ---------------------------------------------------------------------------
# The standard set every registry fixture is loaded with


@dataclass(frozen=True)
class PushedImage:
    """One image of the standard set: where it is and what it should be."""

    repo: str
    tag: str
    digest: str
    build: ImageBuild

    @property
    def name(self) -> str:
        return f"{self.repo}:{self.tag}"

    def ref(self, registry: LocalRegistry) -> str:
        """``127.0.0.1:PORT/repo:tag``."""
        return f"{registry.host}/{self.repo}:{self.tag}"

    def digest_ref(self, registry: LocalRegistry) -> str:
        """``127.0.0.1:PORT/repo@sha256:...``."""
        return f"{registry.host}/{self.repo}@{self.digest}"


# What a correct unpack of ``layered:latest`` yields: path -> file content, "->target" for a
# symlink, or None for a path that must not exist.
LAYERED_EXPECTED: dict[str, bytes | str | None] = {
    "data/a.txt": None,              # whited out in layer 2
    "data/b.txt": b"b from layer 2\n",
    "data/c.txt": b"c from layer 2\n",
    "opt/dir/old.txt": None,         # hidden by the opaque dir in layer 3
    "opt/dir/sub/deep.txt": None,
    "opt/dir/new.txt": b"new from layer 3\n",
    "opt/keep.txt": b"keep\n",
    "lib": "->usr/lib",              # symlinked dir from layer 1, written through later
    "usr/lib/one.so": b"one\n",
    "usr/lib/two.so": b"two\n",
    "usr/lib/three.so": b"three\n",
}


def layered_layers() -> list[bytes]:
    """Three layers: a whiteout of a layer-1 file, an opaque dir, writes through ``lib``.

    ``lib -> usr/lib`` is a symlinked directory from layer 1 that layers 2 and 3 write into,
    as images with a merged /usr do. :data:`LAYERED_EXPECTED` is the correct result.
    """
    one = busybox_rootfs_tar([
        Entry("data", "dir"), Entry("data/a.txt", data=b"a from layer 1\n"),
        Entry("data/b.txt", data=b"b from layer 1\n"),
        Entry("opt", "dir"), Entry("opt/keep.txt", data=b"keep\n"),
        Entry("opt/dir", "dir"), Entry("opt/dir/old.txt", data=b"old\n"),
        Entry("opt/dir/sub", "dir"), Entry("opt/dir/sub/deep.txt", data=b"deep\n"),
        Entry("usr", "dir"), Entry("usr/lib", "dir"), Entry("usr/lib/one.so", data=b"one\n"),
        Entry("lib", "symlink", linkname="usr/lib"),
    ])
    two = tar_bytes([
        Entry("data", "dir"), Entry("data/.wh.a.txt"),
        Entry("data/b.txt", data=b"b from layer 2\n"),
        Entry("data/c.txt", data=b"c from layer 2\n"),
        Entry("lib/two.so", data=b"two\n"),
    ])
    three = tar_bytes([
        Entry("opt/dir", "dir"), Entry("opt/dir/.wh..wh..opq"),
        Entry("opt/dir/new.txt", data=b"new from layer 3\n"),
        Entry("lib/three.so", data=b"three\n"),
    ])
    return [one, two, three]


MULTI_PLATFORMS: tuple[Platform, ...] = (("linux", "amd64"), ("linux", "arm64", "v8"),
                                         ("linux", "arm", "v7"))


def _platform_str(p: Platform) -> str:
    return "/".join(p)


@dataclass(frozen=True)
class TestImages:
    """The standard set pushed into every registry fixture, with their digests.

    Digests are the same in every registry: the builds are made once per session.
    ``multi_children`` maps "linux/arm64/v8" style strings to the child digests; each
    child has ``/etc/platform`` and ``Env PLATFORM=...`` naming its platform.
    """

    __test__ = False  # not a pytest test class, despite the name

    busybox: PushedImage
    busybox_136: PushedImage
    docker_busybox: PushedImage
    multi: PushedImage
    layered: PushedImage
    pause: PushedImage
    zstd: PushedImage
    multi_children: dict[str, str] = field(default_factory=dict)

    def all(self) -> list[PushedImage]:
        return [self.busybox, self.busybox_136, self.docker_busybox, self.multi,
                self.layered, self.pause, self.zstd]


def _standard_builds() -> list[tuple[str, str, ImageBuild]]:
    # Module-level cache below: gzip of busybox is the slow part (~0.1 s).
    base = busybox_rootfs_tar()
    shell = {"Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],
             "Cmd": ["sh"]}
    busybox = build_image([base], config={**shell, "Labels": {"version": "latest"}})
    busybox_136 = build_image([base], config={**shell, "Labels": {"version": "1.36"}})
    docker_busybox = build_image([base], media="docker", config=shell)
    children = []
    for plat in MULTI_PLATFORMS:
        name = _platform_str(plat)
        marker = tar_bytes([Entry("etc", "dir"), Entry("etc/platform", data=f"{name}\n".encode())])
        # Only the amd64 child can run here; the others carry the marker alone.
        layers = [base, marker] if plat[1] == "amd64" else [marker]
        children.append((build_image(layers, platform=plat,
                                     config={**shell, "Env": [*shell["Env"], f"PLATFORM={name}"]}),
                         plat))
    multi = build_index(children)
    layered = build_image(layered_layers(), config={**shell, "WorkingDir": "/data",
                                                    "User": "1000:1000"})
    zstd = build_image([base, tar_bytes([Entry("zstd.txt", data=b"zstd layer\n")])],
                       compression="zstd", config=shell)
    return [
        ("busybox", "latest", busybox), ("busybox", "1.36", busybox_136),
        ("docker/busybox", "latest", docker_busybox), ("multi", "latest", multi),
        ("layered", "latest", layered), ("pause", "3.10", pause_image()), ("zstd", "latest", zstd),
    ]


@functools.cache
def standard_builds() -> tuple[tuple[str, str, ImageBuild], ...]:
    """(repo, tag, build) of the standard set, built once per process."""
    return tuple(_standard_builds())


def standard_images() -> TestImages:
    """The :class:`TestImages` description of the standard set (no pushing)."""
    by_name = {f"{repo}:{tag}": PushedImage(repo, tag, b.manifest_digest, b)
               for repo, tag, b in standard_builds()}
    multi = by_name["multi:latest"]
    return TestImages(
        busybox=by_name["busybox:latest"], busybox_136=by_name["busybox:1.36"],
        docker_busybox=by_name["docker/busybox:latest"], multi=multi,
        layered=by_name["layered:latest"], pause=by_name["pause:3.10"],
        zstd=by_name["zstd:latest"],
        multi_children={_platform_str(c.platform or ()): c.manifest_digest
                        for c in multi.build.children},
    )


def load_standard_set(registry: LocalRegistry, creds: Creds | None = None) -> TestImages:
    """Push the standard set into ``registry``; return what was pushed."""
    images = standard_images()
    client = registry.client(creds)
    for img in images.all():
        _push(client, img.repo, img.tag, img.build)
    return images
