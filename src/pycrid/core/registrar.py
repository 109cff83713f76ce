"""Names, id prefixes and per-object locks: the bookkeeping every pod and container call shares."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterable

from pycrid.errors import FailedPrecondition, InvalidArgument, NotFound, Unknown


class NameRegistrar:
    """One owner per name, as containerd's registrar: a second reservation is refused."""

    def __init__(self, what: str) -> None:
        self._what = what
        self._owners: dict[str, str] = {}

    def reserve(self, name: str, key: str) -> None:
        owner = self._owners.setdefault(name, key)
        if owner != key:
            raise FailedPrecondition(
                f"failed to reserve {self._what} name {name!r}: "
                f"name {name!r} is reserved for {owner!r}")

    def release(self, name: str) -> None:
        self._owners.pop(name, None)


def resolve_prefix(ids: Iterable[str], prefix: str, what: str) -> str:
    """The one id that starts with ``prefix`` (containerd's truncindex rules)."""
    if not prefix:
        raise InvalidArgument(f"{what} id must not be empty")
    if "\0" in prefix or " " in prefix:
        raise InvalidArgument(f"{what} id {prefix!r} contains an illegal character")
    found = [i for i in ids if i.startswith(prefix)]
    if not found:
        raise NotFound(f"{what} {prefix!r} not found")
    if len(found) > 1:
        # containerd answers Unknown here ("Multiple IDs found with provided prefix").
        raise Unknown(f"multiple {what} ids found with prefix {prefix!r}")
    return found[0]


class RWLock:
    """Many readers or one writer; a waiting writer holds back new readers."""

    def __init__(self) -> None:
        self._readers = 0
        self._writer = False
        self._writers_waiting = 0
        self._cond = asyncio.Condition()

    @contextlib.asynccontextmanager
    async def read(self) -> AsyncIterator[None]:
        async with self._cond:
            await self._cond.wait_for(lambda: not self._writer and not self._writers_waiting)
            self._readers += 1
        try:
            yield
        finally:
            async with self._cond:
                self._readers -= 1
                self._cond.notify_all()

    @contextlib.asynccontextmanager
    async def write(self) -> AsyncIterator[None]:
        async with self._cond:
            self._writers_waiting += 1
            try:
                await self._cond.wait_for(lambda: not self._writer and not self._readers)
            except BaseException:
                # A writer that gives up must let the readers it held back in.
                self._writers_waiting -= 1
                self._cond.notify_all()
                raise
            self._writers_waiting -= 1
            self._writer = True
        try:
            yield
        finally:
            async with self._cond:
                self._writer = False
                self._cond.notify_all()


class KeyedLocks:
    """A lock per object id: one object's operations run one at a time, others in parallel."""

    def __init__(self) -> None:
        self._locks: dict[str, RWLock] = {}

    def __call__(self, key: str) -> RWLock:
        lock = self._locks.get(key)
        if lock is None:
            lock = self._locks[key] = RWLock()
        return lock

    def drop(self, key: str) -> None:
        self._locks.pop(key, None)
