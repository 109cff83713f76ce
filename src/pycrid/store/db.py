"""The metadata database: one SQLite file under the root dir, WAL, with versioned schemas.

Each component that persists records (images, snapshots, later pods and
containers) declares its own ordered list of migrations under its own name;
``Database.migrate`` applies the ones not yet applied, together in one
transaction, and records the component's schema version in ``schema_versions``. A database
written by a newer pycrid (a version we do not know) refuses to open rather
than being silently misread.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sqlite3
import threading
from collections.abc import Callable, Iterator, Sequence

from pycrid.errors import FailedPrecondition

log = logging.getLogger(__name__)

#: One migration: a function that gets a connection inside an open transaction.
Migration = Callable[[sqlite3.Connection], None]


class Database:
    """A SQLite connection shared by the daemon's stores.

    The daemon runs on one event loop, but slow work (unpacking) runs in worker
    threads; the connection is opened with ``check_same_thread=False`` and every
    use goes through ``transaction()``/``read()``, which hold one lock, so the
    connection is never used by two threads at once.
    """

    def __init__(self, path: str) -> None:
        os.makedirs(os.path.dirname(path) or ".", mode=0o700, exist_ok=True)
        self.path = path
        self._lock = threading.RLock()
        self._conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self._conn.row_factory = sqlite3.Row
        # NORMAL first: switching a new file to WAL then costs one fsync less.
        self._conn.execute("PRAGMA synchronous=NORMAL")
        self._conn.execute("PRAGMA journal_mode=WAL")
        self._conn.execute("PRAGMA foreign_keys=ON")
        self._conn.execute(
            "CREATE TABLE IF NOT EXISTS schema_versions ("
            " component TEXT PRIMARY KEY, version INTEGER NOT NULL)"
        )

    def close(self) -> None:
        with self._lock:
            self._conn.close()

    @contextlib.contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """A write transaction (BEGIN IMMEDIATE): committed on success, rolled back on error."""
        with self._lock:
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                yield self._conn
            except BaseException:
                self._conn.execute("ROLLBACK")
                raise
            self._conn.execute("COMMIT")

    @contextlib.contextmanager
    def read(self) -> Iterator[sqlite3.Connection]:
        """The connection for reads (autocommit; each statement sees a consistent snapshot)."""
        with self._lock:
            yield self._conn

    def schema_version(self, component: str) -> int:
        with self.read() as c:
            row = c.execute(
                "SELECT version FROM schema_versions WHERE component = ?", (component,)
            ).fetchone()
        return int(row[0]) if row else 0

    def migrate(self, component: str, migrations: Sequence[Migration]) -> None:
        """Bring ``component``'s tables to ``len(migrations)``; version N means N applied.

        The pending migrations run in one transaction (all or none), so a fresh database
        is made in one commit per component. Creating tables is not news; upgrading an
        existing schema gets one debug line."""
        current = self.schema_version(component)
        target = len(migrations)
        if current > target:
            raise FailedPrecondition(
                f"metadata database {self.path}: schema of {component!r} is version {current}, "
                f"newer than this pycrid knows ({target}); refusing to use it"
            )
        if current == target:
            return
        with self.transaction() as c:
            for migration in migrations[current:]:
                migration(c)
            c.execute(
                "INSERT INTO schema_versions(component, version) VALUES (?, ?)"
                " ON CONFLICT(component) DO UPDATE SET version = excluded.version",
                (component, target),
            )
        if current:
            log.debug("metadata schema %s upgraded from version %d to %d", component, current,
                      target)
