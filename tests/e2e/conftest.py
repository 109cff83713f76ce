"""End-to-end tests share the machine: each leaves no daemon, mount or registry behind."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from tests.support.daemon import mounts_under


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
    before = set(_processes(("pycrid serve",)))
    yield
    leaked_procs = [p for p in _processes(("pycrid serve",)) if p not in before]
    leaked_mounts = mounts_under(base)
    assert not leaked_procs, f"pycrid processes left running: {leaked_procs}"
    assert not leaked_mounts, f"mounts left under the test dirs: {leaked_mounts}"
