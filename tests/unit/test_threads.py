"""The loop -> thread byte pipe and the thread calls that finish before a cancellation goes on."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from pycrid.images.threads import ChunkPipe, PipeBroken, run_settled


async def test_pipe_back_pressure_batches_and_end() -> None:
    pipe = ChunkPipe(asyncio.get_running_loop(), limit=10)
    assert await pipe.put(b"12345")
    assert await pipe.put(b"67890")
    third = asyncio.create_task(pipe.put(b"abc"))  # over the limit: waits for the reader
    await asyncio.sleep(0.05)
    assert not third.done()
    # The reader takes everything buffered at once, which lets the writer go on.
    assert await asyncio.to_thread(pipe.read) == b"1234567890"
    assert await asyncio.wait_for(third, 5)
    pipe.close()
    assert await asyncio.to_thread(pipe.read) == b"abc"
    assert await asyncio.to_thread(pipe.read) == b""


async def test_pipe_failure_reaches_a_waiting_reader() -> None:
    pipe = ChunkPipe(asyncio.get_running_loop())
    reader = asyncio.create_task(asyncio.to_thread(pipe.read))
    await asyncio.sleep(0.05)
    pipe.fail(ConnectionResetError("registry went away"))
    with pytest.raises(PipeBroken, match="registry went away"):
        await asyncio.wait_for(reader, 5)
    # After the end too: a reader still working on the tail is stopped.
    pipe = ChunkPipe(asyncio.get_running_loop())
    await pipe.put(b"x")
    pipe.close()
    pipe.fail(asyncio.CancelledError())
    with pytest.raises(PipeBroken):
        pipe.read()


async def test_pipe_reader_gives_up_its_turn_only_while_it_waits() -> None:
    # Partial pulls rebuild one layer at a time (a lock, "the turn"); a worker waiting
    # for fetched bytes lets another one work meanwhile, and has the turn again on return.
    pipe = ChunkPipe(asyncio.get_running_loop())
    turn = threading.Lock()
    held_on_return: list[bool] = []

    def reader() -> bytes:
        with turn:
            data = pipe.read(turn)
            held_on_return.append(turn.locked())
            return data

    task = asyncio.create_task(asyncio.to_thread(reader))
    await asyncio.sleep(0.05)
    assert await asyncio.to_thread(turn.acquire, True, 5)  # free while the reader waits
    assert await pipe.put(b"data")
    await asyncio.sleep(0.05)
    assert not task.done()  # it has the bytes, but not the turn back yet
    turn.release()
    assert await asyncio.wait_for(task, 5) == b"data" and held_on_return == [True]
    # With bytes there already, the turn is never given up.
    assert await pipe.put(b"more")
    with turn:
        assert pipe.read(turn) == b"more"
        assert turn.locked()


async def test_pipe_stopped_reader_releases_a_waiting_writer() -> None:
    pipe = ChunkPipe(asyncio.get_running_loop(), limit=1)
    assert await pipe.put(b"a")
    writer = asyncio.create_task(pipe.put(b"b"))
    await asyncio.sleep(0.05)
    await asyncio.to_thread(pipe.stop)
    assert await asyncio.wait_for(writer, 5) is False
    assert await pipe.put(b"c") is False


async def test_run_settled_waits_for_the_thread_when_cancelled() -> None:
    release = threading.Event()
    finished: list[float] = []

    def slow() -> None:
        release.wait(0.3)  # stops early once asked to
        finished.append(time.monotonic())

    task = asyncio.create_task(run_settled(None, slow, on_cancel=release.set))
    await asyncio.sleep(0.05)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    # By the time the cancellation is seen, the thread has ended (early, asked to).
    assert finished and release.is_set()
