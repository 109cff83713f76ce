"""Calls that outlive their client (operations.py) and the stall fail point (faults.py)."""

from __future__ import annotations

import asyncio
import importlib

import pytest

from pycrid import faults, operations
from pycrid.errors import Cancelled
from pycrid.operations import Operations, Undo, checkpoint, finish, interruptible
from pycrid.tasks import Owner


async def test_a_call_whose_caller_goes_away_completes() -> None:
    ops = Operations(Owner("ops"))
    done: list[str] = []

    async def call() -> str:
        await asyncio.sleep(0.05)
        checkpoint("step")  # no scope: not a cancellation point
        done.append("recorded")
        return "ok"

    caller = asyncio.create_task(ops.run("StopContainer", call()))
    await asyncio.sleep(0.01)
    caller.cancel()
    with pytest.raises(asyncio.CancelledError):
        await caller
    await asyncio.sleep(0.1)
    assert done == ["recorded"]
    await ops.aclose()


async def test_an_undoable_call_stops_at_its_next_step_and_undoes_all() -> None:
    """The caller's cancellation lands in the middle of a step: the step ends, the next
    checkpoint raises, and every undo step runs."""
    ops = Operations(Owner("ops"))
    log: list[str] = []
    in_step = asyncio.Event()

    async def slow_undo(what: str) -> None:
        await asyncio.sleep(0.05)
        log.append(f"undo {what}")

    async def call() -> None:
        async with Undo() as undo:
            undo.push_async_callback(slow_undo, "first")
            log.append("first")
            checkpoint("one")
            undo.push_async_callback(slow_undo, "second")
            in_step.set()
            await asyncio.sleep(0.05)  # the step the client's deadline lands in
            log.append("second")
            checkpoint("two")
            log.append("never")

    caller = asyncio.create_task(ops.run("RunPodSandbox", call(), undo_on_cancel=True))
    await in_step.wait()
    caller.cancel()
    with pytest.raises(asyncio.CancelledError):
        await caller
    for _ in range(100):
        if "undo first" in log:
            break
        await asyncio.sleep(0.01)
    assert log == ["first", "second", "undo second", "undo first"]
    await ops.aclose()



async def test_undo_steps_and_what_outlives_the_call_are_outside_its_scope() -> None:
    """Once the client has gone, a named step inside an undo step does not stop it, and a
    timer the call armed (a monitor's watch) does not inherit the request either."""
    ops = Operations(Owner("ops"))
    log: list[str] = []
    in_step = asyncio.Event()
    timer_ran = asyncio.Event()

    def later() -> None:
        checkpoint("in a timer")  # would raise Cancelled inside the call's scope
        log.append("timer")
        timer_ran.set()

    async def undo_step() -> None:
        checkpoint("in the undo")
        log.append("undone")

    async def call() -> None:
        loop = asyncio.get_running_loop()
        async with Undo() as undo:
            undo.push_async_callback(undo_step)
            operations.beyond_operation(loop.call_later, 0.1, later)
            in_step.set()
            await asyncio.sleep(0.05)
            checkpoint("next")

    caller = asyncio.create_task(ops.run("CreateContainer", call(), undo_on_cancel=True))
    await in_step.wait()
    caller.cancel()
    with pytest.raises(asyncio.CancelledError):
        await caller
    await asyncio.wait_for(timer_ran.wait(), 5)
    assert log == ["undone", "timer"]
    await ops.aclose()

async def test_undo_steps_are_not_cut_short() -> None:
    log: list[str] = []
    started = asyncio.Event()

    async def step(what: str) -> None:
        started.set()
        await asyncio.sleep(0.05)
        log.append(what)

    async def body() -> None:
        async with Undo() as undo:
            undo.push_async_callback(step, "lower")
            undo.push_async_callback(step, "upper")
            raise RuntimeError("failed")

    task = asyncio.create_task(body())
    await started.wait()
    task.cancel()  # lands inside "upper"
    with pytest.raises(asyncio.CancelledError):
        await task
    assert log == ["upper", "lower"]


async def test_finish_defers_a_cancellation_and_interruptible_obeys_the_scope() -> None:
    ended = asyncio.Event()

    async def work() -> int:
        await asyncio.sleep(0.05)
        ended.set()
        return 1

    task = asyncio.create_task(finish(work()))
    await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert ended.is_set()

    assert await interruptible(work()) == 1  # no scope: just awaited
    ops = Operations(Owner("ops"))
    stopped: list[str] = []

    async def slow_pull() -> None:
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            stopped.append("cleaned up")  # what a cancelled pull does
            raise

    async def call() -> None:
        await interruptible(slow_pull())

    caller = asyncio.create_task(ops.run("RunPodSandbox", call(), undo_on_cancel=True))
    await asyncio.sleep(0.05)
    caller.cancel()
    with pytest.raises(asyncio.CancelledError):
        await caller
    await asyncio.sleep(0.05)
    assert stopped == ["cleaned up"]
    await ops.aclose()


async def test_closing_asks_calls_to_stop_then_waits_for_them() -> None:
    ops = Operations(Owner("ops"), close_within=5)
    outcome: list[str] = []

    async def call() -> None:
        try:
            await asyncio.sleep(0.1)
            checkpoint("after")
            outcome.append("completed")
        except Cancelled:
            outcome.append("undone")
            raise

    caller = asyncio.create_task(ops.run("CreateContainer", call(), undo_on_cancel=True))
    await asyncio.sleep(0.01)
    await ops.aclose()
    assert outcome == ["undone"]
    with pytest.raises(Cancelled):
        await caller


async def test_stall_holds_a_step_until_the_client_has_gone(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYCRID_FAILPOINTS", "net.step:stall,thread.step:stall")
    importlib.reload(faults)
    try:
        ops = Operations(Owner("ops"))
        reached: list[str] = []

        async def call() -> None:
            reached.append("loop")
            await faults.step("net.step")
            reached.append("after loop step")

        caller = asyncio.create_task(ops.run("RunPodSandbox", call(), undo_on_cancel=True))
        await asyncio.sleep(0.1)
        assert reached == ["loop"]  # held there
        caller.cancel()
        with pytest.raises(asyncio.CancelledError):
            await caller
        await asyncio.sleep(0.05)
        assert reached == ["loop"]  # the checkpoint after the stall raised

        def in_thread() -> None:
            faults.failpoint("thread.step")

        async def threaded() -> None:
            await asyncio.to_thread(in_thread)  # the scope travels into the thread
            reached.append("after thread step")

        caller = asyncio.create_task(ops.run("CreateContainer", threaded(),
                                             undo_on_cancel=True))
        await asyncio.sleep(0.1)
        caller.cancel()
        with pytest.raises(asyncio.CancelledError):
            await caller
        await asyncio.sleep(0.1)
        assert "after thread step" not in reached
        await ops.aclose()
    finally:
        monkeypatch.delenv("PYCRID_FAILPOINTS")
        importlib.reload(faults)
        assert operations.current_scope() is None
