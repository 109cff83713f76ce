"""Names, id prefixes and per-object read/write locks (core/registrar.py)."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pycrid.core.registrar import KeyedLocks, NameRegistrar, RWLock, resolve_prefix
from pycrid.errors import FailedPrecondition, InvalidArgument, NotFound, Unknown


async def settle() -> None:
    """Let every ready task run until it blocks."""
    for _ in range(5):
        await asyncio.sleep(0)



# ---- NameRegistrar / resolve_prefix ---------------------------------------------------


def test_reserve_same_key_twice_is_fine() -> None:
    r = NameRegistrar("sandbox")
    r.reserve("web_ns_u1_0", "id-a")
    r.reserve("web_ns_u1_0", "id-a")


def test_reserve_for_other_key_names_name_and_holder() -> None:
    r = NameRegistrar("sandbox")
    r.reserve("web_ns_u1_0", "id-a")
    with pytest.raises(FailedPrecondition) as e:
        r.reserve("web_ns_u1_0", "id-b")
    assert "web_ns_u1_0" in str(e.value)
    assert "id-a" in str(e.value)
    assert "id-b" not in str(e.value)


def test_release_frees_the_name() -> None:
    r = NameRegistrar("container")
    r.reserve("n", "id-a")
    r.release("n")
    r.reserve("n", "id-b")
    with pytest.raises(FailedPrecondition, match="id-b"):
        r.reserve("n", "id-a")


def test_release_of_unknown_name_is_a_noop() -> None:
    NameRegistrar("container").release("never-reserved")


IDS = ["abc123", "abd456", "ffff00"]


def test_unique_prefix_resolves() -> None:
    assert resolve_prefix(IDS, "abc", "container") == "abc123"
    assert resolve_prefix(IDS, "f", "container") == "ffff00"
    assert resolve_prefix(IDS, "abd456", "container") == "abd456"


def test_ambiguous_prefix_is_unknown() -> None:
    with pytest.raises(Unknown, match="multiple"):
        resolve_prefix(IDS, "ab", "container")


def test_missing_prefix_is_not_found() -> None:
    with pytest.raises(NotFound, match="'zz'"):
        resolve_prefix(IDS, "zz", "container")


def test_empty_prefix_is_invalid() -> None:
    with pytest.raises(InvalidArgument):
        resolve_prefix(IDS, "", "container")


@given(st.lists(st.text("0123456789abcdef", min_size=8, max_size=8), min_size=1, unique=True),
       st.data())
def test_full_id_always_resolves_to_itself(ids: list[str], data: st.DataObject) -> None:
    chosen = data.draw(st.sampled_from(ids))
    assert resolve_prefix(ids, chosen, "pod") == chosen


# ---- RWLock / KeyedLocks --------------------------------------------------------------


async def test_readers_run_concurrently() -> None:
    lock = RWLock()
    inside = 0
    both_inside = asyncio.Event()
    release = asyncio.Event()

    async def reader() -> None:
        nonlocal inside
        async with lock.read():
            inside += 1
            if inside == 2:
                both_inside.set()
            await release.wait()

    tasks = [asyncio.create_task(reader()) for _ in range(2)]
    await asyncio.wait_for(both_inside.wait(), 1)
    release.set()
    await asyncio.gather(*tasks)


async def test_writer_excludes_readers() -> None:
    lock = RWLock()
    release = asyncio.Event()
    got_read = asyncio.Event()

    async def writer() -> None:
        async with lock.write():
            await release.wait()

    async def reader() -> None:
        async with lock.read():
            got_read.set()

    w = asyncio.create_task(writer())
    await settle()
    r = asyncio.create_task(reader())
    await settle()
    assert not got_read.is_set()
    release.set()
    await asyncio.wait_for(asyncio.gather(w, r), 1)
    assert got_read.is_set()


async def test_writer_excludes_other_writers() -> None:
    lock = RWLock()
    release = asyncio.Event()
    order: list[str] = []

    async def writer(name: str, wait: bool) -> None:
        async with lock.write():
            order.append(f"{name} in")
            if wait:
                await release.wait()
            order.append(f"{name} out")

    first = asyncio.create_task(writer("a", True))
    await settle()
    second = asyncio.create_task(writer("b", False))
    await settle()
    assert order == ["a in"]
    release.set()
    await asyncio.wait_for(asyncio.gather(first, second), 1)
    assert order == ["a in", "a out", "b in", "b out"]


async def test_reader_excludes_writer() -> None:
    lock = RWLock()
    release = asyncio.Event()
    wrote = asyncio.Event()

    async def reader() -> None:
        async with lock.read():
            await release.wait()

    async def writer() -> None:
        async with lock.write():
            wrote.set()

    r = asyncio.create_task(reader())
    await settle()
    w = asyncio.create_task(writer())
    await settle()
    assert not wrote.is_set()
    release.set()
    await asyncio.wait_for(asyncio.gather(r, w), 1)
    assert wrote.is_set()


async def test_waiting_writer_blocks_new_readers() -> None:
    lock = RWLock()
    release_first = asyncio.Event()
    release_writer = asyncio.Event()
    order: list[str] = []

    async def first_reader() -> None:
        async with lock.read():
            order.append("r1 in")
            await release_first.wait()
        order.append("r1 out")

    async def writer() -> None:
        async with lock.write():
            order.append("w in")
            await release_writer.wait()
        order.append("w out")

    async def late_reader() -> None:
        async with lock.read():
            order.append("r2 in")

    r1 = asyncio.create_task(first_reader())
    await settle()
    w = asyncio.create_task(writer())
    await settle()
    r2 = asyncio.create_task(late_reader())
    await settle()
    # r1 still holds the lock; r2 must queue behind the waiting writer.
    assert order == ["r1 in"]
    release_first.set()
    await settle()
    assert order == ["r1 in", "r1 out", "w in"]
    release_writer.set()
    await asyncio.wait_for(asyncio.gather(r1, w, r2), 1)
    assert order == ["r1 in", "r1 out", "w in", "w out", "r2 in"]


async def test_lock_is_released_when_body_raises() -> None:
    lock = RWLock()
    with pytest.raises(RuntimeError):
        async with lock.write():
            raise RuntimeError("boom")
    async with asyncio.timeout(1), lock.read():
        pass
    async with asyncio.timeout(1), lock.write():
        pass


async def test_cancelled_waiting_writer_lets_held_back_readers_in() -> None:
    lock = RWLock()
    release_first = asyncio.Event()
    second_in = asyncio.Event()

    async def first_reader() -> None:
        async with lock.read():
            await release_first.wait()

    async def writer() -> None:
        async with lock.write():
            pass

    async def late_reader() -> None:
        async with lock.read():
            second_in.set()

    r1 = asyncio.create_task(first_reader())
    await settle()
    w = asyncio.create_task(writer())
    await settle()
    r2 = asyncio.create_task(late_reader())
    await settle()
    w.cancel()
    await settle()
    try:
        # No writer is waiting any more, and r1 is a reader: r2 may share the lock.
        await asyncio.wait_for(second_in.wait(), 0.05)
    finally:
        release_first.set()
        await asyncio.wait_for(asyncio.gather(r1, r2, w, return_exceptions=True), 1)


def test_keyed_locks_one_lock_per_key() -> None:
    locks = KeyedLocks()
    assert locks("a") is locks("a")
    assert locks("a") is not locks("b")
    first = locks("a")
    locks.drop("a")
    assert locks("a") is not first
    locks.drop("never")


async def test_keyed_locks_other_keys_run_in_parallel() -> None:
    locks = KeyedLocks()
    release = asyncio.Event()

    async def hold() -> None:
        async with locks("a").write():
            await release.wait()

    holder = asyncio.create_task(hold())
    await settle()
    async with asyncio.timeout(1), locks("b").write():
        pass
    release.set()
    await holder
