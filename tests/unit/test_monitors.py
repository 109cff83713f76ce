"""Watching conmons that are not our children (runtime/monitors.py), the exit file a dead
conmon's container gets (runtime/exits.py), and the mount-table watch the pins use."""

from __future__ import annotations

import asyncio
import errno
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from pycrid.host.mountinfo import MountTableWatch
from pycrid.runtime import monitors
from pycrid.runtime.exits import Exit, read_exit, write_exit
from pycrid.runtime.monitors import MonitorWatch, is_monitor_of


def _fake_conmon(cid: str) -> subprocess.Popen[bytes]:
    """A process whose command line names ``cid`` as conmon's does (``--cid <id>``), once
    it has exec'd (conmon writes its pid file only then)."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)",
                             "--cid", cid])
    for _ in range(500):
        if is_monitor_of(proc.pid, cid):
            return proc
        time.sleep(0.01)
    proc.kill()
    raise AssertionError("the fake conmon did not start")


@pytest.fixture
def bundle(tmp_path: Path) -> Path:
    return tmp_path


def _pid_file(bundle: Path, pid: int) -> None:
    (bundle / monitors.PID_FILE).write_text(f"{pid}\n")


async def _ended_within(ended: list[tuple[str, str]], limit: float) -> None:
    for _ in range(int(limit * 100)):
        if ended:
            return
        await asyncio.sleep(0.01)


async def test_a_watched_conmon_that_dies_is_reported_once(bundle: Path) -> None:
    proc = _fake_conmon("abc")
    _pid_file(bundle, proc.pid)
    ended: list[tuple[str, str]] = []
    watch = MonitorWatch(lambda oid, b: ended.append((oid, b)))
    try:
        assert watch.watch("abc", str(bundle))
        assert watch.watch("abc", str(bundle))  # idempotent
        await asyncio.sleep(0.1)
        assert ended == []
        proc.kill()
        proc.wait()
        await _ended_within(ended, 5)
        assert ended == [("abc", str(bundle))]
        assert "abc" not in watch
    finally:
        watch.close()
        proc.kill()


async def test_a_pid_that_is_not_the_containers_conmon_is_not_watched(bundle: Path) -> None:
    """The pid file names a process that is someone else now (pid reused), or nobody."""
    other = _fake_conmon("another-container")
    watch = MonitorWatch(lambda oid, b: None)
    try:
        _pid_file(bundle, other.pid)
        assert not watch.watch("abc", str(bundle))
        _pid_file(bundle, 2 ** 22 + 17)  # above any pid_max: no such process
        assert not watch.watch("abc", str(bundle))
        (bundle / monitors.PID_FILE).unlink()
        assert not watch.watch("abc", str(bundle))
        assert is_monitor_of(other.pid, "another-container")
        assert not is_monitor_of(other.pid, "another")  # a prefix is not the id
    finally:
        watch.close()
        other.kill()
        other.wait()


async def test_forgotten_conmons_are_not_reported(bundle: Path) -> None:
    proc = _fake_conmon("abc")
    _pid_file(bundle, proc.pid)
    ended: list[tuple[str, str]] = []
    watch = MonitorWatch(lambda oid, b: ended.append((oid, b)))
    try:
        assert watch.watch("abc", str(bundle))
        watch.forget("abc")
        proc.kill()
        proc.wait()
        await asyncio.sleep(0.3)
        assert ended == []
    finally:
        watch.close()


async def test_without_a_descriptor_left_the_conmon_is_polled(
        bundle: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def no_fd(pid: int) -> int:
        raise OSError(errno.EMFILE, "Too many open files")

    monkeypatch.setattr(monitors.os, "pidfd_open", no_fd)
    monkeypatch.setattr(monitors, "POLL_EVERY", 0.05)
    proc = _fake_conmon("abc")
    _pid_file(bundle, proc.pid)
    ended: list[tuple[str, str]] = []
    watch = MonitorWatch(lambda oid, b: ended.append((oid, b)))
    try:
        assert watch.watch("abc", str(bundle))
        await asyncio.sleep(0.2)
        assert ended == []
        proc.kill()
        proc.wait()
        await _ended_within(ended, 5)
        assert ended == [("abc", str(bundle))]
    finally:
        watch.close()


def test_exit_files_of_conmon_and_of_the_daemon_read_back(tmp_path: Path) -> None:
    (tmp_path / "plain").write_text("137")  # conmon's: the code alone
    got = read_exit(str(tmp_path), "plain")
    assert got is not None and (got.code, got.reason, got.message) == (137, "", "")
    written = write_exit(str(tmp_path), Exit("lost", 255, 0, reason="Unknown",
                                             message="its monitor died"))
    assert (written.code, written.reason, written.message) == (255, "Unknown", "its monitor died")
    assert read_exit(str(tmp_path), "lost") == written
    assert sorted(os.listdir(tmp_path)) == ["lost", "plain"]  # no temporary left
    (tmp_path / "half").write_text("")
    assert read_exit(str(tmp_path), "half") is None  # being written


async def test_mount_table_changes_are_seen() -> None:
    changes: list[int] = []
    watch = MountTableWatch(lambda: changes.append(1))
    target = tempfile.mkdtemp(prefix="pycrid-mountwatch-")
    try:
        watch.start()
        await asyncio.to_thread(subprocess.run, ["mount", "-t", "tmpfs", "tmpfs", target],
                                check=True)
        for _ in range(100):
            if changes:
                break
            await asyncio.sleep(0.01)
        assert changes, "a mount was not seen"
        seen = len(changes)  # before the unmount: its change may be seen while we wait
        await asyncio.to_thread(subprocess.run, ["umount", target], check=True)
        for _ in range(100):
            if len(changes) > seen:
                break
            await asyncio.sleep(0.01)
        assert len(changes) > seen, "an unmount was not seen"
    finally:
        watch.close()
        await asyncio.to_thread(subprocess.run, ["umount", target], check=False,
                                capture_output=True)
        os.rmdir(target)


def test_reap_kills_a_conmon_that_stays_and_nothing_else() -> None:
    cid = "c" * 64
    other = subprocess.Popen(["sleep", "30"])
    try:
        # A live process that is not this container's conmon (a reused pid): no wait (the
        # 60 s would outlast the 10 s guard), no signal.
        asyncio.run(asyncio.wait_for(monitors.reap(other.pid, cid, 60), 10))
        assert other.poll() is None
    finally:
        other.kill()
        other.wait()
    asyncio.run(monitors.reap(other.pid, cid, 60))  # gone: nothing to do
    stays = _fake_conmon(cid)
    try:
        asyncio.run(monitors.reap(stays.pid, cid, 0.2))
        assert stays.wait(10) == -9
    finally:
        stays.kill()
        stays.wait()


def test_kill_monitor_kills_only_the_containers_conmon() -> None:
    cid = "d" * 64
    other = subprocess.Popen(["sleep", "30"])
    conmon = _fake_conmon(cid)
    try:
        monitors.kill_monitor(other.pid, cid)  # a pid that is not its conmon (reused)
        monitors.kill_monitor(conmon.pid, cid)
        assert conmon.wait(10) == -9
        assert other.poll() is None
    finally:
        for proc in (other, conmon):
            proc.kill()
            proc.wait()
