"""Pod and container building blocks: registrar, locks, DNS files, records, exits, netns."""

from __future__ import annotations

import asyncio
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
from cri_api.v1 import api_pb2 as pb
from hypothesis import given
from hypothesis import strategies as st

from pycrid.core.containers import labels_match, parse_signal
from pycrid.core.registrar import KeyedLocks, NameRegistrar, RWLock, resolve_prefix
from pycrid.errors import FailedPrecondition, InvalidArgument, NotFound, Unknown
from pycrid.network.netns import create_netns, is_pinned, remove_netns
from pycrid.runtime.conmon import _capped, _runc_message
from pycrid.runtime.exits import Exit, ExitWaiters, ExitWatcher, read_exit
from pycrid.sandbox.pause import own_oom_score_adj, resolv_conf
from pycrid.store.db import Database
from pycrid.store.pods import (
    ContainerRecord,
    SandboxRecord,
    container_store,
    sandbox_store,
)

TICK = 0.02


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


# ---- pause: resolv.conf and oom_score_adj --------------------------------------------


def test_resolv_conf_without_dns_copies_host_file(tmp_path: Path) -> None:
    host = tmp_path / "resolv.conf"
    host.write_bytes(b"nameserver 10.0.0.1\n# comment\n")
    assert resolv_conf(None, str(host)) == b"nameserver 10.0.0.1\n# comment\n"


def test_resolv_conf_without_dns_and_host_file_is_empty(tmp_path: Path) -> None:
    assert resolv_conf(None, str(tmp_path / "missing")) == b""


def test_resolv_conf_from_dns_config(tmp_path: Path) -> None:
    host = tmp_path / "resolv.conf"
    host.write_bytes(b"nameserver 9.9.9.9\n")
    dns = pb.DNSConfig(servers=["10.96.0.10", "8.8.8.8"],
                       searches=["ns.svc.cluster.local", "svc.cluster.local"],
                       options=["ndots:5", "edns0"])
    assert resolv_conf(dns, str(host)) == (
        b"search ns.svc.cluster.local svc.cluster.local\n"
        b"nameserver 10.96.0.10\n"
        b"nameserver 8.8.8.8\n"
        b"options ndots:5 edns0\n")


def test_resolv_conf_servers_only() -> None:
    assert resolv_conf(pb.DNSConfig(servers=["1.1.1.1"])) == b"nameserver 1.1.1.1\n"


def test_resolv_conf_empty_dns_config_is_empty(tmp_path: Path) -> None:
    host = tmp_path / "resolv.conf"
    host.write_bytes(b"nameserver 9.9.9.9\n")
    assert resolv_conf(pb.DNSConfig(), str(host)) == b""


def test_own_oom_score_adj_matches_proc() -> None:
    value = own_oom_score_adj()
    assert isinstance(value, int)
    assert value == int(Path("/proc/self/oom_score_adj").read_text())
    assert -1000 <= value <= 1000


# ---- containers: stop signals and label selectors ------------------------------------


@pytest.mark.parametrize(("given_", "name"), [
    ("SIGINT", "SIGINT"), ("INT", "SIGINT"), ("2", "SIGINT"), ("sigquit", "SIGQUIT"),
    (" SIGKILL ", "SIGKILL"), ("9", "SIGKILL"), ("", "SIGTERM"), ("  ", "SIGTERM"),
])
def test_parse_signal(given_: str, name: str) -> None:
    assert parse_signal(given_) == name


@pytest.mark.parametrize("bad", ["SIGNOPE", "NOPE", "0", "999", "-1", "SIG", "2x"])
def test_parse_signal_rejects(bad: str) -> None:
    with pytest.raises(InvalidArgument, match="invalid stop signal"):
        parse_signal(bad)


def test_labels_match() -> None:
    labels = {"app": "web", "tier": "front"}
    assert labels_match({}, labels)
    assert labels_match({"app": "web"}, labels)
    assert labels_match({"app": "web", "tier": "front"}, labels)
    assert not labels_match({"app": "db"}, labels)
    assert not labels_match({"missing": "x"}, labels)
    assert not labels_match({"app": "web", "tier": "back"}, labels)
    assert not labels_match({"app": ""}, labels)


# ---- store: sandbox and container records -------------------------------------------


def sandbox_rec(sid: str = "s1", **kw: object) -> SandboxRecord:
    cfg = pb.PodSandboxConfig(
        metadata=pb.PodSandboxMetadata(name="web", namespace="ns", uid="u1", attempt=1),
        hostname="web-host", labels={"app": "web"},
        dns_config=pb.DNSConfig(servers=["10.96.0.10"]))
    return SandboxRecord(id=sid, name="web_ns_u1_1", config=cfg, runtime_handler="runc",
                         created_at=1_700_000_000_000_000_000, **kw)  # type: ignore[arg-type]


def container_rec(cid: str = "c1", **kw: object) -> ContainerRecord:
    cfg = pb.ContainerConfig(metadata=pb.ContainerMetadata(name="app", attempt=2),
                             image=pb.ImageSpec(image="busybox:latest"),
                             command=["sh", "-c", "sleep 1"], envs=[pb.KeyValue(key="A",
                                                                                value="b")])
    return ContainerRecord(id=cid, sandbox_id="s1", name="app_web_ns_u1_2", config=cfg,
                           created_at=5, **kw)  # type: ignore[arg-type]


def test_sandbox_records_survive_reopen(tmp_path: Path) -> None:
    db = Database(str(tmp_path / "m.db"))
    store = sandbox_store(db)
    store.put(sandbox_rec("s1"))
    store.put(sandbox_rec("s2", phase="ready", pid=42, netns="/run/netns/x"))
    db.close()
    db = Database(str(tmp_path / "m.db"))
    again = sandbox_store(db)
    assert again.broken == []
    assert sorted(again.ids()) == ["s1", "s2"]
    assert again.get("s1") == sandbox_rec("s1")
    s2 = again.get("s2")
    assert s2 == sandbox_rec("s2", phase="ready", pid=42, netns="/run/netns/x")
    assert s2 is not None and s2.ready
    assert s2.config.dns_config.servers == ["10.96.0.10"]
    assert s2.config.labels["app"] == "web"


def test_container_record_round_trip_keeps_groups_tuple(tmp_path: Path) -> None:
    db = Database(str(tmp_path / "m.db"))
    rec = container_rec(uid=1000, gid=1000, groups=(10, 50000), started_at=7,
                        stop_signal="SIGINT", log_path="app/2.log")
    container_store(db).put(rec)
    db.close()
    loaded = container_store(Database(str(tmp_path / "m.db"))).get("c1")
    assert loaded == rec
    assert loaded is not None
    assert loaded.groups == (10, 50000)
    assert isinstance(loaded.groups, tuple)
    assert list(loaded.config.command) == ["sh", "-c", "sleep 1"]
    assert loaded.config.envs[0].value == "b"


def test_update_changes_memory_and_disk(tmp_path: Path) -> None:
    db = Database(str(tmp_path / "m.db"))
    store = container_store(db)
    store.put(container_rec())
    updated = store.update("c1", phase="created", pid=99)
    assert updated.phase == "created" and updated.pid == 99
    assert store.get("c1") == updated
    assert container_store(db).get("c1") == updated  # a fresh load sees the row


def test_update_of_unknown_id_raises(tmp_path: Path) -> None:
    store = container_store(Database(str(tmp_path / "m.db")))
    with pytest.raises(KeyError):
        store.update("nope", pid=1)


def test_delete_removes_from_memory_and_disk(tmp_path: Path) -> None:
    db = Database(str(tmp_path / "m.db"))
    store = container_store(db)
    store.put(container_rec("c1"))
    store.put(container_rec("c2"))
    store.delete("c1")
    store.delete("c1")  # twice is fine
    assert store.get("c1") is None
    assert store.ids() == ["c2"]
    assert [r.id for r in container_store(db).all()] == ["c2"]


def test_sandboxes_and_containers_are_separate_tables(tmp_path: Path) -> None:
    db = Database(str(tmp_path / "m.db"))
    sandbox_store(db).put(sandbox_rec("x"))
    assert container_store(db).ids() == []
    assert sandbox_store(db).ids() == ["x"]


def test_corrupt_row_is_reported_and_others_load(tmp_path: Path) -> None:
    db = Database(str(tmp_path / "m.db"))
    store = container_store(db)
    store.put(container_rec("good"))
    with db.transaction() as c:
        c.execute("INSERT INTO containers(id, record, config) VALUES (?, ?, ?)",
                  ("bad", "{not json", b""))
        c.execute("INSERT INTO containers(id, record, config) VALUES (?, ?, ?)",
                  ("odd", '{"no_such_field": 1}', b""))
    again = container_store(db)
    assert again.ids() == ["good"]
    assert again.get("good") == container_rec("good")
    broken = dict(again.broken)
    assert set(broken) == {"bad", "odd"}
    assert broken["bad"].startswith("JSONDecodeError")
    assert broken["odd"].startswith("TypeError")


def test_broken_is_a_copy(tmp_path: Path) -> None:
    db = Database(str(tmp_path / "m.db"))
    container_store(db)  # creates the tables
    with db.transaction() as c:
        c.execute("INSERT INTO containers VALUES ('bad', 'x', x'')")
    store = container_store(db)
    store.broken.clear()
    assert len(store.broken) == 1


@pytest.mark.parametrize(("kw", "state"), [
    ({}, pb.CONTAINER_CREATED),
    ({"started_at": 10}, pb.CONTAINER_RUNNING),
    ({"started_at": 10, "finished_at": 20}, pb.CONTAINER_EXITED),
    ({"finished_at": 20}, pb.CONTAINER_EXITED),  # failed start: exited without starting
    ({"started_at": 10, "unknown": True}, pb.CONTAINER_UNKNOWN),
    ({"started_at": 10, "finished_at": 20, "unknown": True}, pb.CONTAINER_UNKNOWN),
])
def test_container_state_derivation(kw: dict[str, Any], state: int) -> None:
    assert container_rec(**kw).state == state


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


async def test_exit_watcher_forget_allows_new_exit(tmp_path: Path) -> None:
    w, seen, queue = await watched(tmp_path)
    try:
        path = tmp_path / "exits" / "c1"
        path.write_text("3")
        await asyncio.wait_for(queue.get(), 1)
        path.unlink()
        path.write_text("4")
        await asyncio.sleep(TICK)
        assert len(seen) == 1  # not forgotten: still the first exit
        w.forget("c1")
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


# ---- conmon helpers ------------------------------------------------------------------


def test_runc_message_extracts_logrus_msg() -> None:
    raw = (b'time="2024-01-01T00:00:00Z" level=error '
           b'msg="container \\"x\\" does not exist"\n')
    assert _runc_message(raw) == 'container "x" does not exist'


def test_runc_message_joins_lines_and_keeps_plain_text() -> None:
    raw = b'time="t" level=warning msg="first"\nplain failure\n\n'
    assert _runc_message(raw) == "first; plain failure"


def test_runc_message_of_empty_output() -> None:
    assert _runc_message(b"") == ""


async def test_capped_keeps_first_cap_bytes_and_drains() -> None:
    reader = asyncio.StreamReader()
    data = bytes(range(256)) * 1000  # 256000 bytes, several 64 KiB chunks
    reader.feed_data(data)
    reader.feed_eof()
    assert await _capped(reader, 1000) == data[:1000]
    assert reader.at_eof()
    assert await reader.read() == b""


async def test_capped_short_stream_is_whole() -> None:
    reader = asyncio.StreamReader()
    reader.feed_data(b"hello")
    reader.feed_eof()
    assert await _capped(reader, 1000) == b"hello"


async def test_capped_drains_a_writer_that_keeps_writing() -> None:
    reader = asyncio.StreamReader()

    async def produce() -> None:
        for _ in range(10):
            reader.feed_data(b"x" * 70000)
            await asyncio.sleep(0)
        reader.feed_eof()

    producer = asyncio.create_task(produce())
    got = await asyncio.wait_for(_capped(reader, 100_001), 1)
    await producer
    assert got == b"x" * 100_001
    assert reader.at_eof()


# ---- network namespaces --------------------------------------------------------------


def lo_line(path: str) -> str:
    out = subprocess.run(["nsenter", f"--net={path}", "ip", "-o", "link", "show", "lo"],
                         capture_output=True, text=True, check=True)
    return out.stdout


def mounts_mentioning(path: Path) -> list[str]:
    return [line for line in Path("/proc/self/mountinfo").read_text().splitlines()
            if str(path) in line]


@pytest.fixture
def netns_dir(tmp_path: Path):  # type: ignore[no-untyped-def]
    d = tmp_path / "netns"
    yield d
    for p in d.glob("*") if d.exists() else []:
        remove_netns(str(p))
    assert mounts_mentioning(tmp_path) == []


def test_create_netns_pins_with_lo_up(netns_dir: Path) -> None:
    path = str(netns_dir / "pod1")
    create_netns(path)
    assert is_pinned(path)
    line = lo_line(path)
    assert "lo:" in line
    assert "UP" in line.split(">", 1)[0]  # flags such as <LOOPBACK,UP,LOWER_UP>
    # A different namespace from ours.
    assert os.stat(path).st_ino != os.stat("/proc/self/ns/net").st_ino


def test_remove_netns_unpins_and_deletes(netns_dir: Path, tmp_path: Path) -> None:
    path = str(netns_dir / "pod1")
    create_netns(path)
    remove_netns(path)
    assert not is_pinned(path)
    assert not os.path.exists(path)
    assert mounts_mentioning(tmp_path) == []
    remove_netns(path)  # a second remove is a no-op


def test_remove_netns_of_plain_file_deletes_it(tmp_path: Path) -> None:
    path = tmp_path / "plain"
    path.write_text("")
    assert not is_pinned(str(path))
    remove_netns(str(path))
    assert not path.exists()


def test_create_netns_on_existing_path_fails_and_keeps_it(netns_dir: Path) -> None:
    path = str(netns_dir / "pod1")
    create_netns(path)
    ino = os.stat(path).st_ino
    with pytest.raises(FileExistsError):
        create_netns(path)
    assert is_pinned(path)
    assert os.stat(path).st_ino == ino


def test_two_netns_are_distinct(netns_dir: Path) -> None:
    a, b = str(netns_dir / "a"), str(netns_dir / "b")
    create_netns(a)
    create_netns(b)
    assert os.stat(a).st_ino != os.stat(b).st_ino
    remove_netns(a)
    assert not is_pinned(a)
    assert is_pinned(b)
