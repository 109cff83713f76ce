"""OOM-kill detection: conmon's ``oom`` file, else the cgroup's OOM-kill counter.

conmon (2.1, cgroup v1) learns of an OOM kill from an eventfd in its main loop; when the
loop handles the container's exit first, it quits and the ``oom`` file is never written.
The kernel's own counter is there either way.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pycrid.runtime.conmon import ConmonRuntime
from pycrid.stats.cgroup_hierarchy import Hierarchy, oom_kills

CGROUPS_PATH = "/k8s.io/" + "ab" * 32


@pytest.fixture
def runtime(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> ConmonRuntime:
    for name in ("runc", "conmon"):
        exe = tmp_path / "bin" / name
        exe.parent.mkdir(exist_ok=True)
        exe.write_text("#!/bin/sh\n")
        exe.chmod(0o755)
    return ConmonRuntime(state_dir=str(tmp_path / "state"), runc=str(tmp_path / "bin/runc"),
                         conmon=str(tmp_path / "bin/conmon"),
                         cgroups=Hierarchy(v1={"memory": str(tmp_path / "memory")}))


def _bundle(tmp_path: Path) -> Path:
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    (bundle / "config.json").write_text(json.dumps({"linux": {"cgroupsPath": CGROUPS_PATH}}))
    return bundle


def _oom_control(tmp_path: Path, kills: int) -> None:
    d = tmp_path / "memory" / CGROUPS_PATH.lstrip("/")
    d.mkdir(parents=True)
    (d / "memory.oom_control").write_text(f"oom_kill_disable 0\nunder_oom 0\noom_kill {kills}\n")


def test_conmon_file_is_enough(runtime: ConmonRuntime, tmp_path: Path) -> None:
    bundle = _bundle(tmp_path)
    (bundle / "oom").touch()
    assert runtime.oom_killed(str(bundle))


def test_counter_when_conmon_wrote_no_file(runtime: ConmonRuntime, tmp_path: Path) -> None:
    bundle = _bundle(tmp_path)
    _oom_control(tmp_path, 1)
    assert runtime.oom_killed(str(bundle))


def test_no_kill_no_file(runtime: ConmonRuntime, tmp_path: Path) -> None:
    bundle = _bundle(tmp_path)
    _oom_control(tmp_path, 0)
    assert not runtime.oom_killed(str(bundle))


def test_cgroup_gone(runtime: ConmonRuntime, tmp_path: Path) -> None:
    assert not runtime.oom_killed(str(_bundle(tmp_path)))


def test_v2_counter(tmp_path: Path) -> None:
    d = tmp_path / "unified" / CGROUPS_PATH.lstrip("/")
    d.mkdir(parents=True)
    (d / "memory.events").write_text("low 0\nhigh 0\nmax 12\noom 2\noom_kill 2\n")
    assert oom_kills(Hierarchy(unified=str(tmp_path / "unified")), CGROUPS_PATH) == 2
    assert oom_kills(Hierarchy(unified=str(tmp_path / "unified")), "/k8s.io/other") is None
