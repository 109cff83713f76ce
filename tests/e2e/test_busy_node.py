"""The suite's leak checks on a node that also runs another runtime.

Another runtime's objects (a ``conmon`` process, a ``k8s.io/<id>`` container cgroup, a
veth, a pod's port-mapping rules) appear while a test daemon runs pods: the checks must
not count them as this suite's leaks, and must still see what the suite itself leaves.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.conftest import session_leaks
from tests.support.daemon import Daemon
from tests.support.images import TestImages
from tests.support.pods import (
    CGROUP_ROOT,
    Pods,
    busybox_daemon,
    container_config,
    leftovers,
    pod_config,
)
from tests.support.registry import LocalRegistry

pytestmark = pytest.mark.e2e


@pytest.fixture
def other_runtime() -> Iterator[dict[str, str]]:
    """What a second runtime's pod looks like on the host, made outside the suite's
    directories and removed afterwards."""
    cid = secrets.token_hex(32)
    scratch = tempfile.mkdtemp(prefix="other-runtime-")
    monitor = os.path.join(scratch, "conmon")
    shutil.copy("/bin/sleep", monitor)
    # A process named conmon, as the old check matched it (by name, host-wide).
    proc = subprocess.Popen([monitor, "600"], executable=monitor)
    cgroups = []
    for hierarchy in ("cpu", "memory", "pids"):
        d = os.path.join(CGROUP_ROOT, hierarchy, "k8s.io", cid)
        if os.path.isdir(os.path.dirname(os.path.dirname(d))):
            os.makedirs(d, exist_ok=True)
            cgroups.append(d)
    veth = f"vothr{secrets.token_hex(3)}"
    subprocess.run(["ip", "link", "add", veth, "type", "veth", "peer", "name", veth + "p"],
                   check=True)
    chain = f"CNI-DN-{secrets.token_hex(6)}"
    nat = [["-N", chain],
           ["-A", chain, "-p", "tcp", "--dport", "48123", "-j", "DNAT",
            "--to-destination", "10.99.0.7:80"],
           ["-A", "OUTPUT", "-p", "tcp", "--dport", "48123", "-m", "comment", "--comment",
            f'dnat name: "other" id: "{cid}"', "-j", chain]]
    for rule in nat:
        subprocess.run(["iptables", "-t", "nat", *rule], check=True)
    try:
        yield {"id": cid, "monitor": str(proc.pid), "veth": veth, "chain": chain}
    finally:
        subprocess.run(["iptables", "-t", "nat", "-D", *nat[2][1:]], check=False)
        subprocess.run(["iptables", "-t", "nat", "-F", chain], check=False)
        subprocess.run(["iptables", "-t", "nat", "-X", chain], check=False)
        subprocess.run(["ip", "link", "del", veth], check=False)
        proc.kill()
        proc.wait()
        for d in cgroups:
            os.rmdir(d)
        shutil.rmtree(scratch)


def _run_and_remove(d: Daemon) -> None:
    pods = Pods(d.client)
    pod = pod_config()
    sid = pods.run(pod)
    pods.run_container(sid, container_config(d.extra["busybox"], command=["sleep", "60"]), pod)
    pods.remove_pod(sid)


def test_other_runtimes_objects_are_not_our_leaks(
        tmp_path: Path, tmp_path_factory: pytest.TempPathFactory, registry: LocalRegistry,
        test_images: TestImages, other_runtime: dict[str, str]) -> None:
    base = str(tmp_path_factory.getbasetemp())
    with busybox_daemon(tmp_path / "d", registry, test_images) as d:
        _run_and_remove(d)
        assert leftovers(d.root, d.state) == []
    leaks = session_leaks(base)
    assert [x for x in leaks if other_runtime["id"] in x or other_runtime["veth"] in x
            or other_runtime["chain"] in x or f"{other_runtime['monitor']}:" in x] == []


def test_our_own_leaks_are_still_seen(tmp_path: Path,
                                      tmp_path_factory: pytest.TempPathFactory,
                                      registry: LocalRegistry, test_images: TestImages,
                                      other_runtime: dict[str, str]) -> None:
    """A daemon killed with a running container leaves its conmon and cgroup: the checks
    name them (and nothing of the other runtime's); a restarted daemon removes them."""
    base = str(tmp_path_factory.getbasetemp())
    with busybox_daemon(tmp_path / "d", registry, test_images) as d:
        pods = Pods(d.client)
        pod = pod_config()
        sid = pods.run(pod)
        cid = pods.run_container(
            sid, container_config(d.extra["busybox"], command=["sleep", "60"]), pod)
        d.proc.send_signal(signal.SIGKILL)
        d.proc.wait()
    try:
        leaks = session_leaks(base)
        assert any("conmon" in x and cid in x for x in leaks), leaks
        assert any(x.startswith("cgroup ") and x.endswith(cid) for x in leaks), leaks
        assert [x for x in leftovers(d.root, d.state) if x.startswith("cgroup ")] != []
        assert not [x for x in leaks if other_runtime["id"] in x
                    or other_runtime["veth"] in x or other_runtime["chain"] in x]
    finally:
        with busybox_daemon(tmp_path / "d", registry, test_images) as again:
            Pods(again.client).remove_pod(sid)
            assert leftovers(again.root, again.state) == []
