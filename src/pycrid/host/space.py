"""Out of space, said plainly.

A full disk (ENOSPC), an exhausted quota (EDQUOT) or SQLite's "database or disk is full"
is not a bug in pycrid but a fact about the node: ``no_space`` turns it into one error
kind (``NoSpace``, answered RESOURCE_EXHAUSTED) whose message names the path, the file
system it is on (mount point, type, what is free) and what was being written. The
places that write know what they write (``writing``); anything that slips past them is
still named by the CRI edge with the call it happened in.
"""

from __future__ import annotations

import contextlib
import errno
import os
import sqlite3
from collections.abc import Iterator

from pycrid.errors import NoSpace
from pycrid.host import mountinfo

_ERRNOS = (errno.ENOSPC, errno.EDQUOT)


def is_no_space(err: BaseException) -> bool:
    if isinstance(err, OSError):
        return err.errno in _ERRNOS
    if isinstance(err, sqlite3.OperationalError):
        return (getattr(err, "sqlite_errorcode", None) == sqlite3.SQLITE_FULL
                or "database or disk is full" in str(err))
    return False


def file_system_of(path: str) -> str:
    """``tmpfs at /var/lib/pycrid, 64.0 MiB, now 0 B free`` (what can be told of it; "now":
    what the failed write had made may have been removed since)."""
    held = mountinfo.holder_of(os.path.abspath(path), mountinfo.read()) if path else None
    where = f"{held.fstype} at {held.mount_point}" if held else "its file system"
    probe = path
    while probe and not os.path.exists(probe):
        probe = os.path.dirname(probe)
    try:
        st = os.statvfs(probe or "/")
    except OSError:
        return where
    return (f"{where}, {_size(st.f_blocks * st.f_frsize)}, now "
            f"{_size(st.f_bavail * st.f_frsize)} free")


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def no_space(err: BaseException, what: str, path: str = "") -> NoSpace:
    """The NoSpace error for ``err`` (see ``is_no_space``), naming where it happened:
    the path the error names (of two, the second: a copy's destination), else ``path``."""
    named = getattr(err, "filename2", None) or getattr(err, "filename", None)
    where = os.fsdecode(named) if isinstance(named, (str, bytes)) and named else path
    problem = ("disk quota exceeded" if isinstance(err, OSError) and err.errno == errno.EDQUOT
               else "no space left on device")
    at = f" at {where} ({file_system_of(where)})" if where else ""
    return NoSpace(f"{problem}{at} while writing {what}; free some space on the node, "
                   "then retry")


@contextlib.contextmanager
def writing(what: str, path: str) -> Iterator[None]:
    """Errors of running out of space inside become NoSpace about ``what`` at ``path``."""
    try:
        yield
    except (OSError, sqlite3.OperationalError) as e:
        if is_no_space(e):
            raise no_space(e, what, path) from None
        raise
