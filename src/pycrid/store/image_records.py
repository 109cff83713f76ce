"""Image records: SQLite for durability, an in-memory index for every read.

An image is identified, as in the CRI, by the digest of its config. It carries
the names it is known by (``repo:tag`` and ``repo@digest`` references); a name
points at exactly one image, and moving a tag to a newer image takes it off
the old one. List and Status are answered from memory (the kubelet calls
ListImages every few seconds).
"""

from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass, field, replace

from pycrid.store.db import Database


@dataclass(frozen=True)
class ImageRecord:
    id: str  # config digest
    #: What the name was resolved to: an index or a manifest digest.
    target: str
    manifest: str
    #: Manifest-level blobs: layer digests (compressed), in order.
    layers: tuple[str, ...]
    #: Snapshot chain ids, lowest layer first; the last one is the image's rootfs.
    chain: tuple[str, ...]
    #: manifest + config + compressed layers, in bytes (what the CRI reports).
    size: int
    user: str
    created_at: float
    names: frozenset[str] = field(default_factory=frozenset)

    def content(self) -> set[str]:
        """Every content digest this image needs kept."""
        return {self.target, self.manifest, self.id, *self.layers}


def _m1(c: sqlite3.Connection) -> None:
    c.execute(
        "CREATE TABLE images ("
        " id TEXT PRIMARY KEY, target TEXT NOT NULL, manifest TEXT NOT NULL,"
        " layers TEXT NOT NULL, chain TEXT NOT NULL, size INTEGER NOT NULL,"
        " user TEXT NOT NULL, created_at REAL NOT NULL)"
    )
    c.execute(
        "CREATE TABLE image_names ("
        " name TEXT PRIMARY KEY,"
        " image_id TEXT NOT NULL REFERENCES images(id) ON DELETE CASCADE)"
    )
    c.execute("CREATE INDEX image_names_by_image ON image_names(image_id)")


MIGRATIONS = [_m1]


class ImageStore:
    def __init__(self, db: Database) -> None:
        self._db = db
        db.migrate("images", MIGRATIONS)
        self._images: dict[str, ImageRecord] = {}
        self._names: dict[str, str] = {}
        self._load()

    def _load(self) -> None:
        with self._db.read() as c:
            names: dict[str, set[str]] = {}
            for row in c.execute("SELECT name, image_id FROM image_names"):
                names.setdefault(row["image_id"], set()).add(row["name"])
                self._names[row["name"]] = row["image_id"]
            for row in c.execute("SELECT * FROM images"):
                self._images[row["id"]] = ImageRecord(
                    id=row["id"], target=row["target"], manifest=row["manifest"],
                    layers=tuple(json.loads(row["layers"])), chain=tuple(json.loads(row["chain"])),
                    size=row["size"], user=row["user"], created_at=row["created_at"],
                    names=frozenset(names.get(row["id"], ())),
                )

    # reads: memory only

    def get(self, image_id: str) -> ImageRecord | None:
        return self._images.get(image_id)

    def by_name(self, name: str) -> ImageRecord | None:
        image_id = self._names.get(name)
        return self._images.get(image_id) if image_id else None

    def by_target(self, target: str) -> ImageRecord | None:
        """The image that an index or manifest digest was resolved to."""
        for img in self._images.values():
            if img.target == target or img.manifest == target:
                return img
        return None

    def by_id_prefix(self, prefix: str) -> list[ImageRecord]:
        return [img for i, img in self._images.items() if i.startswith(prefix)]

    def list(self) -> list[ImageRecord]:
        return list(self._images.values())

    # writes: SQLite first, then memory

    def put(self, rec: ImageRecord, names: set[str]) -> ImageRecord:
        """Add or update image ``rec`` and point ``names`` at it (taking them off other images)."""
        old = self._images.get(rec.id)
        all_names = set(names) | (set(old.names) if old else set())
        with self._db.transaction(f"the record of image {rec.id}") as c:
            c.execute(
                "INSERT INTO images(id, target, manifest, layers, chain, size, user, created_at)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT(id) DO UPDATE SET"
                " target=excluded.target, manifest=excluded.manifest, layers=excluded.layers,"
                " chain=excluded.chain, size=excluded.size, user=excluded.user",
                (rec.id, rec.target, rec.manifest, json.dumps(rec.layers), json.dumps(rec.chain),
                 rec.size, rec.user, rec.created_at),
            )
            for name in names:
                c.execute(
                    "INSERT INTO image_names(name, image_id) VALUES (?, ?)"
                    " ON CONFLICT(name) DO UPDATE SET image_id = excluded.image_id",
                    (name, rec.id),
                )
        for name in names:
            prev = self._names.get(name)
            if prev is not None and prev != rec.id and prev in self._images:
                p = self._images[prev]
                self._images[prev] = replace(p, names=p.names - {name})
            self._names[name] = rec.id
        new = replace(rec, names=frozenset(all_names),
                      created_at=old.created_at if old else rec.created_at)
        self._images[rec.id] = new
        return new

    def delete(self, image_id: str) -> ImageRecord | None:
        rec = self._images.get(image_id)
        if rec is None:
            return None
        with self._db.transaction(f"the removal of image {image_id}", frees=True) as c:
            c.execute("DELETE FROM images WHERE id = ?", (image_id,))
        for name in rec.names:
            if self._names.get(name) == image_id:
                del self._names[name]
        del self._images[image_id]
        return rec
