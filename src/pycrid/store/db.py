"""The metadata database: one SQLite file under the root dir, WAL, with versioned schemas.

Each component that persists records (images, snapshots, pods and containers) declares
its own ordered list of migrations under its own name; ``Database.migrate`` applies the
ones not yet applied, together in one transaction, and records the component's schema
version in ``schema_versions`` (version N: N migrations applied).

State outlives the release that wrote it (docs/upgrades.md). A migration marked
:class:`Additive` leaves data that readers of the version before still use correctly;
``schema_readers`` keeps, per component, the oldest version whose readers may use the
tables as they are. A pycrid that finds a version newer than it knows reads on if its
own version is at least that, and otherwise refuses to start, naming the component, the
versions and the release that last started on the state (``releases``): never a silent
misreading. (pycrid 0.1.0 knows no ``schema_readers`` and refuses any newer version.)
"""

from __future__ import annotations

import contextlib
import logging
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from pycrid import release
from pycrid.errors import FailedPrecondition
from pycrid.host import space

log = logging.getLogger(__name__)

#: One migration: a function that gets a connection inside an open transaction.
Migration = Callable[[sqlite3.Connection], None]


@dataclass(frozen=True)
class Additive:
    """A migration whose result readers of the version before use correctly: it adds a
    table, a column with a default, or a record field whose default is right for records
    an older release writes, and whose value stays right when an older release rewrites
    the record carrying it along unchanged (records.py keeps fields it does not know).
    Anything else (a new meaning, a new value of an existing field, a backfill) is a
    plain migration, which older releases refuse."""

    apply: Migration

    def __call__(self, c: sqlite3.Connection) -> None:
        self.apply(c)


def oldest_reader(migrations: Sequence[Migration]) -> int:
    """The oldest schema version whose readers may use data at ``len(migrations)``: the
    trailing additive migrations do not count."""
    version = len(migrations)
    while version > 1 and isinstance(migrations[version - 1], Additive):
        version -= 1
    return version


@dataclass(frozen=True)
class Started:
    """One start of a pycrid on this state (``releases``)."""

    release: str
    commit: str
    at: float

    def describe(self) -> str:
        return f"pycrid {self.release}" + (f" (commit {self.commit[:12]})" if self.commit
                                           else "")


#: How many starts ``releases`` keeps.
RELEASES_KEPT = 20


class NewerState(FailedPrecondition):
    """The state was written by a newer pycrid in a way this one cannot read."""

#: Room kept beside the database (``<db>.reserve``) for a full disk: a DELETE in WAL
#: mode appends to the log before it frees anything, so without it the removals that
#: would free space (and the undo of a half-made object) could not be recorded.
RESERVE = 1 << 20


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
        # Tables pycrid 0.1.0 does not know of, and leaves alone.
        self._conn.execute(
            "CREATE TABLE IF NOT EXISTS schema_readers ("
            " component TEXT PRIMARY KEY, oldest INTEGER NOT NULL)")
        self._conn.execute(
            "CREATE TABLE IF NOT EXISTS releases ("
            " at REAL NOT NULL, release TEXT NOT NULL, git_commit TEXT NOT NULL)")
        self._reserve = path + ".reserve"
        self._reserved = False
        self._hold_reserve()

    def close(self) -> None:
        with self._lock:
            self._conn.close()

    @contextlib.contextmanager
    def transaction(self, what: str = "a record", *,
                    frees: bool = False) -> Iterator[sqlite3.Connection]:
        """A write transaction (BEGIN IMMEDIATE): committed on success, rolled back on error,
        a failed COMMIT included (a full disk: SQLite may or may not have rolled back by
        itself), so the connection is always usable afterwards. A full disk is NoSpace
        naming the database and ``what`` was written. A transaction that ``frees`` (a
        removal) may use the reserve when the disk is full."""
        # The reserve is kept under the lock too: one thread at a time makes or drops it.
        with self._lock:
            if frees:
                self._release_reserve_if_full()
            with space.writing(f"{what} to the metadata database", self.path):
                self._conn.execute("BEGIN IMMEDIATE")
                try:
                    yield self._conn
                    self._conn.execute("COMMIT")
                except BaseException:
                    if self._conn.in_transaction:
                        self._conn.execute("ROLLBACK")
                    raise
            if not self._reserved and not frees:
                self._hold_reserve()

    def _hold_reserve(self) -> None:
        """Make the reserve again once there is room for it and more."""
        try:
            st = os.statvfs(os.path.dirname(self.path) or ".")
            if st.f_bavail * st.f_frsize >= 4 * RESERVE:
                tmp = self._reserve + ".tmp"
                fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
                try:
                    os.posix_fallocate(fd, 0, RESERVE)
                finally:
                    os.close(fd)
                os.replace(tmp, self._reserve)
                self._reserved = True
        except OSError as e:
            log.debug("cannot keep %s: %s", self._reserve, e)

    def _release_reserve_if_full(self) -> None:
        if not self._reserved:
            return
        try:
            st = os.statvfs(os.path.dirname(self.path) or ".")
            if st.f_bavail * st.f_frsize >= RESERVE:
                return
            os.unlink(self._reserve)
        except FileNotFoundError:
            pass
        except OSError as e:
            log.debug("cannot release %s: %s", self._reserve, e)
            return
        self._reserved = False
        log.warning("the file system of %s is full: its %d KiB reserve is released so that "
                    "removals can still be recorded", self.path, RESERVE // 1024)

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

    def oldest_reader(self, component: str) -> int:
        """The oldest schema version of ``component`` whose readers may use its tables
        (the version itself when nothing says otherwise)."""
        with self.read() as c:
            row = c.execute("SELECT oldest FROM schema_readers WHERE component = ?",
                            (component,)).fetchone()
        return int(row[0]) if row else self.schema_version(component)

    def record_start(self, release: str, commit: str) -> None:
        """Note that ``release`` starts on this state (the last few starts are kept)."""
        with self.transaction("the release starting on this state") as c:
            c.execute("INSERT INTO releases(at, release, git_commit) VALUES (?, ?, ?)",
                      (time.time(), release, commit))
            c.execute("DELETE FROM releases WHERE rowid NOT IN"
                      " (SELECT rowid FROM releases ORDER BY at DESC, rowid DESC LIMIT ?)",
                      (RELEASES_KEPT,))

    def releases(self) -> list[Started]:
        """The starts recorded on this state, latest first."""
        with self.read() as c:
            rows = c.execute("SELECT release, git_commit, at FROM releases"
                             " ORDER BY at DESC, rowid DESC").fetchall()
        return [Started(release=r[0], commit=r[1], at=r[2]) for r in rows]

    def last_started(self) -> str:
        """Which release last started on this state, for a message ("" when none did)."""
        last = self.releases()
        return last[0].describe() if last else ""

    def migrate(self, component: str, migrations: Sequence[Migration]) -> None:
        """Bring ``component``'s tables to ``len(migrations)``; version N means N applied.

        The pending migrations run in one transaction (all or none), so a fresh database
        is made in one commit per component. Creating tables is not news; upgrading an
        existing schema gets one debug line. A newer version is read as it is when its
        changes since ours are all additive, else refused (NewerState)."""
        current = self.schema_version(component)
        target = len(migrations)
        if current > target:
            oldest = self.oldest_reader(component)
            if oldest > target:
                raise NewerState(self._newer_message(component, current, oldest, target))
            log.info("metadata schema %s is version %d, newer than this pycrid's %d; its "
                     "changes since are additive, read as they are", component, current,
                     target)
            return
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
            c.execute(
                "INSERT INTO schema_readers(component, oldest) VALUES (?, ?)"
                " ON CONFLICT(component) DO UPDATE SET oldest = excluded.oldest",
                (component, oldest_reader(migrations)),
            )
        if current:
            log.debug("metadata schema %s upgraded from version %d to %d", component, current,
                      target)

    def _newer_message(self, component: str, current: int, oldest: int, target: int) -> str:
        last = self.last_started()
        by = f"; {last} last started on it" if last else ""
        return (f"metadata database {self.path}: the state of {component!r} is schema "
                f"version {current}{by}; a reader of version {oldest} or newer is needed, and "
                f"this pycrid ({release.VERSION}) reads up to version {target}, so it refuses "
                f"to start rather than misread it. Start a pycrid that reads it (the release "
                f"that wrote it or a newer one) on this root, or drain the node and start "
                f"this one on an empty root (docs/upgrades.md)")
