"""Out of space, said plainly (host/space.py), and a metadata database that stays usable
on a full disk (store/db.py's reserve)."""

from __future__ import annotations

import errno
import os
import sqlite3
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from pycrid.errors import NoSpace
from pycrid.host.space import is_no_space, no_space, writing
from pycrid.store.db import RESERVE, Database


def test_the_message_names_the_path_its_file_system_and_what(tmp_path: Path) -> None:
    err = OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "blob"))
    got = no_space(err, "layer sha256:ab of image x")
    text = str(got)
    assert text.startswith(f"no space left on device at {tmp_path / 'blob'} (")
    assert " free)" in text and "while writing layer sha256:ab of image x" in text
    assert got.kind == "RESOURCE_EXHAUSTED"
    quota = no_space(OSError(errno.EDQUOT, "Disk quota exceeded"), "x", "/var/lib/pycrid")
    assert str(quota).startswith("disk quota exceeded at /var/lib/pycrid")
    copy = OSError(errno.ENOSPC, "No space left on device")
    copy.filename, copy.filename2 = "/src/file", str(tmp_path / "dst")
    assert f"at {tmp_path / 'dst'} (" in str(no_space(copy, "a copy"))  # the destination


def test_what_counts_as_out_of_space() -> None:
    assert is_no_space(OSError(errno.ENOSPC, "x"))
    assert is_no_space(OSError(errno.EDQUOT, "x"))
    assert is_no_space(sqlite3.OperationalError("database or disk is full"))
    assert not is_no_space(OSError(errno.EIO, "x"))
    assert not is_no_space(sqlite3.OperationalError("database is locked"))
    with pytest.raises(NoSpace, match="while writing the thing"):
        with writing("the thing", "/somewhere"):
            raise OSError(errno.ENOSPC, "No space left on device")
    with pytest.raises(PermissionError):
        with writing("the thing", "/somewhere"):
            raise PermissionError(errno.EACCES, "no")


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "pycrid-test", str(tmp_path)],
                   check=True)
    try:
        yield tmp_path
    finally:
        subprocess.run(["umount", str(tmp_path)], check=True)


def test_a_full_disk_still_lets_removals_be_recorded(small_fs: Path) -> None:
    db = Database(str(small_fs / "meta" / "pycrid.db"))
    try:
        assert os.path.getsize(small_fs / "meta" / "pycrid.db.reserve") == RESERVE
        with db.transaction() as c:
            c.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, v BLOB)")
        with db.transaction() as c:
            c.executemany("INSERT INTO t(v) VALUES (?)", [(b"x" * 1000,)] * 50)
        st = os.statvfs(small_fs)
        with open(small_fs / "filler", "wb") as f:
            os.posix_fallocate(f.fileno(), 0, st.f_bavail * st.f_frsize)
        with pytest.raises(NoSpace, match="the rows to the metadata database"):
            with db.transaction("the rows") as c:
                c.executemany("INSERT INTO t(v) VALUES (?)", [(b"y" * 4000,)] * 200)
        # The failed write left the connection usable, and a removal goes through.
        with db.transaction("the removal", frees=True) as c:
            c.execute("DELETE FROM t")
        assert not (small_fs / "meta" / "pycrid.db.reserve").exists()
        os.unlink(small_fs / "filler")
        with db.transaction() as c:  # room again: the reserve comes back
            c.execute("INSERT INTO t(v) VALUES (?)", (b"z",))
        assert os.path.getsize(small_fs / "meta" / "pycrid.db.reserve") == RESERVE
        with db.read() as c:
            assert [r[0] for r in c.execute("SELECT v FROM t")] == [b"z"]
    finally:
        db.close()
