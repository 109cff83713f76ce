"""A pod's id mappings (KEP-127): which node ids its container ids are. Plain values, so
that the spec builder can use them without the code that makes namespaces."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class IDRange:
    """One line of a uid_map or gid_map: ``size`` ids from ``container_id`` on are
    ``host_id`` on, on the node."""

    container_id: int
    host_id: int
    size: int

    def to_host(self, cid: int) -> int | None:
        off = cid - self.container_id
        return self.host_id + off if 0 <= off < self.size else None


@dataclass(frozen=True)
class IDMap:
    """A pod's uid and gid mappings (the CRI sends one range of each)."""

    uids: tuple[IDRange, ...]
    gids: tuple[IDRange, ...]

    def uid(self, cid: int) -> int | None:
        return next((h for r in self.uids if (h := r.to_host(cid)) is not None), None)

    def gid(self, cid: int) -> int | None:
        return next((h for r in self.gids if (h := r.to_host(cid)) is not None), None)

    def root(self) -> tuple[int, int]:
        """The node's uid and gid of the container's root."""
        uid, gid = self.uid(0), self.gid(0)
        if uid is None or gid is None:
            raise ValueError("the mappings do not map container id 0")
        return uid, gid

    def map_file(self, kind: str) -> str:
        """The text written to /proc/<pid>/{uid,gid}_map."""
        ranges = self.uids if kind == "uid" else self.gids
        return "".join(f"{r.container_id} {r.host_id} {r.size}\n" for r in ranges)
