"""The Snapshotter interface (containerd's shape) and the plain data it speaks.

A snapshot is a directory tree keyed by a string: committed snapshots are
immutable layers (image layers are keyed by their chain id); active ones are
writable trees on top of a committed parent, or on nothing (a layer being
unpacked now, a container's rootfs later); views are read-only. A layer is
unpacked into an active snapshot of its own, with no parent, so layers unpack
side by side; it is committed on top of its parent chain once that is
committed. Methods are synchronous and
thread-safe: the daemon calls them through ``asyncio.to_thread``.
"""

from __future__ import annotations

import abc
import enum
from dataclasses import dataclass, field

from pycrid.host.mounts import Mount

__all__ = ["TEMP_PREFIX", "Info", "Kind", "Mount", "Snapshotter", "Usage"]

#: Keys of scratch snapshots (a layer being unpacked); every snapshotter's ``cleanup()``
#: removes them, since a crash is the only way one outlives its unpack.
TEMP_PREFIX = "extract-"


class Kind(enum.Enum):
    ACTIVE = "active"
    VIEW = "view"
    COMMITTED = "committed"


@dataclass(frozen=True)
class Info:
    key: str
    parent: str | None
    kind: Kind
    created_at: float
    labels: dict[str, str] = field(default_factory=dict, compare=False, hash=False)


@dataclass(frozen=True)
class Usage:
    size: int
    inodes: int


class Snapshotter(abc.ABC):
    name: str
    root: str

    @abc.abstractmethod
    def prepare(self, key: str, parent: str | None,
                labels: dict[str, str] | None = None) -> list[Mount]:
        """A new writable snapshot on committed ``parent``; its mounts."""

    @abc.abstractmethod
    def view(self, key: str, parent: str | None,
             labels: dict[str, str] | None = None) -> list[Mount]:
        """A new read-only snapshot of committed ``parent``; its mounts."""

    @abc.abstractmethod
    def mounts(self, key: str) -> list[Mount]: ...

    @abc.abstractmethod
    def commit(self, name: str, key: str, labels: dict[str, str] | None = None, *,
               parent: str | None = None) -> None:
        """Active ``key`` becomes committed ``name``; ``key`` is gone after. With ``parent``
        (a committed snapshot), ``key`` must have been prepared without one, its tree
        holding one layer's changes: ``name`` is committed on top of ``parent``."""

    @abc.abstractmethod
    def remove(self, key: str) -> None:
        """Remove a snapshot that has no children."""

    @abc.abstractmethod
    def stat(self, key: str) -> Info: ...

    @abc.abstractmethod
    def walk(self, prefix: str = "") -> list[Info]:
        """Every snapshot, or those whose key starts with ``prefix``."""

    @abc.abstractmethod
    def usage(self, key: str) -> Usage:
        """Disk used by the snapshot's own layer."""

    @abc.abstractmethod
    def fs_usage(self) -> Usage:
        """Disk used by every snapshot (for ImageFsInfo)."""

    @abc.abstractmethod
    def upper_dir(self, key: str) -> str:
        """The directory holding the snapshot's own layer: a writable one's changes (written
        directly when it has no parent), a committed one's files."""

    @abc.abstractmethod
    def cleanup(self) -> list[str]:
        """Start-up sweep: remove what a crash left half-made; returns what it removed."""
