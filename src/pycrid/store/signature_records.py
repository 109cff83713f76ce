"""Signatures kept beside the images: what a pull fetched, by manifest digest.

CreateContainer checks a present image against the pod namespace's policy with these,
without asking the registry again. Rows are keyed by the signed digest (an index or a
manifest), not by image id, and live in a component of their own
(``image_signatures``): a pycrid that predates them never opens the table, and its
``images`` schema is unchanged, so it reads the database as before and may run
against it (an image it removes leaves rows that ``prune`` drops later). Blobs are in
containers/image's signature blob format (``payload.to_blob``).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable

from pycrid.store.db import Database

#: What one digest may keep: a few signatures, not an unbounded attachment.
MAX_KEPT = 16
MAX_KEPT_BYTES = 1 << 20


def _m1(c: sqlite3.Connection) -> None:
    c.execute("CREATE TABLE image_signatures ("
              " digest TEXT NOT NULL, idx INTEGER NOT NULL, blob BLOB NOT NULL,"
              " PRIMARY KEY (digest, idx))")


MIGRATIONS = [_m1]


class SignatureStore:
    def __init__(self, db: Database) -> None:
        self._db = db
        db.migrate("image_signatures", MIGRATIONS)
        self._by_digest: dict[str, tuple[bytes, ...]] = {}
        with db.read() as c:
            rows = c.execute("SELECT digest, blob FROM image_signatures ORDER BY digest, idx")
            for row in rows:
                self._by_digest[row["digest"]] = (*self._by_digest.get(row["digest"], ()),
                                                  bytes(row["blob"]))

    def get(self, digest: str) -> tuple[bytes, ...]:
        return self._by_digest.get(digest, ())

    def put(self, digest: str, blobs: Iterable[bytes]) -> tuple[bytes, ...]:
        """Keep ``blobs`` (at most MAX_KEPT, MAX_KEPT_BYTES together) for ``digest``,
        replacing what was kept; returns what was kept."""
        kept: list[bytes] = []
        total = 0
        for b in blobs:
            if len(kept) == MAX_KEPT or total + len(b) > MAX_KEPT_BYTES:
                break
            kept.append(b)
            total += len(b)
        if tuple(kept) == self._by_digest.get(digest, ()):
            return tuple(kept)
        with self._db.transaction(f"the signatures of {digest}") as c:
            c.execute("DELETE FROM image_signatures WHERE digest = ?", (digest,))
            c.executemany("INSERT INTO image_signatures(digest, idx, blob) VALUES (?, ?, ?)",
                          [(digest, i, b) for i, b in enumerate(kept)])
        if kept:
            self._by_digest[digest] = tuple(kept)
        else:
            self._by_digest.pop(digest, None)
        return tuple(kept)

    def prune(self, keep: set[str]) -> int:
        """Forget the signatures of digests not in ``keep``; how many digests went."""
        gone = [d for d in self._by_digest if d not in keep]
        if gone:
            with self._db.transaction("the removal of signatures", frees=True) as c:
                c.executemany("DELETE FROM image_signatures WHERE digest = ?",
                              [(d,) for d in gone])
            for d in gone:
                del self._by_digest[d]
        return len(gone)
