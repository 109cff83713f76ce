"""The event machinery without a daemon: backoff queues, the exit monitor, the fan-out
of CRI container events (src/pycrid/events/)."""

from __future__ import annotations

import asyncio

import pytest

from pycrid.events.backoff import Backoff
from pycrid.events.broadcast import Broadcast
from pycrid.events.monitor import ExitMonitor
from pycrid.runtime.exits import Exit

# ---- backoff ---------------------------------------------------------------------------


def test_backoff_first_retry_after_initial_delay() -> None:
    b: Backoff[str, int] = Backoff(initial=1.0, maximum=300.0)
    b.add("c1", 1, now=100.0)
    assert "c1" in b and len(b) == 1
    assert b.due(100.9) == []
    assert b.due(101.0) == ["c1"]
    assert b.next_due() == 101.0


def test_backoff_doubles_up_to_the_maximum() -> None:
    b: Backoff[str, int] = Backoff(initial=1.0, maximum=5.0)
    now = 0.0
    b.add("c1", 1, now)
    delays = []
    for _ in range(5):
        due = b.next_due()
        assert due is not None
        delays.append(due - now)
        now = due
        assert b.due(now) == ["c1"]
        events, delay = b.take("c1")
        assert events == [1]
        b.retry("c1", events, delay, now)
    assert delays == [1.0, 2.0, 4.0, 5.0, 5.0]


def test_backoff_keeps_an_objects_events_in_order() -> None:
    b: Backoff[str, int] = Backoff()
    b.add("c1", 1, 0.0)
    b.add("c1", 2, 0.5)  # arrives while c1 backs off: queued behind
    events, delay = b.take("c1")
    b.add("c1", 3, 1.0)  # arrives while the retry runs
    b.retry("c1", events[1:], delay, 1.0)  # 1 succeeded, 2 failed
    events, _ = b.take("c1")
    assert events == [2, 3]
    assert len(b) == 0


def test_backoff_due_orders_by_deadline_and_drop_forgets() -> None:
    b: Backoff[str, int] = Backoff(initial=1.0)
    b.add("late", 1, 5.0)
    b.add("early", 2, 1.0)
    b.add("gone", 3, 0.0)
    b.drop("gone")
    assert b.due(10.0) == ["early", "late"]
    assert b.next_due() == 2.0
    b.drop("missing")  # no error


# ---- exit monitor --------------------------------------------------------------------


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


async def test_monitor_handles_exits_in_order_once_started() -> None:
    handled: list[str] = []

    async def handler(e: Exit) -> None:
        handled.append(e.id)

    m = ExitMonitor(handler)
    m.submit(Exit("a", 0, 1))
    m.submit(Exit("b", 1, 2))
    await asyncio.sleep(0.01)
    assert handled == []  # queued until start (recovery hands exits in before)
    m.start()
    try:
        await asyncio.wait_for(m.idle(), 2)
        assert handled == ["a", "b"]
        assert m.handled == 2 and m.failures == 0
    finally:
        await m.aclose()


async def test_monitor_retries_a_failing_handler_until_it_succeeds() -> None:
    attempts: list[tuple[str, int]] = []
    fail = {"a": 3}
    done = asyncio.Event()

    async def handler(e: Exit) -> None:
        attempts.append((e.id, e.code))
        if fail.get(e.id, 0) > 0:
            fail[e.id] -= 1
            raise OSError("database is locked")
        if e.id == "a" and e.code == 2:
            done.set()

    m = ExitMonitor(handler, backoff=Backoff(initial=0.01, maximum=0.04))
    m.start()
    try:
        m.submit(Exit("a", 1, 1))
        m.submit(Exit("b", 0, 1))  # another object is not held up
        m.submit(Exit("a", 2, 2))  # queued behind a's failed exit
        await asyncio.wait_for(done.wait(), 5)
        assert attempts.index(("b", 0)) == 1
        a_attempts = [c for i, c in attempts if i == "a"]
        assert a_attempts == [1, 1, 1, 1, 2]  # 3 failures, then the success, then the next
        assert m.failures == 3 and m.handled == 3
        assert len(m.backoff) == 0
    finally:
        await m.aclose()


async def test_monitor_times_out_a_stuck_handler_and_retries() -> None:
    calls = 0

    async def handler(e: Exit) -> None:
        nonlocal calls
        calls += 1
        if calls == 1:
            await asyncio.sleep(10)

    m = ExitMonitor(handler, timeout=0.05, backoff=Backoff(initial=0.01))
    m.start()
    try:
        m.submit(Exit("a", 0, 1))
        for _ in range(200):
            if m.handled:
                break
            await asyncio.sleep(0.01)
        assert (calls, m.failures, m.handled) == (2, 1, 1)
    finally:
        await m.aclose()


async def test_monitor_close_cancels_its_task() -> None:
    async def handler(e: Exit) -> None:
        await asyncio.sleep(10)

    m = ExitMonitor(handler)
    m.start()
    m.submit(Exit("a", 0, 1))
    await asyncio.sleep(0.01)
    await asyncio.wait_for(m.aclose(), 1)
    assert [t for t in asyncio.all_tasks() if t.get_name().startswith("exit monitor")] == []


# ---- broadcast -----------------------------------------------------------------------


async def test_broadcast_fans_out_to_every_subscriber() -> None:
    b: Broadcast[int] = Broadcast()
    s1, s2 = b.subscribe(), b.subscribe()
    b.publish(1)
    b.publish(2)
    assert [await s1.get(), await s1.get()] == [1, 2]
    assert [await s2.get(), await s2.get()] == [1, 2]
    s1.close()
    assert b.subscribers == 1
    b.publish(3)
    assert await s2.get() == 3


async def test_broadcast_slow_subscriber_loses_oldest_and_never_blocks(
        caplog: pytest.LogCaptureFixture) -> None:
    b: Broadcast[int] = Broadcast(queue_size=3)
    slow, fast = b.subscribe(), b.subscribe()
    got: list[int] = []
    for i in range(10):
        b.publish(i)  # returns at once whatever the readers do
        got.append(await fast.get())  # type: ignore[arg-type]
    assert got == list(range(10))
    assert slow.dropped == 7
    assert [await slow.get() for _ in range(3)] == [7, 8, 9]
    assert "too slow" in caplog.text


async def test_broadcast_get_waits_for_the_next_event() -> None:
    b: Broadcast[str] = Broadcast()
    sub = b.subscribe()
    waiter = asyncio.create_task(sub.get())
    await asyncio.sleep(0.01)
    assert not waiter.done()
    b.publish("x")
    assert await asyncio.wait_for(waiter, 1) == "x"


async def test_broadcast_close_ends_every_stream() -> None:
    b: Broadcast[int] = Broadcast()
    sub = b.subscribe()
    b.publish(1)
    waiter = asyncio.create_task(_drain(sub))
    await asyncio.sleep(0.01)
    b.close()
    assert await asyncio.wait_for(waiter, 1) == [1]
    assert b.subscribers == 0


async def _drain(sub: object) -> list[int]:
    out = []
    while (item := await sub.get()) is not None:  # type: ignore[attr-defined]
        out.append(item)
    return out


async def test_broadcast_holds_events_for_the_next_subscriber_until_they_expire() -> None:
    clock = FakeClock()
    b: Broadcast[int] = Broadcast(queue_size=3, hold_for=300.0, clock=clock)
    b.publish(1)
    clock.now = 200.0
    b.publish(2)
    clock.now = 350.0  # 1 is older than 300 s now
    sub = b.subscribe()
    assert await sub.get() == 2
    assert b.discarded == 1
    sub.close()
    for i in range(5):  # more than a queue's worth while nobody listens
        b.publish(10 + i)
    late = b.subscribe()
    assert [await late.get() for _ in range(3)] == [12, 13, 14]
    assert b.discarded == 3
    second = b.subscribe()  # the backlog went to the first one only
    b.publish(99)
    assert await second.get() == 99
