"""Image records: names move between images, everything persists, reads come from memory."""

from __future__ import annotations

import hashlib
from pathlib import Path

from pycrid.images.fetch import chain_ids
from pycrid.images.image_service import user_of
from pycrid.store.db import Database
from pycrid.store.image_records import ImageRecord, ImageStore


def rec(n: int) -> ImageRecord:
    d = f"sha256:{n:064x}"
    return ImageRecord(id=d, target=d, manifest=d, layers=(d,), chain=(d,), size=n,
                       user="", created_at=float(n))


def test_names_move_and_persist(tmp_path: Path) -> None:
    db = Database(str(tmp_path / "m.db"))
    store = ImageStore(db)
    store.put(rec(1), {"docker.io/library/a:latest", "docker.io/library/a@sha256:1"})
    store.put(rec(2), {"docker.io/library/a:latest"})  # the tag moves to a newer image
    one, two = store.get(rec(1).id), store.get(rec(2).id)
    assert one is not None and two is not None
    assert one.names == {"docker.io/library/a@sha256:1"}
    assert two.names == {"docker.io/library/a:latest"}
    db.close()
    reopened = ImageStore(Database(str(tmp_path / "m.db")))
    got = reopened.by_name("docker.io/library/a:latest")
    assert got is not None and got.id == rec(2).id
    got1 = reopened.get(rec(1).id)
    assert got1 is not None and got1.names == {"docker.io/library/a@sha256:1"}
    assert reopened.delete(rec(2).id) is not None
    assert reopened.by_name("docker.io/library/a:latest") is None
    assert [r.id for r in reopened.list()] == [rec(1).id]


def test_chain_ids_follow_the_oci_definition() -> None:
    a, b, c = (f"sha256:{x * 64}" for x in "abc")
    ab = "sha256:" + hashlib.sha256(f"{a} {b}".encode()).hexdigest()
    abc = "sha256:" + hashlib.sha256(f"{ab} {c}".encode()).hexdigest()
    assert chain_ids([a, b, c]) == [a, ab, abc]
    assert chain_ids([]) == []


def test_user_of_image_config() -> None:
    assert user_of("") == (None, "")
    assert user_of("1000") == (1000, "")
    assert user_of("1000:1000") == (1000, "")
    assert user_of("app") == (None, "app")
    assert user_of("app:grp") == (None, "app")
