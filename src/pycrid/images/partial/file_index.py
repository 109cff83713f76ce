"""Which files this node's image layers hold, by content digest: what a partial pull reuses.

One row per regular file of a committed layer snapshot: its sha256, the snapshot's key
(the layer's chain id), its path inside the snapshot's directory and its size. Rows are
added when a layer with a TOC is committed and dropped when the garbage collector
removes snapshots (``retain``; start-up recovery collects too, so rows of snapshots a
crash took are dropped there). A row is a claim, not a proof: the partial pull hashes
every file it takes from here, and drops a row whose file does not match (``forget``).

The table is new in this release, under its own component in ``schema_versions``: an
older pycrid ignores it, and a newer one that finds it from an older state simply sees
no rows for layers pulled before (they are then not reused).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Collection, Iterable
from dataclasses import dataclass

from pycrid.store.db import Database

#: Candidates kept per digest: more copies of one file add nothing.
_PER_DIGEST = 4
_BATCH = 500


def _m1(c: sqlite3.Connection) -> None:
    c.execute(
        "CREATE TABLE layer_files ("
        " layer TEXT NOT NULL, path TEXT NOT NULL, digest TEXT NOT NULL,"
        " size INTEGER NOT NULL, PRIMARY KEY (layer, path))"
    )
    c.execute("CREATE INDEX layer_files_by_digest ON layer_files(digest)")


@dataclass(frozen=True)
class Found:
    """A file with the wanted contents: ``path`` inside snapshot ``layer``."""

    layer: str
    path: str
    size: int


class FileIndex:
    def __init__(self, db: Database) -> None:
        self._db = db
        db.migrate("images.layer_files", [_m1])

    def is_empty(self) -> bool:
        with self._db.read() as c:
            return c.execute("SELECT 1 FROM layer_files LIMIT 1").fetchone() is None

    def add(self, layer: str, files: Iterable[tuple[str, str, int]]) -> None:
        """Record ``(digest, path, size)`` of snapshot ``layer`` (replacing what it had)."""
        rows = [(layer, path, digest, size) for digest, path, size in files]
        with self._db.transaction(f"the file index of layer {layer}") as c:
            c.execute("DELETE FROM layer_files WHERE layer = ?", (layer,))
            c.executemany("INSERT OR REPLACE INTO layer_files(layer, path, digest, size)"
                          " VALUES (?, ?, ?, ?)", rows)

    def lookup(self, digests: Collection[str]) -> dict[str, list[Found]]:
        """Up to ``_PER_DIGEST`` files for each digest, the same ones every time (by layer
        and path: sorted here, which is cheaper than asking SQLite to)."""
        rows: dict[str, list[tuple[str, str, int]]] = {}
        wanted = list(digests)
        with self._db.read() as c:
            cur = c.cursor()
            cur.row_factory = None  # plain tuples: a thousand rows a layer
            for i in range(0, len(wanted), _BATCH):
                batch = wanted[i:i + _BATCH]
                marks = ",".join("?" * len(batch))
                for layer, path, digest, size in cur.execute(
                        "SELECT layer, path, digest, size FROM layer_files"
                        f" WHERE digest IN ({marks})", batch):
                    rows.setdefault(digest, []).append((layer, path, size))
        found: dict[str, list[Found]] = {}
        for digest, got in rows.items():
            got.sort()
            found[digest] = [Found(*r) for r in got[:_PER_DIGEST]]
        return found

    def forget(self, layer: str, path: str) -> None:
        """A row whose file is gone or does not hold what it claims."""
        with self._db.transaction("a file index row", frees=True) as c:
            c.execute("DELETE FROM layer_files WHERE layer = ? AND path = ?", (layer, path))

    def layers(self) -> set[str]:
        with self._db.read() as c:
            return {r[0] for r in c.execute("SELECT DISTINCT layer FROM layer_files")}

    def retain(self, layers: Collection[str]) -> int:
        """Drop the rows of every layer not in ``layers`` (snapshots that are gone);
        returns how many layers were dropped."""
        gone = self.layers() - set(layers)
        if gone:
            with self._db.transaction("the file index of removed layers", frees=True) as c:
                c.executemany("DELETE FROM layer_files WHERE layer = ?", [(g,) for g in gone])
        return len(gone)
