"""The metadata database: WAL, per-component schema versions, transactions."""

from __future__ import annotations

import logging
import sqlite3
from pathlib import Path

import pytest

from pycrid.errors import FailedPrecondition
from pycrid.store.db import RELEASES_KEPT, Additive, Database, NewerState, oldest_reader


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
    db.record_start("9.0.0", "ef" * 20)
    with pytest.raises(NewerState) as e:
        db.migrate("things", [m1])
    text = str(e.value)
    assert isinstance(e.value, FailedPrecondition)
    assert "the state of 'things' is schema version 2" in text
    assert f"pycrid 9.0.0 (commit {'ef' * 6}) last started on it" in text
    assert "a reader of version 2 or newer is needed" in text
    assert "reads up to version 1" in text and "docs/upgrades.md" in text
    assert db.schema_version("things") == 2  # untouched


def test_additive_changes_are_read_by_the_release_before(tmp_path: Path) -> None:
    """A newer release's additive migrations leave data the release before reads; a
    plain one after them makes it refuse."""
    db = Database(str(tmp_path / "m.db"))
    db.migrate("things", [m1, Additive(m2), Additive(m3)])
    assert (db.schema_version("things"), db.oldest_reader("things")) == (3, 1)
    db.migrate("things", [m1])  # reads on: nothing changes
    db.migrate("things", [m1, Additive(m2)])
    assert (db.schema_version("things"), db.oldest_reader("things")) == (3, 1)
    with db.transaction() as c:
        c.execute("INSERT INTO things(id) VALUES ('a')")  # an older writer: size defaults

    other = Database(str(tmp_path / "n.db"))
    other.migrate("things", [m1, m2, Additive(m3)])
    assert (other.schema_version("things"), other.oldest_reader("things")) == (3, 2)
    other.migrate("things", [m1, m2])
    with pytest.raises(NewerState, match="a reader of version 2 or newer is needed"):
        other.migrate("things", [m1])


def test_oldest_reader() -> None:
    assert oldest_reader([]) == 0
    assert oldest_reader([m1]) == 1
    assert oldest_reader([m1, Additive(m2)]) == 1
    assert oldest_reader([m1, m2, Additive(m3)]) == 2
    assert oldest_reader([m1, Additive(m2), m3]) == 3
    assert oldest_reader([Additive(m1)]) == 1  # the first version has no reader before it


def test_a_0_1_0_database_is_read_and_stays_readable_by_0_1_0(tmp_path: Path) -> None:
    """pycrid 0.1.0's metadata database has no schema_readers or releases table; this
    release adds both (0.1.0 leaves tables it does not know alone) and changes nothing
    0.1.0 reads."""
    path = str(tmp_path / "m.db")
    old = sqlite3.connect(path)
    old.execute("CREATE TABLE schema_versions (component TEXT PRIMARY KEY,"
                " version INTEGER NOT NULL)")
    old.execute("INSERT INTO schema_versions VALUES ('things', 1)")
    old.execute("CREATE TABLE things (id TEXT PRIMARY KEY)")
    old.commit()
    old.close()
    db = Database(path)
    db.migrate("things", [m1])
    assert db.oldest_reader("things") == 1
    db.record_start("0.2.0", "")
    assert [s.describe() for s in db.releases()] == ["pycrid 0.2.0"]
    db.close()
    old = sqlite3.connect(path)
    assert old.execute("SELECT component, version FROM schema_versions").fetchall() == [
        ("things", 1)]


def test_releases_keeps_the_last_starts(tmp_path: Path) -> None:
    db = Database(str(tmp_path / "m.db"))
    for i in range(RELEASES_KEPT + 5):
        db.record_start(f"0.{i}.0", "")
    got = db.releases()
    assert len(got) == RELEASES_KEPT
    assert got[0].release == f"0.{RELEASES_KEPT + 4}.0"


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
