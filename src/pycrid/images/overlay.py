"""The overlayfs snapshotter: one directory per snapshot, records in SQLite.

Layout: ``<root>/snapshots/<n>/fs`` holds a snapshot's own files and
``<root>/snapshots/<n>/work`` is overlayfs's work dir for writable ones. ``n``
is a small integer from SQLite, which keeps the lowerdir option of deep images
short (every mount option must fit in one page).

Crash safety: a record is written before its directory is made, and a
directory is renamed aside before its record is deleted; ``cleanup()`` at
start-up removes records without a directory, directories without a record,
and temporary unpack snapshots, so no order of crash leaves a half-made
snapshot in use.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import threading
import time

from pycrid.errors import AlreadyExists, FailedPrecondition, NotFound
from pycrid.images.snapshots import TEMP_PREFIX, Info, Kind, Mount, Snapshotter, Usage
from pycrid.store.db import Database


def _m1(c: sqlite3.Connection) -> None:
    c.execute(
        "CREATE TABLE overlay_snapshots ("
        " id INTEGER PRIMARY KEY AUTOINCREMENT, key TEXT NOT NULL UNIQUE,"
        " parent TEXT, kind TEXT NOT NULL, created_at REAL NOT NULL, labels TEXT NOT NULL)"
    )
    c.execute("CREATE INDEX overlay_snapshots_parent ON overlay_snapshots(parent)")


class OverlaySnapshotter(Snapshotter):
    name = "overlayfs"

    def __init__(self, root: str, db: Database) -> None:
        self.root = root
        self._dir = os.path.join(root, "snapshots")
        os.makedirs(self._dir, mode=0o700, exist_ok=True)
        self._db = db
        self._lock = threading.RLock()
        db.migrate("snapshots.overlayfs", [_m1])

    # ---- records -------------------------------------------------------------------------

    def _row(self, key: str) -> sqlite3.Row:
        with self._db.read() as c:
            row = c.execute("SELECT * FROM overlay_snapshots WHERE key = ?", (key,)).fetchone()
        if row is None:
            raise NotFound(f"snapshot {key} not found")
        return row  # type: ignore[no-any-return]

    @staticmethod
    def _info(row: sqlite3.Row) -> Info:
        return Info(key=row["key"], parent=row["parent"], kind=Kind(row["kind"]),
                    created_at=row["created_at"], labels=json.loads(row["labels"]))

    def _path(self, sid: int, *parts: str) -> str:
        return os.path.join(self._dir, str(sid), *parts)

    def stat(self, key: str) -> Info:
        return self._info(self._row(key))

    def walk(self, prefix: str = "") -> list[Info]:
        where, args = "", []
        if prefix:  # a key range the unique index answers (UTF-8 keeps code point order)
            where = " WHERE key >= ? AND key < ?"
            args = [prefix, prefix[:-1] + chr(ord(prefix[-1]) + 1)]
        with self._db.read() as c:
            rows = c.execute(f"SELECT * FROM overlay_snapshots{where} ORDER BY id",
                             args).fetchall()
        return [self._info(r) for r in rows]

    # ---- lifecycle -----------------------------------------------------------------------

    def _create(self, key: str, parent: str | None, kind: Kind,
                labels: dict[str, str] | None) -> list[Mount]:
        with self._lock:
            if parent is not None:
                p = self._row(parent)
                if p["kind"] != Kind.COMMITTED.value:
                    raise FailedPrecondition(f"parent {parent} of {key} is not committed")
            try:
                with self._db.transaction(f"the record of snapshot {key}") as c:
                    cur = c.execute(
                        "INSERT INTO overlay_snapshots(key, parent, kind, created_at, labels)"
                        " VALUES (?, ?, ?, ?, ?)",
                        (key, parent, kind.value, time.time(), json.dumps(labels or {})))
                    sid = int(cur.lastrowid or 0)
            except sqlite3.IntegrityError:
                raise AlreadyExists(f"snapshot {key} already exists") from None
            try:
                os.mkdir(self._path(sid), 0o700)
                os.mkdir(self._path(sid, "fs"), 0o755)
                if kind is Kind.ACTIVE:
                    os.mkdir(self._path(sid, "work"), 0o700)
            except BaseException:
                self._forget(key, sid)
                raise
            return self.mounts(key)

    def prepare(self, key: str, parent: str | None,
                labels: dict[str, str] | None = None) -> list[Mount]:
        return self._create(key, parent, Kind.ACTIVE, labels)

    def view(self, key: str, parent: str | None,
             labels: dict[str, str] | None = None) -> list[Mount]:
        return self._create(key, parent, Kind.VIEW, labels)

    def _chain(self, key: str | None) -> list[int]:
        """Snapshot ids from ``key`` down to the bottom layer."""
        ids = []
        while key is not None:
            row = self._row(key)
            ids.append(int(row["id"]))
            key = row["parent"]
        return ids

    def mounts(self, key: str) -> list[Mount]:
        row = self._row(key)
        kind, sid = Kind(row["kind"]), int(row["id"])
        lowers = [self._path(i, "fs") for i in self._chain(row["parent"])]
        if kind is Kind.ACTIVE:
            if not lowers:
                return [Mount("bind", self._path(sid, "fs"), ("rbind", "rw"))]
            return [Mount("overlay", "overlay", (
                "index=off", "lowerdir=" + ":".join(lowers),
                "upperdir=" + self._path(sid, "fs"), "workdir=" + self._path(sid, "work")))]
        if kind is Kind.VIEW:
            if len(lowers) == 1:
                return [Mount("bind", lowers[0], ("rbind", "ro"))]
            if not lowers:
                return [Mount("bind", self._path(sid, "fs"), ("rbind", "ro"))]
            return [Mount("overlay", "overlay", ("index=off", "lowerdir=" + ":".join(lowers)))]
        return [Mount("bind", self._path(sid, "fs"), ("rbind", "ro"))]

    def upper_dir(self, key: str) -> str:
        return self._path(int(self._row(key)["id"]), "fs")

    def commit(self, name: str, key: str, labels: dict[str, str] | None = None, *,
               parent: str | None = None) -> None:
        with self._lock:
            row = self._row(key)
            if row["kind"] != Kind.ACTIVE.value:
                raise FailedPrecondition(f"snapshot {key} is not active")
            if parent is not None:
                # A layer's directory never depends on its parent (only mounts do), so
                # one unpacked on its own can sit on a parent chosen now.
                if row["parent"] is not None:
                    raise FailedPrecondition(f"snapshot {key} already has parent "
                                             f"{row['parent']}")
                if self._row(parent)["kind"] != Kind.COMMITTED.value:
                    raise FailedPrecondition(f"parent {parent} of {name} is not committed")
            try:
                with self._db.transaction(f"the record of snapshot {name}") as c:
                    c.execute(
                        "UPDATE overlay_snapshots SET key = ?, kind = ?, labels = ?,"
                        " parent = COALESCE(?, parent) WHERE id = ?",
                        (name, Kind.COMMITTED.value,
                         json.dumps(labels if labels is not None else json.loads(row["labels"])),
                         parent, row["id"]))
            except sqlite3.IntegrityError:
                raise AlreadyExists(f"snapshot {name} already exists") from None
            shutil.rmtree(self._path(int(row["id"]), "work"), ignore_errors=True)

    def remove(self, key: str) -> None:
        with self._lock:
            row = self._row(key)
            with self._db.read() as c:
                child = c.execute("SELECT key FROM overlay_snapshots WHERE parent = ? LIMIT 1",
                                  (key,)).fetchone()
            if child is not None:
                raise FailedPrecondition(f"snapshot {key} has a child ({child['key']})")
            self._forget(key, int(row["id"]))

    def _forget(self, key: str, sid: int) -> None:
        """Rename the directory aside, delete the record, then delete the directory."""
        path = self._path(sid)
        doomed = os.path.join(self._dir, f"rm-{sid}")
        if os.path.exists(path):
            os.rename(path, doomed)
        with self._db.transaction(f"the removal of snapshot {key}", frees=True) as c:
            c.execute("DELETE FROM overlay_snapshots WHERE key = ?", (key,))
        shutil.rmtree(doomed, ignore_errors=True)

    # ---- usage ---------------------------------------------------------------------------

    @staticmethod
    def _du(path: str) -> Usage:
        seen: set[tuple[int, int]] = set()
        size = inodes = 0
        for dirpath, dirnames, filenames in os.walk(path):
            for name in dirnames + filenames:
                try:
                    st = os.lstat(os.path.join(dirpath, name))
                except FileNotFoundError:
                    continue
                if st.st_nlink > 1:
                    if (st.st_dev, st.st_ino) in seen:
                        continue
                    seen.add((st.st_dev, st.st_ino))
                size += st.st_blocks * 512
                inodes += 1
        return Usage(size, inodes)

    def usage(self, key: str) -> Usage:
        return self._du(self._path(int(self._row(key)["id"]), "fs"))

    def fs_usage(self) -> Usage:
        return self._du(self._dir)

    # ---- start-up ------------------------------------------------------------------------

    def cleanup(self) -> list[str]:
        removed: list[str] = []
        with self._lock:
            infos = {r["id"]: r for r in self._rows()}
            for sid, row in sorted(infos.items(), reverse=True):
                try:
                    self._row(row["key"])
                except NotFound:
                    continue  # went with a broken parent already
                if not os.path.isdir(self._path(sid, "fs")):
                    why = "directory missing"
                elif row["key"].startswith(TEMP_PREFIX):
                    why = "unpack scratch space"
                else:
                    continue
                removed += [f"snapshot {k} ({why})" for k in self._forget_all(row["key"])]
            known = {str(r["id"]) for r in self._rows()}
            for name in os.listdir(self._dir):
                if name not in known:
                    shutil.rmtree(os.path.join(self._dir, name), ignore_errors=True)
                    removed.append(f"snapshot directory {name} (no record)")
        return removed

    def _forget_all(self, key: str) -> list[str]:
        """Remove ``key`` and, first, anything built on it (a broken parent breaks children)."""
        with self._db.read() as c:
            kids = [r["key"] for r in c.execute(
                "SELECT key FROM overlay_snapshots WHERE parent = ?", (key,))]
        gone = []
        for kid in kids:
            gone += self._forget_all(kid)
        self._forget(key, int(self._row(key)["id"]))
        return [*gone, key]

    def _rows(self) -> list[sqlite3.Row]:
        with self._db.read() as c:
            return c.execute("SELECT * FROM overlay_snapshots").fetchall()
