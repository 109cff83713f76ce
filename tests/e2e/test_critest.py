"""critest, the cri-tools validation suite (the real Go binary), against pycrid.

The images critest pulls by their public names (registry.k8s.io, gcr.io, docker.io,
public.ecr.aws, k8s.gcr.io) come from the suite's local registry through a containerd
``hosts.toml`` mirror for each host; the daemon is a usual test daemon whose sandbox image
is critest's pause, pulled through the same mirror. Every spec runs, the NRI suite
included (``--nri-socket``). A failure, or a skip for a reason not listed here, fails the
test with each spec's message. Two more runs: every spec again under gVisor
(``--runtime-handler=runsc``), and the UserNamespaces specs with a runc that makes
idmapped mounts.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Collection, Iterator
from dataclasses import dataclass
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


@dataclass(frozen=True)
class Run:
    """One critest run: each spec's outcome, the counts by state, and what the daemon
    still held once every listed pod was removed."""

    specs: list[dict[str, str]]
    counts: dict[str, int]
    left: list[str]
    where: str

    def problems(self, allowed: Collection[str] = ()) -> list[str]:
        """Failures not ``allowed`` (nor tolerated), and skips for a reason critest should
        not have here."""
        failed = [s for s in self.specs if s["state"] not in ("passed", "skipped")
                  and s["leaf"] not in TOLERATED_FAILURES and s["leaf"] not in allowed]
        odd_skips = [s for s in self.specs if s["state"] == "skipped" and not any(
            s["message"].startswith(reason) if reason else not s["message"]
            for reason in ALLOWED_SKIPS)]
        return [f"{s['state']}: {s['name']}\n    {s['message'][:1500]}"
                for s in failed + odd_skips]


def run_critest(tmp_path: Path, registry: LocalRegistry, *args: str, runtime: str = "",
                state_dir: str | None = None, timeout: float = 1100) -> Run:
    """critest against a test daemon whose images come from ``registry`` (with ``runtime``
    lines for its runtime section, and ``args`` for critest); then the pods critest left
    (a failed spec may skip its own cleanup) are removed."""
    critest = interop.require("critest")
    interop.push_layout(registry)
    base = tmp_path / "d"
    certs = interop.write_mirrors(registry, tmp_path / "certs.d")
    config = ('version = 2\n[plugins."pycrid.cri.v1.images"]\n'
              'sandbox_image = "registry.k8s.io/pause:3.10"\n'
              '[plugins."pycrid.cri.v1.images".registry]\n'
              f'config_path = "{certs}"\n')
    if runtime:
        config += f'[plugins."pycrid.cri.v1.runtime"]\n{runtime}'
    images = tmp_path / "images.yaml"
    images.write_text(
        f"defaultTestContainerImage: {registry.host}/e2e-test-images/busybox:1.29-2\n"
        f"webServerTestImage: {registry.host}/e2e-test-images/nginx:1.14-2\n")
    report = tmp_path / "report.json"
    with running_daemon(str(base), config, state_dir=state_dir) as d:
        endpoint = f"unix://{d.address}"
        run = subprocess.run(
            [str(critest), f"--runtime-endpoint={endpoint}", f"--image-endpoint={endpoint}",
             f"--test-images-file={images}", *args,
             "--ginkgo.no-color", f"--ginkgo.json-report={report}"],
            cwd=tmp_path, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, timeout=timeout, check=False)
        (tmp_path / "critest.out").write_bytes(run.stdout)
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
    print(f"critest {' '.join(args)}: {counts}")
    for s in specs:
        if s["state"] != "passed":
            print(f"  {s['state']}: {s['name']}: {s['message'][:300]}")
    return Run(specs, counts, left, f"(log: {tmp_path / 'critest.out'}, daemon log: "
               f"{os.path.join(base, 'pycrid.log')})")


@pytest.mark.timeout(1200)
def test_critest(tmp_path: Path, registry: LocalRegistry) -> None:
    nri = nri_paths(str(tmp_path / "d"))["socket_path"]
    run = run_critest(tmp_path, registry, f"--nri-socket={nri}")
    problems = run.problems()
    assert not problems, f"critest {run.counts} {run.where}:\n" + "\n".join(problems)
    assert run.counts.get("passed", 0) > 0
    assert run.left == [], run.left


# ---- critest under gVisor (runsc) ------------------------------------------------------------

#: Specs that pass under runc and cannot pass under gVisor, with gVisor's reason (the
#: runsc Debian ships: 20221219). Nothing else may fail; a listed spec that passes fails
#: the test too, so the list stays true.
_NO_EXEC_SECCOMP = ("runsc before 2026-03 installs a container's OCI seccomp filter (which "
                    "pycrid has it apply: --oci-seccomp) on the container's own process only; "
                    "the spec checks it from an exec'd process, which runs without it")
_NO_MASKS = ("runsc does not apply the spec's maskedPaths and readonlyPaths (its /proc and "
             "/sys are its own kernel's)")
_NO_BRIDGE = ("the spec makes a bridge with brctl (ioctl SIOCBRADDBR), which gVisor's network "
              "stack does not implement")
_SYSCTLS = ("gVisor's kernel implements a subset of /proc/sys, without the file the spec "
            "reads back")
RUNSC_UNSUPPORTED: dict[str, str] = {
    "runtime should support HostIpc is true":
        "gVisor implements System V IPC in its own kernel: a segment made on the host is "
        "not in the sandbox",
    "runtime should support HostNetwork is true":
        "the spec looks for a port the host listens on in the container's `netstat -ln` "
        "(/proc/net/tcp); gVisor's lists only the sandbox's own sockets, also on the "
        "host's network",
    "runtime should support Privileged is true": _NO_BRIDGE,
    "runtime should support adding capability": _NO_BRIDGE,
    "runtime should support dropping capability":
        "ping needs a raw socket, which gVisor turns off unless runsc runs with --net-raw "
        "(off by default, for isolation): it fails with EAFNOSUPPORT before any capability "
        "check",
    "runtime should support MaskedPaths": _NO_MASKS,
    "runtime should support ReadonlyPaths": _NO_MASKS,
    "should support seccomp localhost profile on the container": _NO_EXEC_SECCOMP,
    "should support seccomp default on the container": _NO_EXEC_SECCOMP,
    "runtime should support an seccomp profile that blocks setting hostname with SYS_ADMIN":
        _NO_EXEC_SECCOMP,
    "should allow privilege escalation when false":
        "runsc before 2025-08 (--allow-suid) ignores setuid bits: the setuid-root program "
        "runs as its caller",
    "should support safe sysctls": _SYSCTLS,
    "should support unsafe sysctls": _SYSCTLS,
    "should terminate with exitCode 137 and reason OOMKilled":
        "runsc of 2022 keeps no memory limit per container (gVisor issue 172): the pod's "
        "cgroup limits the whole sandbox, and a container over its own limit is not killed",
    "should support non-recursive readonly mounts":
        "gVisor serves a bind mount as one tree through its gofer: a mount below it on the "
        "host is no mount of its own in the sandbox, so it is read-only with it",
    "mount with 'rshared' should support propagation from host to container and vice versa":
        "gVisor cannot share mounts with the host (runsc refuses rshared root propagation; "
        "pycrid refuses Bidirectional mounts for runsc pods)",
    "runtime should support listing pod sandbox metrics [Conformance]":
        "the CFS bandwidth series exist only for a container whose cgroup has a CPU quota; "
        "under gVisor a container has no host cgroup (its own limits are not applied), so "
        "there is no bandwidth to report",
}


#: critest's specs that fetch a page from its web server image (here the interop folder's
#: stand-in, which reads the request in a child forked per connection, with a 10 s
#: SO_RCVTIMEO). Under runsc 20221219 with the host's network (how pycrid runs it) such a
#: read returns at once, empty, when the request comes later than the connect (gVisor's
#: bug, see tests/e2e/test_runsc.py), and the server answers 404 without reading a request.
#: Through a port-forward the request always comes a round trip after the connect (the
#: runtime dials when the client's streams arrive, as containerd does; the client sends
#: once they are answered); a direct request comes late when the machine is busy (seen in
#: a packet capture: the 404 left the pod 1.8 ms after the handshake, before any request
#: byte). So these specs pass or fail by timing under gVisor: that 404 is tolerated, any
#: other failure of them is not. tests/e2e/test_runsc.py forwards ports under runsc with
#: a server that reads without the race.
WEB_SERVER_SPECS = frozenset({
    "runtime should support portforward [Conformance]",
    "runtime should support portforward in host network",
    "runtime should support port mapping with only container port [Conformance]",
    "runtime should support port mapping with host port and container port [Conformance]",
})
_EMPTY_READ_ANSWER = "<int>: 404"


@pytest.mark.timeout(1500)
def test_critest_runsc(tmp_path: Path, registry: LocalRegistry) -> None:
    """critest again with ``--runtime-handler=runsc`` (the handler pycrid offers when runsc
    is installed): every spec that passes under runc passes under gVisor, except those
    whose feature gVisor itself does not provide (RUNSC_UNSUPPORTED, each with the
    reason), and the web server specs gVisor's read race may fail (WEB_SERVER_SPECS)."""
    interop.require("critest")
    if shutil.which("runsc") is None:
        pytest.skip("runsc (gVisor) is not installed: apt-get install runsc")
    nri = nri_paths(str(tmp_path / "d"))["socket_path"]
    run = run_critest(tmp_path, registry, "--runtime-handler=runsc", f"--nri-socket={nri}",
                      timeout=1400)
    # The gVisor bug of WEB_SERVER_SPECS, not pycrid's: tolerated with exactly its
    # signature (any other failure of those specs fails the test).
    raced = {s["leaf"] for s in run.specs if s["state"] == "failed"
             and s["leaf"] in WEB_SERVER_SPECS and _EMPTY_READ_ANSWER in s["message"]}
    for leaf in sorted(raced):
        print(f"tolerated: the stand-in web server answered 404 under gVisor: {leaf}")
    problems = run.problems(set(RUNSC_UNSUPPORTED) | raced)
    problems += [f"listed as unsupported under gVisor but passed: {leaf}"
                 for leaf in RUNSC_UNSUPPORTED
                 if any(s["leaf"] == leaf and s["state"] == "passed" for s in run.specs)]
    assert not problems, f"critest {run.counts} {run.where}:\n" + "\n".join(problems)
    assert run.counts.get("passed", 0) > 0
    assert run.left == [], run.left


# ---- critest's user-namespace specs with a runc that makes idmapped mounts ----------------

#: critest's user-namespace specs (its "UserNamespaces" context): six, one of which runs a
#: pod in a user namespace and reads its uid_map.
USERNS_SPECS = 6


@pytest.mark.timeout(900)
def test_critest_user_namespaces(tmp_path: Path, registry: LocalRegistry) -> None:
    """critest's UserNamespaces specs with a runc that makes idmapped mounts (runc 1.2+;
    the interop one is 1.5.1): every one passes, none skipped."""
    interop.require("critest")
    runc = interop.idmap_runc()
    # The pod's mapped root must pass through every directory above its bundles: the
    # state directory goes where that holds (pytest's own tree is 0700).
    with mapped_root_state() as state:
        run = run_critest(tmp_path, registry, "--ginkgo.focus=UserNamespaces",
                          runtime=f'runtime_path = "{runc}"\n', state_dir=state, timeout=800)
    specs = [s for s in run.specs if "UserNamespaces" in s["name"]]
    counts: dict[str, int] = {}
    for s in specs:
        counts[s["state"]] = counts.get(s["state"], 0) + 1
    problems = [f"{s['state']}: {s['name']}\n    {s['message'][:1500]}"
                for s in specs if s["state"] != "passed"]
    assert not problems, f"critest {counts} {run.where}:\n" + "\n".join(problems)
    assert counts == {"passed": USERNS_SPECS}
    assert run.left == [], run.left
