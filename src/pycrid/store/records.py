"""Pod sandbox and container records: SQLite for durability, memory for every read.

A record is written before the side effects of the operation that creates it
(phase ``creating``: the intent), updated as it progresses, and deleted last
when the object is removed; so after a crash, a ``creating`` or ``removing``
record tells recovery exactly what to finish or undo. A container's state is
derived from its timestamps, as in containerd. The kubelet lists pods and
containers every second: List and Status never touch SQLite.

Records outlive the release that wrote them (docs/upgrades.md): a field this release
does not know (a newer one added it) is kept and written back with every rewrite of the
record, as protobuf keeps unknown fields (the config column is protobuf and keeps its
own). A record that cannot be read stops start-up, naming it: its container or pod may
be running, and a runtime that does not list it would let the kubelet start a second
copy beside it.
"""

from __future__ import annotations

import dataclasses
import json
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Generic, TypeVar

from cri_api.v1 import api_pb2 as pb

from pycrid.errors import FailedPrecondition
from pycrid.store.db import Database


class PodPhase(StrEnum):
    """Where a pod is in its life; stored as the string."""

    #: The record exists but the pod is not complete yet.
    CREATING = "creating"
    READY = "ready"
    NOTREADY = "notready"
    #: Its removal is under way.
    REMOVING = "removing"


class ContainerPhase(StrEnum):
    """Where a container's record is; whether it runs comes from its timestamps."""

    CREATING = "creating"
    CREATED = "created"
    REMOVING = "removing"


@dataclass(frozen=True)
class SandboxRecord:
    id: str
    name: str
    config: pb.PodSandboxConfig
    runtime_handler: str
    created_at: int
    phase: PodPhase = PodPhase.CREATING
    pid: int = 0
    netns: str = ""
    image_id: str = ""
    image_name: str = ""
    #: The pod's IPs from CNI, primary first (empty for host-network pods).
    ips: tuple[str, ...] = ()
    #: What holds the pod's namespaces: "pause" (a pause container, pid above) or
    #: "pinned" (bind mounts, no process: drop_infra_ctr).
    controller: str = "pause"

    def __post_init__(self) -> None:
        object.__setattr__(self, "phase", PodPhase(self.phase))  # a str from JSON

    @property
    def ready(self) -> bool:
        return self.phase is PodPhase.READY

    @property
    def creating(self) -> bool:
        return self.phase is PodPhase.CREATING


@dataclass(frozen=True)
class ContainerRecord:
    id: str
    sandbox_id: str
    name: str
    config: pb.ContainerConfig
    created_at: int
    image_id: str = ""
    #: ContainerStatus.image: the image's first tag, else the ImageSpec as given.
    image_name: str = ""
    #: ContainerStatus.image_ref: the first repo digest, else the image id.
    image_ref: str = ""
    phase: ContainerPhase = ContainerPhase.CREATING
    started_at: int = 0
    finished_at: int = 0
    exit_code: int = 0
    reason: str = ""
    message: str = ""
    unknown: bool = False
    pid: int = 0
    log_path: str = ""
    stop_signal: str = "SIGTERM"
    uid: int = 0
    gid: int = 0
    groups: tuple[int, ...] = ()
    #: The spec's linux.resources minus devices, plus ``oomScoreAdj`` (JSON): what
    #: ContainerStatus.resources reports; kept current by UpdateContainerResources.
    resources: dict[str, Any] = dataclasses.field(default_factory=dict, hash=False)
    #: Created from a checkpoint and not started yet: StartContainer restores its
    #: processes from CRIU's images instead of ``runc start`` (CRI-O's and containerd's
    #: ``Restore`` mark).
    restore: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "phase", ContainerPhase(self.phase))  # a str from JSON

    @property
    def creating(self) -> bool:
        return self.phase is ContainerPhase.CREATING

    @property
    def state(self) -> pb.ContainerState.ValueType:
        """The CRI ContainerState (CRI-TO-OCI.md §3)."""
        if self.unknown:
            return pb.CONTAINER_UNKNOWN
        if self.finished_at:
            return pb.CONTAINER_EXITED
        if self.started_at:
            return pb.CONTAINER_RUNNING
        return pb.CONTAINER_CREATED


R = TypeVar("R", SandboxRecord, ContainerRecord)


def _m1(c: sqlite3.Connection) -> None:
    c.execute("CREATE TABLE sandboxes (id TEXT PRIMARY KEY, record TEXT NOT NULL,"
              " config BLOB NOT NULL)")
    c.execute("CREATE TABLE containers (id TEXT PRIMARY KEY, record TEXT NOT NULL,"
              " config BLOB NOT NULL)")


#: The "pods" component's migrations (sandboxes and containers). A new record field is
#: an ``Additive`` migration (docs/upgrades.md), so that pycrid 0.1.0, which drops a
#: record with a field it does not know, refuses the state instead.
MIGRATIONS = [_m1]


class UnreadableRecords(FailedPrecondition):
    """Rows that cannot be read: start-up stops rather than leave their objects running
    unmanaged."""


def read_record(kind: type[R], record: str, config: Any) -> tuple[R, dict[str, Any]]:
    """A record from its JSON and parsed config, and the fields of it this release does
    not know (kept for its rewrites)."""
    fields = json.loads(record)
    if not isinstance(fields, dict):
        raise ValueError(f"a record is a JSON object, not {type(fields).__name__}")
    known = {f.name for f in dataclasses.fields(kind)} - {"config"}
    unknown = {k: v for k, v in fields.items() if k not in known}
    fields = {k: v for k, v in fields.items() if k in known}
    for key in ("groups", "ips"):  # tuples in records, lists in JSON
        if key in fields:
            fields[key] = tuple(fields[key])
    return kind(config=config, **fields), unknown


class RecordStore(Generic[R]):
    """One table of records keyed by id, mirrored in a dict."""

    def __init__(self, db: Database, table: str, kind: type[R],
                 parse: Callable[[bytes], Any]) -> None:
        db.migrate("pods", MIGRATIONS)
        self._db = db
        self._table = table
        #: The object, as messages name it.
        self._what = {"sandboxes": "pod sandbox", "containers": "container"}.get(table, table)
        self._items: dict[str, R] = {}
        #: Fields of each record that this release does not know, written back as found.
        self._unknown: dict[str, dict[str, Any]] = {}
        broken: list[str] = []
        with db.read() as c:
            rows = c.execute(f"SELECT id, record, config FROM {table}").fetchall()
        for row in rows:
            try:
                rec, unknown = read_record(kind, row["record"], parse(row["config"]))
            except Exception as e:
                broken.append(f"{self._what} {row['id']}: {type(e).__name__}: {e}")
                continue
            self._items[row["id"]] = rec
            if unknown:
                self._unknown[row["id"]] = unknown
        if broken:
            raise UnreadableRecords(_unreadable_message(db, table, broken))

    def get(self, object_id: str) -> R | None:
        return self._items.get(object_id)

    def all(self) -> list[R]:
        return list(self._items.values())

    def ids(self) -> list[str]:
        return list(self._items)

    def visible(self) -> list[R]:
        """Records whose object is complete or going away: not one still being created
        (critest: an object is invisible while its Run/Create hook runs)."""
        return [r for r in self._items.values() if not r.creating]

    def unknown_fields(self, object_id: str) -> dict[str, Any]:
        """The fields of a record that a newer release wrote and this one keeps."""
        return dict(self._unknown.get(object_id, {}))

    def put(self, rec: R) -> R:
        fields = {**self._unknown.get(rec.id, {}),
                  **{f.name: getattr(rec, f.name) for f in dataclasses.fields(rec)
                     if f.name != "config"}}
        # Changing an existing object (stopping it, recording its exit, removing it) may
        # use the database's reserve on a full disk; only a new object may not.
        with self._db.transaction(f"the record of {self._what} {rec.id}",
                                  frees=rec.id in self._items) as c:
            c.execute(f"INSERT INTO {self._table}(id, record, config) VALUES (?, ?, ?)"
                      " ON CONFLICT(id) DO UPDATE SET record = excluded.record,"
                      " config = excluded.config",
                      (rec.id, json.dumps(fields), rec.config.SerializeToString()))
        self._items[rec.id] = rec
        return rec

    def update(self, object_id: str, **changes: Any) -> R:
        rec = self._items[object_id]
        return self.put(dataclasses.replace(rec, **changes))

    def delete(self, object_id: str) -> None:
        with self._db.transaction(f"the removal of {self._what} {object_id}",
                                  frees=True) as c:
            c.execute(f"DELETE FROM {self._table} WHERE id = ?", (object_id,))
        self._items.pop(object_id, None)
        self._unknown.pop(object_id, None)


def _unreadable_message(db: Database, table: str, broken: list[str]) -> str:
    last = db.last_started()
    by = f" ({last} last started on it)" if last else ""
    return (f"metadata database {db.path}{by}: {len(broken)} record(s) of table {table} "
            f"cannot be read: {'; '.join(broken)}. Start-up stops: the objects may be "
            f"running, and a runtime that did not list them would have the kubelet start "
            f"second copies. Start a pycrid that reads them (the release that wrote them), "
            f"or give them up as docs/upgrades.md says (their processes are then stopped "
            f"and their traces removed at the next start)")


def sandbox_store(db: Database) -> RecordStore[SandboxRecord]:
    return RecordStore(db, "sandboxes", SandboxRecord, pb.PodSandboxConfig.FromString)


def container_store(db: Database) -> RecordStore[ContainerRecord]:
    return RecordStore(db, "containers", ContainerRecord, pb.ContainerConfig.FromString)


__all__ = ["ContainerPhase", "ContainerRecord", "PodPhase", "RecordStore", "SandboxRecord",
           "container_store", "sandbox_store"]
