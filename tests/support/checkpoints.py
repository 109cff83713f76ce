"""Checkpoint archives in tests: reading a member, and an archive made into a checkpoint
image (what ``checkpointctl build`` makes with buildah) pushed to a test registry."""

from __future__ import annotations

import json
import tarfile
from pathlib import Path

from tests.support.images import build_image, push
from tests.support.registry import LocalRegistry


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
