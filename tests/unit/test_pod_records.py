"""Pod sandbox and container records (store/records.py)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
from cri_api.v1 import api_pb2 as pb

from pycrid.store.db import Database
from pycrid.store.records import (
    MIGRATIONS,
    ContainerRecord,
    SandboxRecord,
    UnreadableRecords,
    container_store,
    sandbox_store,
)

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


def test_an_unreadable_record_stops_start_up_naming_it(tmp_path: Path) -> None:
    """A row that cannot be read is never skipped: its container may be running."""
    db = Database(str(tmp_path / "m.db"))
    store = container_store(db)
    store.put(container_rec("good"))
    with db.transaction() as c:
        c.execute("INSERT INTO containers(id, record, config) VALUES (?, ?, ?)",
                  ("bad", "{not json", b""))
        c.execute("INSERT INTO containers(id, record, config) VALUES (?, ?, ?)",
                  ("odd", '{"id": "odd", "sandbox_id": "s1", "name": "n", "created_at": 1,'
                          ' "phase": "paused"}', b""))
        c.execute("INSERT INTO containers(id, record, config) VALUES (?, ?, ?)",
                  ("list", "[1]", b""))
    db.record_start("9.9.9", "ab" * 20)
    with pytest.raises(UnreadableRecords) as e:
        container_store(db)
    text = str(e.value)
    assert "3 record(s) of table containers cannot be read" in text
    assert "container bad: JSONDecodeError" in text
    assert "container odd: ValueError: 'paused' is not a valid ContainerPhase" in text
    assert "container list: ValueError" in text
    assert "good" not in text
    assert f"pycrid 9.9.9 (commit {'ab' * 6}) last started on it" in text
    assert "docs/upgrades.md" in text
    # Gone, it lets the store load (what giving one up does: docs/upgrades.md).
    with db.transaction() as c:
        c.execute("DELETE FROM containers WHERE id != 'good'")
    assert container_store(db).ids() == ["good"]


def test_fields_a_newer_release_wrote_are_kept_through_rewrites(tmp_path: Path) -> None:
    """pycrid 0.1.0 dropped a record with a field it did not know (455bd3d met the
    checkpoint work's ``restore``); a record now keeps it, and every rewrite writes it
    back as it was found."""
    db = Database(str(tmp_path / "m.db"))
    store = container_store(db)
    store.put(container_rec("c1"))
    with db.transaction() as c:
        (raw,) = c.execute("SELECT record FROM containers WHERE id = 'c1'").fetchone()
        fields = json.loads(raw)
        fields.update(from_the_future={"nested": [1, 2]}, seccomp_notify=True)
        c.execute("UPDATE containers SET record = ? WHERE id = 'c1'", (json.dumps(fields),))
    again = container_store(db)
    assert again.get("c1") == container_rec("c1")
    assert again.unknown_fields("c1") == {"from_the_future": {"nested": [1, 2]},
                                          "seccomp_notify": True}
    again.update("c1", started_at=7, pid=42)
    with db.read() as c:
        (raw,) = c.execute("SELECT record FROM containers WHERE id = 'c1'").fetchone()
    written = json.loads(raw)
    assert written["from_the_future"] == {"nested": [1, 2]}
    assert written["seccomp_notify"] is True
    assert (written["started_at"], written["pid"]) == (7, 42)
    third = container_store(db)
    assert third.unknown_fields("c1") == again.unknown_fields("c1")
    assert third.get("c1") == container_rec("c1", started_at=7, pid=42)
    third.delete("c1")
    assert third.unknown_fields("c1") == {}


def test_unknown_fields_of_a_pod_are_kept_too(tmp_path: Path) -> None:
    db = Database(str(tmp_path / "m.db"))
    sandbox_store(db).put(sandbox_rec("s1"))
    with db.transaction() as c:
        (raw,) = c.execute("SELECT record FROM sandboxes WHERE id = 's1'").fetchone()
        c.execute("UPDATE sandboxes SET record = ? WHERE id = 's1'",
                  (json.dumps({**json.loads(raw), "sandboxer": "vm"}),))
    store = sandbox_store(db)
    store.update("s1", phase="ready")
    assert sandbox_store(db).unknown_fields("s1") == {"sandboxer": "vm"}


def test_the_config_keeps_fields_a_newer_cri_adds() -> None:
    """The config column is protobuf, which keeps unknown fields through a parse and a
    serialization (a newer CRI's field in a record written by a newer release)."""
    cfg = pb.ContainerConfig(metadata=pb.ContainerMetadata(name="a"))
    extra = cfg.SerializeToString() + bytes([0xF8, 0xFF, 0x03, 0x2A])  # field 8191 = 42
    again = pb.ContainerConfig.FromString(extra)
    assert again.metadata.name == "a"
    assert again.SerializeToString() == extra


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


#: The record fields at each schema version of "pods" (docs/upgrades.md): a field added
#: without an Additive migration would let 0.1.0 drop every record carrying it (as
#: 455bd3d dropped 43375f6's over ``restore``) instead of refusing the state.
RECORD_FIELDS = {
    1: ({"id", "name", "config", "runtime_handler", "created_at", "phase", "pid", "netns",
         "image_id", "image_name", "ips", "controller"},
        {"id", "sandbox_id", "name", "config", "created_at", "image_id", "image_name",
         "image_ref", "phase", "started_at", "finished_at", "exit_code", "reason", "message",
         "unknown", "pid", "log_path", "stop_signal", "uid", "gid", "groups", "resources",
         "restore"}),
}


def test_a_new_record_field_raises_the_schema_version() -> None:
    version = len(MIGRATIONS)
    assert version in RECORD_FIELDS, (
        f"pods schema version {version}: list its record fields in RECORD_FIELDS")
    pod_fields, container_fields = RECORD_FIELDS[version]
    assert {f.name for f in dataclasses.fields(SandboxRecord)} == pod_fields, (
        "a pod record field changed: add an Additive migration to store/records.py "
        "MIGRATIONS (docs/upgrades.md) and list the fields of the new version here")
    assert {f.name for f in dataclasses.fields(ContainerRecord)} == container_fields, (
        "a container record field changed: add an Additive migration to store/records.py "
        "MIGRATIONS (docs/upgrades.md) and list the fields of the new version here")
