"""End-to-end tests share the machine: each leaves no daemon, mount or registry behind."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support import network
from tests.support.daemon import Daemon, mounts_under
from tests.support.pods import Pods, command_lines, container_cgroups


def _processes(names: tuple[str, ...]) -> list[str]:
    return [f"{pid}: {cmd}" for pid, cmd in command_lines() if any(n in cmd for n in names)]


@pytest.fixture(autouse=True, scope="session")
def nothing_leaked(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    base = str(tmp_path_factory.getbasetemp())
    watched = ("pycrid serve", "conmon", "runc")
    before = set(_processes(watched))
    cgroups_before = set(container_cgroups())
    veths_before = network.veths()
    nat_before = network.nat_rules()
    forward_before = network.ip_forward()
    yield
    leaked_procs = [p for p in _processes(watched) if p not in before]
    leaked_mounts = mounts_under(base)
    leaked_cgroups = [c for c in container_cgroups() if c not in cgroups_before]
    leaked_veths = network.veths() - veths_before
    leaked_rules = network.pod_nat_rules()
    leaked_ips = [ip for b in network.daemon_bases() for ip in network.allocated_ips(b)]
    # What the CNI plugins set up once and never take down: the test bridges, the
    # portmap plugin's shared chains and the forwarding the bridge plugin turned on.
    network.remove_bridges()
    if not any("CNI-HOSTPORT" in r for r in nat_before):
        network.remove_portmap_scaffolding()
    network.set_ip_forward(forward_before)
    assert not leaked_procs, f"pycrid, conmon or runc processes left running: {leaked_procs}"
    assert not leaked_mounts, f"mounts (rootfs, shm, netns) left in test dirs: {leaked_mounts}"
    assert not leaked_cgroups, f"container cgroups left behind: {leaked_cgroups}"
    assert not leaked_veths, f"veth interfaces left behind: {leaked_veths}"
    assert not leaked_rules, f"pod port-mapping rules left in the nat table: {leaked_rules}"
    assert not leaked_ips, f"pod IPs still allocated in host-local stores: {leaked_ips}"


@pytest.fixture
def pods(daemon: Daemon) -> Iterator[Pods]:
    """Pods of one test on its module's ``daemon``; every pod it made is removed afterwards,
    also when the test fails half-way. (Modules may define their own.)"""
    p = Pods(daemon.client)
    try:
        yield p
    finally:
        p.cleanup()
