"""Exit files, the inotify exit watcher and exit waiters (runtime/exits.py)."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from pycrid.runtime.exits import Exit, ExitWaiters, ExitWatcher, read_exit

TICK = 0.02



async def settle() -> None:
    """Let every ready task run until it blocks."""
    for _ in range(5):
        await asyncio.sleep(0)



# ---- exits ---------------------------------------------------------------------------


def test_read_exit_missing_is_none(tmp_path: Path) -> None:
    assert read_exit(str(tmp_path), "nope") is None


def test_read_exit_parses_code_and_mtime(tmp_path: Path) -> None:
    (tmp_path / "c1").write_text("137\n")
    os.utime(tmp_path / "c1", ns=(1_000_000_000, 2_000_000_000))
    assert read_exit(str(tmp_path), "c1") == Exit("c1", 137, 2_000_000_000)


@pytest.mark.parametrize("raw", ["", "abc", "1.5", "\n"])
def test_read_exit_garbage_is_none(tmp_path: Path, raw: str) -> None:
    (tmp_path / "c1").write_text(raw)
    assert read_exit(str(tmp_path), "c1") is None


async def watched(tmp_path: Path) -> tuple[ExitWatcher, list[Exit], asyncio.Queue[Exit]]:
    seen: list[Exit] = []
    queue: asyncio.Queue[Exit] = asyncio.Queue()

    def on_exit(e: Exit) -> None:
        seen.append(e)
        queue.put_nowait(e)

    w = ExitWatcher(str(tmp_path / "exits"), on_exit)
    w.start()
    return w, seen, queue


async def test_exit_watcher_sees_renamed_file_once(tmp_path: Path) -> None:
    w, seen, queue = await watched(tmp_path)
    try:
        d = tmp_path / "exits"
        (d / ".c1.tmp").write_text("3")
        os.rename(d / ".c1.tmp", d / "c1")
        got = await asyncio.wait_for(queue.get(), 1)
        assert (got.id, got.code) == ("c1", 3)
        assert got.at_ns == os.stat(d / "c1").st_mtime_ns
        (d / "c1").touch()  # another event for a name already delivered
        await asyncio.sleep(TICK)
        assert len(seen) == 1
    finally:
        w.close()


async def test_exit_watcher_sees_plain_write_once(tmp_path: Path) -> None:
    w, seen, queue = await watched(tmp_path)
    try:
        fd = os.open(tmp_path / "exits" / "c2", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        os.write(fd, b"3\n")
        os.close(fd)
        got = await asyncio.wait_for(queue.get(), 1)
        assert (got.id, got.code) == ("c2", 3)
        await asyncio.sleep(TICK)
        assert [e.id for e in seen] == ["c2"]
    finally:
        w.close()


async def test_exit_watcher_ignores_dot_files(tmp_path: Path) -> None:
    w, seen, queue = await watched(tmp_path)
    try:
        (tmp_path / "exits" / ".hidden").write_text("1")
        (tmp_path / "exits" / "c3").write_text("0")
        got = await asyncio.wait_for(queue.get(), 1)
        assert got.id == "c3"
        await asyncio.sleep(TICK)
        assert [e.id for e in seen] == ["c3"]
    finally:
        w.close()


async def test_exit_watcher_removed_exit_file_allows_new_exit(tmp_path: Path) -> None:
    """A removed object's exit file is deleted; the id is forgotten with it (no set that
    grows with every container ever run), and a rewritten file is a new exit."""
    w, seen, queue = await watched(tmp_path)
    try:
        path = tmp_path / "exits" / "c1"
        path.write_text("3")
        await asyncio.wait_for(queue.get(), 1)
        path.write_text("4")  # rewritten in place: the same exit, not reported again
        await asyncio.sleep(TICK)
        assert [e.code for e in seen] == [3]
        path.unlink()
        path.write_text("5")
        got = await asyncio.wait_for(queue.get(), 1)
        assert (got.id, got.code) == ("c1", 5)
        assert [e.code for e in seen] == [3, 5]
    finally:
        w.close()


async def test_exit_watcher_survives_a_failing_callback(tmp_path: Path) -> None:
    calls: list[str] = []

    def on_exit(e: Exit) -> None:
        calls.append(e.id)
        raise RuntimeError("handler bug")

    w = ExitWatcher(str(tmp_path / "exits"), on_exit)
    w.start()
    try:
        (tmp_path / "exits" / "a").write_text("1")
        (tmp_path / "exits" / "b").write_text("1")
        for _ in range(50):
            if len(calls) == 2:
                break
            await asyncio.sleep(TICK)
        assert sorted(calls) == ["a", "b"]
    finally:
        w.close()


async def test_exit_waiters_return_at_once_if_exited(tmp_path: Path) -> None:
    (tmp_path / "c1").write_text("0")
    waiters = ExitWaiters(lambda i: read_exit(str(tmp_path), i))
    got = await asyncio.wait_for(waiters.wait("c1"), 0.5)
    assert got is not None and (got.id, got.code) == ("c1", 0)


async def test_exit_waiters_time_out_with_none(tmp_path: Path) -> None:
    waiters = ExitWaiters(lambda i: read_exit(str(tmp_path), i))
    loop = asyncio.get_running_loop()
    start = loop.time()
    assert await waiters.wait("c1", within=0.05) is None
    assert loop.time() - start >= 0.04


async def test_exit_waiters_timeout_rechecks_for_an_unnotified_exit(tmp_path: Path) -> None:
    waiters = ExitWaiters(lambda i: read_exit(str(tmp_path), i))
    task = asyncio.create_task(waiters.wait("c1", within=0.05))
    await settle()
    (tmp_path / "c1").write_text("2")  # the exit lands but nobody calls notify
    got = await asyncio.wait_for(task, 1)
    assert got is not None and got.code == 2


async def test_exit_waiters_wake_on_notify(tmp_path: Path) -> None:
    waiters = ExitWaiters(lambda i: read_exit(str(tmp_path), i))
    task = asyncio.create_task(waiters.wait("c1"))
    await settle()
    assert not task.done()
    (tmp_path / "c1").write_text("7")
    waiters.notify(Exit("c1", 7, 0))
    got = await asyncio.wait_for(task, 0.5)
    assert got is not None and got.code == 7


async def test_exit_waiters_notify_of_other_id_does_not_wake(tmp_path: Path) -> None:
    waiters = ExitWaiters(lambda i: read_exit(str(tmp_path), i))
    task = asyncio.create_task(waiters.wait("c1", within=0.05))
    await settle()
    (tmp_path / "c2").write_text("1")
    waiters.notify(Exit("c2", 1, 0))
    await settle()
    assert not task.done()
    assert await task is None
