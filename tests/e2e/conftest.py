"""End-to-end tests share the machine: each leaves no daemon, mount or registry behind."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.daemon import mounts_under
from tests.support.pods import command_lines, container_cgroups


def _processes(names: tuple[str, ...]) -> list[str]:
    return [f"{pid}: {cmd}" for pid, cmd in command_lines() if any(n in cmd for n in names)]


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
