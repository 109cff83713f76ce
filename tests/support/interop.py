"""The real Go clients beside the checkout (``../shared/interop``): where they are, and
critest's images served from a local registry.

A user's checkout has no such folder; tests that need it call :func:`require` and skip
with the reason. ``PYCRID_INTEROP`` may name another folder of the same layout.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.images import _path_of
from tests.support.registry import LocalRegistry, RegistryClient, RegistryError

REPO = Path(__file__).resolve().parents[2]
ROOT = Path(os.environ.get("PYCRID_INTEROP") or REPO.parent / "shared" / "interop")

#: Registry hosts critest pulls from by their public names; each gets a mirror to the
#: local registry (the host is dropped from the repository path).
CRITEST_HOSTS = ("registry.k8s.io", "gcr.io", "docker.io", "public.ecr.aws", "k8s.gcr.io")


def binary(name: str) -> Path | None:
    """``bin/<name>`` of the interop folder, if it is there and executable."""
    path = ROOT / "bin" / name
    return path if path.is_file() and os.access(path, os.X_OK) else None


def require(name: str) -> Path:
    """The binary, or skip the test saying why."""
    path = binary(name)
    if path is None:
        pytest.skip(f"{ROOT / 'bin' / name} is not here (the real Go clients live in "
                    "../shared/interop beside the checkout; a user's checkout has none)")
    return path


def crictl(address: str, tmp: Path, timeout: int = 30) -> list[str]:
    """The real crictl's argv, pointed at the daemon at ``address`` by a config file of its
    own in ``tmp`` (no host /etc/crictl.yaml, and no warning about a missing one); skips
    when it is absent."""
    binary = require("crictl")
    config = tmp / "crictl.yaml"
    config.write_text(f"runtime-endpoint: unix://{address}\n"
                      f"image-endpoint: unix://{address}\ntimeout: {timeout}\n")
    return [str(binary), "--config", str(config)]


@dataclass(frozen=True)
class LayoutImage:
    """One manifest of the OCI layout and the repository:tag names it is pushed under."""

    digest: str
    media_type: str
    names: tuple[str, ...]


def _blob(layout: Path, digest: str) -> bytes:
    algo, _, hexpart = digest.partition(":")
    return (layout / "blobs" / algo / hexpart).read_bytes()


def layout_images(images_dir: Path | None = None) -> list[LayoutImage]:
    """``refs.txt`` (``repo:tag digest (ref name)``) joined with ``oci/index.json``."""
    images_dir = images_dir or ROOT / "images"
    index = json.loads((images_dir / "oci" / "index.json").read_text())
    media = {m["digest"]: m["mediaType"] for m in index["manifests"]}
    names: dict[str, list[str]] = {}
    for line in (images_dir / "refs.txt").read_text().splitlines():
        parts = line.split()
        if len(parts) >= 2:
            names.setdefault(parts[1], []).append(parts[0])
    return [LayoutImage(d, media[d], tuple(n)) for d, n in names.items()]


def push_layout(registry: LocalRegistry, images_dir: Path | None = None) -> int:
    """Push every image of the interop OCI layout under each name ``refs.txt`` gives it;
    returns how many names were pushed."""
    layout = (images_dir or ROOT / "images") / "oci"
    client = registry.client()
    pushed = 0
    for image in layout_images(images_dir):
        manifest = _blob(layout, image.digest)
        doc = json.loads(manifest)
        blobs = [doc["config"]["digest"], *(layer["digest"] for layer in doc["layers"])]
        for name in image.names:
            repo, _, tag = name.rpartition(":")
            for digest in blobs:
                _upload(client, layout, repo, digest)
            resp = client.request("PUT", f"/v2/{repo}/manifests/{tag}", body=manifest,
                                  headers={"Content-Type": image.media_type})
            if resp.status != 201:
                raise RegistryError(f"manifest {name}: {resp.status} {resp.body!r}")
            pushed += 1
    return pushed


def push_as(registry: LocalRegistry, name: str, as_name: str) -> str:
    """Push the layout's image ``name`` (a repository:tag of refs.txt) as ``as_name`` (one
    that cannot clash with the suite's own images); its reference in ``registry``."""
    layout = ROOT / "images" / "oci"
    image = next(i for i in layout_images() if name in i.names)
    manifest = _blob(layout, image.digest)
    doc = json.loads(manifest)
    repo, _, tag = as_name.rpartition(":")
    client = registry.client()
    for digest in [doc["config"]["digest"], *(layer["digest"] for layer in doc["layers"])]:
        _upload(client, layout, repo, digest)
    resp = client.request("PUT", f"/v2/{repo}/manifests/{tag}", body=manifest,
                          headers={"Content-Type": image.media_type})
    if resp.status != 201:
        raise RegistryError(f"manifest {as_name}: {resp.status} {resp.body!r}")
    return f"{registry.host}/{as_name}"


def _upload(client: RegistryClient, layout: Path, repo: str, digest: str) -> None:
    if client.request("HEAD", f"/v2/{repo}/blobs/{digest}").status == 200:
        return
    start = client.request("POST", f"/v2/{repo}/blobs/uploads/")
    if start.status != 202:
        raise RegistryError(f"upload start for {repo}: {start.status} {start.body!r}")
    path = _path_of(start.headers["location"])
    sep = "&" if "?" in path else "?"
    put = client.request("PUT", f"{path}{sep}digest={digest}", body=_blob(layout, digest),
                         headers={"Content-Type": "application/octet-stream"})
    if put.status != 201:
        raise RegistryError(f"upload of {digest} to {repo}: {put.status} {put.body!r}")


def write_mirrors(registry: LocalRegistry, certs_dir: str | os.PathLike[str],
                  hosts: tuple[str, ...] = CRITEST_HOSTS) -> str:
    """A containerd ``hosts.toml`` for each public host, pulling from ``registry``; also
    the registry's own entry. Returns the directory for ``registry.config_path``."""
    registry.hosts_dir(certs_dir)
    for host in hosts:
        d = Path(certs_dir) / host
        d.mkdir(parents=True, exist_ok=True)
        (d / "hosts.toml").write_text(
            f'server = "https://{host}"\n\n'
            f'[host."{registry.url}"]\n'
            '  capabilities = ["pull", "resolve"]\n')
    return str(certs_dir)


def idmap_runc() -> Path:
    """The interop runc, if it makes idmapped mounts (``runc features``: the user
    namespace and ``mountExtensions.idmap``), which user-namespace pods need; or skip,
    saying why (Debian's runc 1.1 has none)."""
    import subprocess

    runc = require("runc")
    features = json.loads(subprocess.run([str(runc), "features"], capture_output=True,
                                         check=True, timeout=30).stdout)
    linux = features.get("linux") or {}
    idmap = ((linux.get("mountExtensions") or {}).get("idmap") or {}).get("enabled")
    if idmap is not True or "user" not in (linux.get("namespaces") or []):
        pytest.skip(f"runc lacks idmapped mounts ({runc} features: {linux.get('mountExtensions')})")
    return runc
