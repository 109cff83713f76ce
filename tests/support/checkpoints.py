"""Checkpoint tests' helpers: a counter container's count, an archive's members, and an
archive made into a checkpoint image (what ``checkpointctl build`` makes with buildah)
pushed to a test registry."""

from __future__ import annotations

import json
import tarfile
from pathlib import Path

from tests.support.images import build_image, push
from tests.support.pods import Pods, wait_for
from tests.support.registry import LocalRegistry


def count(pods: Pods, cid: str) -> int:
    """A counter container's last count, from its /tmp/count (empty for the instant between the
    shell's truncation and its write: read again then)."""
    def read() -> int:
        r = pods.exec(cid, ["cat", "/tmp/count"], timeout=10)
        return int(r.stdout) if r.exit_code == 0 and r.stdout.strip() else 0
    return int(wait_for(read, 10, f"a count from {cid}"))


def member_names(archive: Path) -> set[str]:
    with tarfile.open(archive) as tf:
        return {m.name.rstrip("/") for m in tf.getmembers()}


def member(archive: Path, name: str) -> bytes:
    with tarfile.open(archive) as tf:
        f = tf.extractfile(name)
        assert f is not None, f"{archive} has no {name}"
        return f.read()


def checkpoint_image(registry: LocalRegistry, archive: Path, repo: str) -> str:
    """The archive as a one-layer OCI image with checkpointctl's annotations (what
    ``checkpointctl build`` makes with buildah), pushed; its reference."""
    config = json.loads(member(archive, "config.dump"))
    spec = json.loads(member(archive, "spec.dump"))
    build = build_image([archive.read_bytes()], annotations={
        "org.criu.checkpoint.engine.name": "containerd",
        "org.criu.checkpoint.container.name":
            spec["annotations"]["io.kubernetes.cri.container-name"],
        "org.criu.checkpoint.rootfsImageName": config["rootfsImageName"],
        "org.criu.checkpoint.rootfsImageID": config["rootfsImageRef"]})
    push(registry, repo, "1", build)
    return f"{registry.host}/{repo}:1"
