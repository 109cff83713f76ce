"""The owner primitive and race (pycrid.tasks)."""

from __future__ import annotations

import asyncio
import logging

import pytest

from pycrid.tasks import Owner, race


async def test_owner_closes_children_then_its_tasks() -> None:
    order: list[str] = []
    root = Owner("daemon")
    child = root.child("nri")

    async def sleeper(tag: str) -> None:
        try:
            await asyncio.sleep(3600)
        finally:
            order.append(tag)

    root.spawn(sleeper("root"), "root sleeper")
    child.spawn(sleeper("child"), "child sleeper")
    await asyncio.sleep(0)
    assert root.tree() == ["daemon: root sleeper", "daemon/nri: child sleeper"]
    await root.aclose()
    assert order == ["child", "root"]
    assert len(root) == 0 and len(child) == 0
    with pytest.raises(RuntimeError, match="daemon/nri is closed"):
        child.spawn(sleeper("late"), "late")


async def test_a_task_of_the_owner_can_close_it() -> None:
    root = Owner("connection")
    child = root.child("calls")
    closed = asyncio.Event()

    async def handler() -> str:
        await root.aclose()  # a call handler closing its own connection
        closed.set()
        return "closed"

    other = root.spawn(asyncio.sleep(3600), "reader")
    child.spawn(asyncio.sleep(3600), "call")
    closing = child.spawn(handler(), "close call")
    assert await asyncio.wait_for(closing, 5) == "closed"
    assert closed.is_set() and other.cancelled()
    assert root.tree() == []


async def test_a_close_within_leaves_a_stuck_task_to_end_in_the_background(
        caplog: pytest.LogCaptureFixture) -> None:
    root = Owner("daemon")
    sessions = root.child("streaming server", close_within=0.05)
    release = asyncio.Event()

    async def stuck() -> None:
        try:
            await asyncio.sleep(3600)
        finally:
            await release.wait()  # a cleanup that ignores the cancellation

    task = sessions.spawn(stuck(), "session")
    await asyncio.sleep(0)
    await asyncio.wait_for(sessions.aclose(), 5)
    await asyncio.wait_for(root.aclose(), 5)  # closing it again is bounded too
    assert not task.done()
    assert "daemon/streaming server: 1 tasks still ending" in caplog.text
    release.set()
    await asyncio.wait_for(asyncio.gather(task, return_exceptions=True), 5)
    assert len(sessions) == 0


async def test_owner_logs_a_failed_task_by_name(caplog: pytest.LogCaptureFixture) -> None:
    owner = Owner("sampler")

    async def boom() -> None:
        raise ValueError("bad cgroup")

    with caplog.at_level(logging.ERROR, logger="pycrid.tasks"):
        task = owner.spawn(boom(), "tick")
        await asyncio.gather(task, return_exceptions=True)
        await asyncio.sleep(0)
    assert "sampler: tick" in caplog.text and "bad cgroup" in caplog.text
    assert len(owner) == 0


async def test_race_keeps_the_first_and_cancels_the_rest() -> None:
    cancelled = asyncio.Event()

    async def slow() -> str:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return "slow"

    async def fast() -> str:
        return "fast"

    assert await race(slow(), fast()) == "fast"
    assert cancelled.is_set()


async def test_race_raises_the_winners_exception() -> None:
    async def fails() -> str:
        raise LookupError("gone")

    with pytest.raises(LookupError, match="gone"):
        await race(asyncio.sleep(3600, "never"), fails())


async def test_cancelling_a_race_cancels_its_contenders() -> None:
    started, stopped = asyncio.Event(), asyncio.Event()

    async def contender() -> None:
        started.set()
        try:
            await asyncio.sleep(3600)
        finally:
            stopped.set()

    outer = asyncio.ensure_future(race(contender(), asyncio.sleep(3600)))
    await started.wait()
    outer.cancel()
    with pytest.raises(asyncio.CancelledError):
        await outer
    assert stopped.is_set()
