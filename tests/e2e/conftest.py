"""End-to-end tests share the machine: each leaves no daemon, mount or registry behind."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from tests.support.daemon import mounts_under
from tests.support.pods import container_cgroups


def _processes(names: tuple[str, ...]) -> list[str]:
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if any(n in cmd for n in names):
            found.append(f"{pid}: {cmd.strip()}")
    return found


@pytest.fixture(autouse=True, scope="session")
def nothing_leaked(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    base = str(tmp_path_factory.getbasetemp())
    watched = ("pycrid serve", "conmon", "runc")
    before = set(_processes(watched))
    cgroups_before = set(container_cgroups())
    yield
    leaked_procs = [p for p in _processes(watched) if p not in before]
    leaked_mounts = mounts_under(base)
    leaked_cgroups = [c for c in container_cgroups() if c not in cgroups_before]
    assert not leaked_procs, f"pycrid, conmon or runc processes left running: {leaked_procs}"
    assert not leaked_mounts, f"mounts (rootfs, shm, netns) left in test dirs: {leaked_mounts}"
    assert not leaked_cgroups, f"container cgroups left behind: {leaked_cgroups}"
