"""End-to-end tests share the machine: each leaves no daemon, mount or registry behind.

The leak checks look only at what this session created (processes naming its temporary
directory, cgroups and port-mapping rules of the ids its daemons logged, veths on its
bridges), so the suite passes on a node that also runs containerd or another pycrid.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from tests.support import network
from tests.support.daemon import Daemon, ids_logged_under, mounts_under
from tests.support.pods import Pods, command_lines, container_cgroups

#: Processes the suite starts that must be gone at its end (when their command line
#: names the session's temporary directory).
WATCHED = ("pycrid serve", "pycrid.cli", "conmon", "runc", "runsc", "nri-", "critest",
           "crictl", "kubelet")


def _ancestors() -> set[int]:
    """This process's parents (whose command line may name ``--basetemp`` too)."""
    found, pid = set(), os.getppid()
    while pid > 1:
        found.add(pid)
        try:
            with open(f"/proc/{pid}/stat") as f:
                pid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            break
    return found


def session_processes(base: str) -> list[str]:
    """Runtime processes started for this session: their command line names ``base``."""
    mine = _ancestors()
    return [f"{pid}: {cmd[:300]}" for pid, cmd in command_lines()
            if base in cmd and any(n in cmd for n in WATCHED) and pid not in mine]


def session_leaks(base: str) -> list[str]:
    """What the session's daemons left on the host, judged by what they created."""
    ids = ids_logged_under(base)
    found = [f"process {p}" for p in session_processes(base)]
    found += [f"mount {m}" for m in mounts_under(base)]
    found += [f"cgroup {c}" for c in container_cgroups(ids)]
    found += [f"veth {v}" for v in sorted(network.veths(network.our_bridges()))]
    found += [f"nat rule {r}" for r in network.pod_nat_rules(ids)]
    found += [f"pod IP {ip}" for b in network.daemon_bases() for ip in network.allocated_ips(b)]
    return found


@pytest.fixture(autouse=True, scope="session")
def nothing_leaked(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    base = str(tmp_path_factory.getbasetemp())
    nat_before = network.nat_rules()
    forward_before = network.ip_forward()
    yield
    leaks = session_leaks(base)
    # What the CNI plugins set up once and never take down: the test bridges, the
    # portmap plugin's shared chains and the forwarding the bridge plugin turned on.
    network.remove_bridges()
    if not any("CNI-HOSTPORT" in r for r in nat_before):
        network.remove_portmap_scaffolding()
    network.set_ip_forward(forward_before)
    assert not leaks, "left behind by this session:\n  " + "\n  ".join(leaks)


@pytest.fixture
def pods(daemon: Daemon) -> Iterator[Pods]:
    """Pods of one test on its module's ``daemon``; every pod it made is removed afterwards,
    also when the test fails half-way. (Modules may define their own.)"""
    p = Pods(daemon.client)
    try:
        yield p
    finally:
        p.cleanup()
