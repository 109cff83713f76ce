"""Process user and groups from a user string plus the rootfs's passwd/group text.

Pure: the caller reads ``etc/passwd`` and ``etc/group`` from the container
rootfs (None when missing) and passes the text in (CRI-TO-OCI.md §2.5).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from pycrid.errors import InvalidArgument

MAX_ID = 2147483647


@dataclass(frozen=True)
class PasswdEntry:
    name: str
    uid: int
    gid: int


@dataclass(frozen=True)
class GroupEntry:
    name: str
    gid: int
    members: tuple[str, ...]


@dataclass(frozen=True)
class ResolvedUser:
    uid: int
    gid: int


def parse_passwd(text: str | None) -> list[PasswdEntry]:
    """Entries of an /etc/passwd; malformed lines are skipped, as libc does."""
    out: list[PasswdEntry] = []
    for line in (text or "").splitlines():
        parts = line.strip().split(":")
        if len(parts) < 4 or line.startswith("#"):
            continue
        try:
            out.append(PasswdEntry(parts[0], int(parts[2]), int(parts[3])))
        except ValueError:
            continue
    return out


def parse_group(text: str | None) -> list[GroupEntry]:
    """Entries of an /etc/group; malformed lines are skipped."""
    out: list[GroupEntry] = []
    for line in (text or "").splitlines():
        parts = line.strip().split(":")
        if len(parts) < 3 or line.startswith("#"):
            continue
        try:
            gid = int(parts[2])
        except ValueError:
            continue
        members = tuple(m for m in (parts[3] if len(parts) > 3 else "").split(",") if m)
        out.append(GroupEntry(parts[0], gid, members))
    return out


def _numeric(text: str) -> int | None:
    if not text.isdigit():
        return None
    value = int(text)
    if value > MAX_ID:
        raise InvalidArgument(f"id {text} is outside the range 0..{MAX_ID}")
    return value


def resolve_user(user: str, etc_passwd: str | None, etc_group: str | None) -> ResolvedUser:
    """Turn ``N``, ``name``, ``a:b`` into uid/gid; unknown names are InvalidArgument."""
    if user.startswith("-") or user.split(":", 1)[-1].startswith("-"):
        raise InvalidArgument(f"user {user!r}: ids must be in the range 0..{MAX_ID}")
    left, sep, right = user.partition(":")
    uid = _numeric(left)
    if not sep:
        if uid is not None:
            entry = next((p for p in parse_passwd(etc_passwd) if p.uid == uid), None)
            return ResolvedUser(uid, entry.gid if entry else 0)
        entry = _lookup_user(left, etc_passwd)
        return ResolvedUser(entry.uid, entry.gid)
    if uid is None:
        uid = _lookup_user(left, etc_passwd).uid
    gid = _numeric(right)
    if gid is None:
        group = next((g for g in parse_group(etc_group) if g.name == right), None)
        if group is None:
            raise InvalidArgument(f"group {right!r} of user {user!r} not found in /etc/group")
        gid = group.gid
    return ResolvedUser(uid, gid)


def _lookup_user(name: str, etc_passwd: str | None) -> PasswdEntry:
    entry = next((p for p in parse_passwd(etc_passwd) if p.name == name), None)
    if entry is None:
        raise InvalidArgument(f"user {name!r} not found in the image's /etc/passwd")
    return entry


def image_groups(user: str, etc_passwd: str | None, etc_group: str | None) -> list[int]:
    """Gids of /etc/group entries listing ``user`` as a member (Merge policy).

    A numeric user is first named through passwd; unknown ⇒ no groups. A group
    named like the user is skipped: it is the primary group, not a supplement.
    """
    name = user
    if user.isdigit():
        entry = next((p for p in parse_passwd(etc_passwd) if p.uid == int(user)), None)
        if entry is None:
            return []
        name = entry.name
    return [g.gid for g in parse_group(etc_group) if g.name != name and name in g.members]


def sorted_gids(primary: int, extra: Iterable[int]) -> list[int]:
    """The final additionalGids: de-duplicated, ascending, primary included."""
    return sorted({primary, *extra})
