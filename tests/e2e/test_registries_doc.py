"""docs/registries.md's mirror example works as written: its ``hosts.toml`` files, with the
private registry's address and CA swapped for a local test registry's, make a real daemon
pull docker.io and registry.k8s.io images from that registry."""

from __future__ import annotations

import re
import shutil
from collections.abc import Callable
from pathlib import Path

import grpc
import pytest

from tests.support.certs import TestPKI
from tests.support.daemon import running_daemon
from tests.support.images import TestImages, push
from tests.support.registry import LocalRegistry

pytestmark = pytest.mark.e2e

DOC = Path(__file__).resolve().parents[2] / "docs" / "registries.md"
BLOCK = re.compile(r"<!-- registries: (\S+) -->\n```toml\n(.*?)\n```", re.S)
#: What the example names, and what the test puts in its place.
ADDRESS = "registry.example.internal:5000"
CERTS = "/etc/pycrid/certs.d"
CA_FILE = f"{CERTS}/registry.example.internal.crt"


def example_files() -> dict[str, str]:
    """path -> content of every ``hosts.toml`` the page tells the reader to write."""
    return {path: body + "\n" for path, body in BLOCK.findall(DOC.read_text())}


def requests_to(reg: LocalRegistry) -> list[str]:
    """``METHOD /path`` of every request pycrid made to ``reg`` (its access log)."""
    text = reg.log_path.read_text(errors="replace")
    return [f"{m.group(1)} {m.group(2)}"
            for m in re.finditer(r'"(GET|HEAD) (\S+) HTTP/1\.1" .*"pycrid', text)]


def test_the_mirror_example_pulls_through_a_private_registry(
        tmp_path: Path, registry_factory: Callable[..., LocalRegistry], pki: TestPKI,
        test_images: TestImages) -> None:
    files = example_files()
    assert sorted(files) == [f"{CERTS}/docker.io/hosts.toml",
                             f"{CERTS}/registry.k8s.io/hosts.toml"]
    # The private registry of the example: HTTPS with its own CA, holding copies of the
    # public images under their own repository names (what the page's skopeo lines make).
    private = registry_factory(tls=True)
    busybox, pause = test_images.busybox_136.build, test_images.pause.build
    push(private, "library/busybox", "1.36", busybox)
    push(private, "pause", "3.10", pause)

    certs = tmp_path / "certs.d"
    for path, body in files.items():
        assert ADDRESS in body and CA_FILE in body, path
        target = Path(path.replace(CERTS, str(certs)))
        target.parent.mkdir(parents=True)
        target.write_text(body.replace(CERTS, str(certs)).replace(ADDRESS, private.host))
    shutil.copy(pki.ca_cert, CA_FILE.replace(CERTS, str(certs)))

    config = ('version = 2\n[plugins."pycrid.cri.v1.images".registry]\n'
              f'config_path = "{certs}"\n')
    with running_daemon(str(tmp_path / "d"), config) as d:
        for name, build in (("docker.io/library/busybox:1.36", busybox),
                            ("registry.k8s.io/pause:3.10", pause)):
            assert d.client.pull(name) == build.config_digest
            assert name in d.client.status(name).image.repo_tags  # the public name is kept
        seen = requests_to(private)
        # Resolved at the mirror (with containerd's ns= naming the upstream), as the page says.
        assert "HEAD /v2/library/busybox/manifests/1.36?ns=docker.io" in seen, seen
        assert "HEAD /v2/pause/manifests/3.10?ns=registry.k8s.io" in seen, seen

        # The page's "never the public registry" variation: with capabilities = [] at the
        # top, a failed pull names the mirror, not registry-1.docker.io.
        docker_io = certs / "docker.io" / "hosts.toml"
        docker_io.write_text("capabilities = []\n" + docker_io.read_text())
        with pytest.raises(grpc.RpcError) as e:
            d.client.pull("docker.io/library/not-mirrored:1")
        assert private.host in (e.value.details() or ""), e.value.details()
        assert "registry-1.docker.io" not in (e.value.details() or "")
