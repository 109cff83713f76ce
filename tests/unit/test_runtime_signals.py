"""Direct init signalling (runtime/signals.py) against real processes and runc-shaped
state files: the recorded start time guards against pid reuse, and the cases where runc
does more than signal the init are left to runc."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from pycrid.runtime.signals import _start_time, signal_init


@pytest.fixture
def child() -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen(["sleep", "60"])
    yield proc
    proc.kill()
    proc.wait()


def _state(root: Path, cid: str, pid: int, start: int | None, *,
           pid_ns: str | None = "", freezer: str | None = None) -> None:
    namespaces = [{"type": "NEWNS", "path": ""}]
    if pid_ns is not None:
        namespaces.append({"type": "NEWPID", "path": pid_ns})
    doc = {"id": cid, "init_process_pid": pid, "init_process_start": start,
           "config": {"namespaces": namespaces},
           "cgroup_paths": {"freezer": freezer} if freezer else {}}
    (root / cid).mkdir()
    (root / cid / "state.json").write_text(json.dumps(doc))


def test_signals_the_recorded_init(tmp_path: Path, child: subprocess.Popen[bytes]) -> None:
    _state(tmp_path, "c1", child.pid, _start_time(child.pid))
    assert signal_init(str(tmp_path), "c1", signal.SIGKILL) is True
    assert child.wait(timeout=5) == -signal.SIGKILL


def test_sigterm_goes_to_init_even_in_a_shared_pid_namespace(
        tmp_path: Path, child: subprocess.Popen[bytes]) -> None:
    _state(tmp_path, "c1", child.pid, _start_time(child.pid), pid_ns="/proc/1/ns/pid")
    assert signal_init(str(tmp_path), "c1", signal.SIGTERM) is True
    assert child.wait(timeout=5) == -signal.SIGTERM


def test_a_reused_pid_is_not_signalled(tmp_path: Path,
                                       child: subprocess.Popen[bytes]) -> None:
    start = _start_time(child.pid)
    assert start is not None
    _state(tmp_path, "c1", child.pid, start - 1)  # the recorded init started earlier
    assert signal_init(str(tmp_path), "c1", signal.SIGKILL) is False
    assert child.poll() is None


def test_a_gone_init_is_not_running(tmp_path: Path) -> None:
    proc = subprocess.Popen(["true"])
    proc.wait()
    _state(tmp_path, "c1", proc.pid, 1)
    assert signal_init(str(tmp_path), "c1", signal.SIGKILL) is False


@pytest.mark.parametrize("pid_ns", [None, "/proc/1/ns/pid"])
def test_sigkill_without_a_private_pid_namespace_is_left_to_runc(
        tmp_path: Path, child: subprocess.Popen[bytes], pid_ns: str | None) -> None:
    # runc kills every process of the cgroup then, not just the init.
    _state(tmp_path, "c1", child.pid, _start_time(child.pid), pid_ns=pid_ns)
    assert signal_init(str(tmp_path), "c1", signal.SIGKILL) is None
    assert child.poll() is None


def test_sigkill_of_a_frozen_container_is_left_to_runc(
        tmp_path: Path, child: subprocess.Popen[bytes]) -> None:
    freezer = tmp_path / "freezer"
    freezer.mkdir()
    (freezer / "freezer.state").write_text("FROZEN\n")
    _state(tmp_path, "c1", child.pid, _start_time(child.pid), freezer=str(freezer))
    assert signal_init(str(tmp_path), "c1", signal.SIGKILL) is None
    assert child.poll() is None


@pytest.mark.parametrize("content", [None, "not json", json.dumps({"id": "c1"})])
def test_unknown_state_is_left_to_runc(tmp_path: Path, content: str | None) -> None:
    if content is not None:
        (tmp_path / "c1").mkdir()
        (tmp_path / "c1" / "state.json").write_text(content)
    assert signal_init(str(tmp_path), "c1", signal.SIGKILL) is None


def test_start_time_orders_processes_and_misses_gone_ones(
        child: subprocess.Popen[bytes]) -> None:
    mine, theirs = _start_time(os.getpid()), _start_time(child.pid)
    assert mine is not None and theirs is not None and theirs >= mine
    proc = subprocess.Popen(["true"])
    proc.wait()
    assert _start_time(proc.pid) is None
