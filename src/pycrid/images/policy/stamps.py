"""A file's identity and version, as a stat sees them: what cached parses of policy,
registries.d and key files are checked against."""

from __future__ import annotations

import os

Stamp = tuple[int, int, int, int]


def stamp_of(path: str) -> Stamp | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
