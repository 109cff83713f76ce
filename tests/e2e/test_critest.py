"""critest, the cri-tools validation suite (the real Go binary), against pycrid.

The images critest pulls by their public names (registry.k8s.io, gcr.io, docker.io,
public.ecr.aws, k8s.gcr.io) come from the suite's local registry through a containerd
``hosts.toml`` mirror for each host; the daemon is a usual test daemon whose sandbox image
is critest's pause, pulled through the same mirror. Every spec runs, the NRI suite
included (``--nri-socket``). A failure, or a skip for a reason not listed here, fails the
test with each spec's message.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from cri_api.v1 import api_pb2 as pb

from tests.support import interop
from tests.support.daemon import mapped_root_state, nri_paths, running_daemon
from tests.support.pods import Pods, leftovers
from tests.support.registry import LocalRegistry, local_registry

pytestmark = pytest.mark.e2e

#: Specs that cannot pass here, with the reason. Nothing else may fail.
TOLERATED_FAILURES = {
    "public image with digest should be pulled and removed [Conformance]":
        "pulls gcr.io/k8s-staging-cri-tools/test-image-digest@sha256:9700f9a2..., a digest "
        "no local build can reproduce, and this machine cannot reach gcr.io",
}
#: Why critest may skip a spec here (its own messages, matched as prefixes).
ALLOWED_SKIPS = {
    "AppArmor is disabled on this host": "no AppArmor in this kernel",
    "no runtime handler found which supports user namespaces":
        "runc 1.1.5 has no idmapped mounts, so pycrid offers no user-namespace handler",
    "": "benchmark specs run only with critest -benchmark",
}


def _outcomes(report: Path) -> list[dict[str, str]]:
    out = []
    for suite in json.loads(report.read_text()):
        for spec in suite.get("SpecReports") or []:
            if spec.get("LeafNodeType") != "It":
                continue
            out.append({
                "state": spec["State"],
                "name": " ".join([*(spec.get("ContainerHierarchyTexts") or []),
                                  spec["LeafNodeText"]]),
                "leaf": spec["LeafNodeText"],
                "message": (spec.get("Failure") or {}).get("Message", "").strip(),
            })
    return out


@pytest.fixture
def registry(tmp_path: Path) -> Iterator[LocalRegistry]:
    """A registry of its own: critest's images reuse names (busybox:latest, pause:3.10)
    that the suite's shared registry holds other images under."""
    with local_registry(tmp_path / "registry") as reg:
        yield reg


@pytest.mark.timeout(1200)
def test_critest(tmp_path: Path, registry: LocalRegistry) -> None:
    critest = interop.require("critest")
    interop.push_layout(registry)
    base = tmp_path / "d"
    certs = interop.write_mirrors(registry, tmp_path / "certs.d")
    config = ('version = 2\n[plugins."pycrid.cri.v1.images"]\n'
              'sandbox_image = "registry.k8s.io/pause:3.10"\n'
              '[plugins."pycrid.cri.v1.images".registry]\n'
              f'config_path = "{certs}"\n')
    images = tmp_path / "images.yaml"
    images.write_text(
        f"defaultTestContainerImage: {registry.host}/e2e-test-images/busybox:1.29-2\n"
        f"webServerTestImage: {registry.host}/e2e-test-images/nginx:1.14-2\n")
    report = tmp_path / "report.json"
    with running_daemon(str(base), config) as d:
        endpoint = f"unix://{d.address}"
        run = subprocess.run(
            [str(critest), f"--runtime-endpoint={endpoint}", f"--image-endpoint={endpoint}",
             f"--test-images-file={images}", f"--nri-socket={nri_paths(str(base))['socket_path']}",
             "--ginkgo.no-color", f"--ginkgo.json-report={report}"],
            cwd=tmp_path, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, timeout=1100, check=False)
        (tmp_path / "critest.out").write_bytes(run.stdout)
        # A failed spec may skip its own cleanup: what it left is removed here, and then
        # nothing of any pod may remain.
        stray = [p.id for p in d.client.runtime.ListPodSandbox(
            pb.ListPodSandboxRequest(), timeout=30).items]
        pods = Pods(d.client)
        if stray:
            print(f"critest left {len(stray)} pods; removing them")
        for sid in stray:
            pods.remove_pod(sid)
        left = leftovers(d.root, d.state)
    assert report.exists(), run.stdout.decode(errors="replace")[-4000:]
    specs = _outcomes(report)
    counts: dict[str, int] = {}
    for s in specs:
        counts[s["state"]] = counts.get(s["state"], 0) + 1
    print(f"critest: {counts}")
    for s in specs:
        if s["state"] != "passed":
            print(f"  {s['state']}: {s['name']}: {s['message'][:200]}")
    failed = [s for s in specs if s["state"] not in ("passed", "skipped")
              and s["leaf"] not in TOLERATED_FAILURES]
    odd_skips = [s for s in specs if s["state"] == "skipped" and not any(
        s["message"].startswith(reason) if reason else not s["message"]
        for reason in ALLOWED_SKIPS)]
    problems = [f"{s['state']}: {s['name']}\n    {s['message'][:1500]}"
                for s in failed + odd_skips]
    assert not problems, (f"critest {counts} (log: {tmp_path / 'critest.out'}, daemon log: "
                          f"{os.path.join(base, 'pycrid.log')}):\n" + "\n".join(problems))
    assert counts.get("passed", 0) > 0
    assert left == [], left


#: critest's user-namespace specs (its "UserNamespaces" context): six, one of which runs a
#: pod in a user namespace and reads its uid_map.
USERNS_SPECS = 6


@pytest.mark.timeout(900)
def test_critest_user_namespaces(tmp_path: Path, registry: LocalRegistry) -> None:
    """critest's UserNamespaces specs with a runc that makes idmapped mounts (runc 1.2+;
    the interop one is 1.5.1): every one passes, none skipped."""
    critest = interop.require("critest")
    runc = interop.idmap_runc()
    interop.push_layout(registry)
    base = tmp_path / "d"
    certs = interop.write_mirrors(registry, tmp_path / "certs.d")
    config = ('version = 2\n[plugins."pycrid.cri.v1.images"]\n'
              'sandbox_image = "registry.k8s.io/pause:3.10"\n'
              '[plugins."pycrid.cri.v1.images".registry]\n'
              f'config_path = "{certs}"\n'
              '[plugins."pycrid.cri.v1.runtime"]\n'
              f'runtime_path = "{runc}"\n')
    images = tmp_path / "images.yaml"
    images.write_text(
        f"defaultTestContainerImage: {registry.host}/e2e-test-images/busybox:1.29-2\n"
        f"webServerTestImage: {registry.host}/e2e-test-images/nginx:1.14-2\n")
    report = tmp_path / "report.json"
    # The pod's mapped root must pass through every directory above its bundles: the
    # state directory goes where that holds (pytest's own tree is 0700).
    with mapped_root_state() as state, running_daemon(str(base), config,
                                                      state_dir=state) as d:
        endpoint = f"unix://{d.address}"
        run = subprocess.run(
            [str(critest), f"--runtime-endpoint={endpoint}", f"--image-endpoint={endpoint}",
             f"--test-images-file={images}", "--ginkgo.focus=UserNamespaces",
             "--ginkgo.no-color", f"--ginkgo.json-report={report}"],
            cwd=tmp_path, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, timeout=800, check=False)
        (tmp_path / "critest.out").write_bytes(run.stdout)
        pods = Pods(d.client)
        for p in d.client.runtime.ListPodSandbox(pb.ListPodSandboxRequest(), timeout=30).items:
            pods.remove_pod(p.id)
        left = leftovers(d.root, d.state)
    assert report.exists(), run.stdout.decode(errors="replace")[-4000:]
    specs = [s for s in _outcomes(report) if "UserNamespaces" in s["name"]]
    counts: dict[str, int] = {}
    for s in specs:
        counts[s["state"]] = counts.get(s["state"], 0) + 1
    print(f"critest UserNamespaces: {counts}")
    problems = [f"{s['state']}: {s['name']}\n    {s['message'][:1500]}"
                for s in specs if s["state"] != "passed"]
    assert not problems, (f"critest {counts} (log: {tmp_path / 'critest.out'}, daemon log: "
                          f"{os.path.join(base, 'pycrid.log')}):\n" + "\n".join(problems))
    assert counts == {"passed": USERNS_SPECS}
    assert left == [], left
