"""The metadata database: WAL, per-component schema versions, transactions."""

from __future__ import annotations

import logging
import sqlite3
from pathlib import Path

import pytest

from pycrid.errors import FailedPrecondition
from pycrid.store.db import Database


def m1(c: sqlite3.Connection) -> None:
    c.execute("CREATE TABLE things (id TEXT PRIMARY KEY)")


def m2(c: sqlite3.Connection) -> None:
    c.execute("ALTER TABLE things ADD COLUMN size INTEGER NOT NULL DEFAULT 0")


def test_wal_and_migrations(tmp_path: Path) -> None:
    db = Database(str(tmp_path / "m.db"))
    with db.read() as c:
        assert c.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    db.migrate("things", [m1])
    assert db.schema_version("things") == 1
    db.migrate("things", [m1])  # applied already: nothing happens
    db.migrate("things", [m1, m2])
    assert db.schema_version("things") == 2
    with db.transaction() as c:
        c.execute("INSERT INTO things(id, size) VALUES ('a', 3)")
    db.close()
    # A reopened database keeps versions and rows.
    db = Database(str(tmp_path / "m.db"))
    assert db.schema_version("things") == 2
    with db.read() as c:
        assert c.execute("SELECT size FROM things").fetchone()[0] == 3


def test_failed_migration_rolls_back(tmp_path: Path) -> None:
    db = Database(str(tmp_path / "m.db"))

    def broken(c: sqlite3.Connection) -> None:
        c.execute("CREATE TABLE half (x)")
        raise RuntimeError("migration bug")

    with pytest.raises(RuntimeError):
        db.migrate("x", [broken])
    assert db.schema_version("x") == 0
    with db.read() as c:
        assert c.execute("SELECT name FROM sqlite_master WHERE name='half'").fetchone() is None


def test_newer_schema_is_refused(tmp_path: Path) -> None:
    db = Database(str(tmp_path / "m.db"))
    db.migrate("things", [m1, m2])
    with pytest.raises(FailedPrecondition, match="newer than this pycrid knows"):
        db.migrate("things", [m1])


def test_transaction_rolls_back_on_error(tmp_path: Path) -> None:
    db = Database(str(tmp_path / "m.db"))
    db.migrate("things", [m1])
    with pytest.raises(ValueError), db.transaction() as c:
        c.execute("INSERT INTO things(id) VALUES ('a')")
        raise ValueError
    with db.read() as c:
        assert c.execute("SELECT count(*) FROM things").fetchone()[0] == 0


def m3(c: sqlite3.Connection) -> None:
    c.execute("CREATE INDEX things_by_size ON things(size)")


def test_a_fresh_schema_is_made_quietly(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="pycrid.store.db")
    db = Database(str(tmp_path / "m.db"))
    db.migrate("things", [m1, m2])
    db.migrate("others", [lambda c: c.execute("CREATE TABLE others (id TEXT)")])
    assert (db.schema_version("things"), db.schema_version("others")) == (2, 1)
    assert caplog.records == []


def test_an_upgrade_is_one_debug_line(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    db = Database(str(tmp_path / "m.db"))
    db.migrate("things", [m1])
    caplog.set_level(logging.DEBUG, logger="pycrid.store.db")
    db.migrate("things", [m1, m2, m3])
    assert [(r.levelno, r.getMessage()) for r in caplog.records] == [
        (logging.DEBUG, "metadata schema things upgraded from version 1 to 3")]
    assert db.schema_version("things") == 3


def test_pending_migrations_apply_all_or_none(tmp_path: Path) -> None:
    db = Database(str(tmp_path / "m.db"))
    db.migrate("things", [m1])

    def broken(c: sqlite3.Connection) -> None:
        raise RuntimeError("migration bug")

    with pytest.raises(RuntimeError):
        db.migrate("things", [m1, m2, broken])
    assert db.schema_version("things") == 1
    with db.read() as c:  # m2 was rolled back with it: the next start runs it again
        columns = [r[1] for r in c.execute("PRAGMA table_info(things)")]
    assert columns == ["id"]
