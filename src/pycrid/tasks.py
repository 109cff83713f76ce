"""Who owns a task: every background task pycrid starts belongs to an ``Owner``, and
every owner belongs to another, up to the daemon's, so stopping the daemon stops them all.

This is trio's nursery made to fit long-lived services: tasks are spawned from anywhere
(a callback, a sync method) and live until they finish or the owner closes. A task that
fails is logged with its name, never lost. ``race`` is the other shape we need: run a few
awaitables, keep the first to finish, cancel the others; ``stoppable_thread`` runs file
work in a thread that a cancel stops and waits for.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")


class Owner:
    """A named set of tasks and child owners, closed together."""

    def __init__(self, name: str, close_within: float | None = None) -> None:
        self.name = name
        #: How long a close waits for the tasks after cancelling them (None: for ever);
        #: those still ending then are left to end in the background, and logged.
        self.close_within = close_within
        self._tasks: set[asyncio.Task[Any]] = set()
        self._children: list[Owner] = []
        self._closed = False

    def spawn(self, coro: Coroutine[Any, Any, T], name: str, *,
              report: bool = True) -> asyncio.Task[T]:
        """Run ``coro`` as a task of this owner until it returns or the owner closes. A
        failure is logged unless ``report`` is false (someone awaits the task for it)."""
        if self._closed:
            coro.close()
            raise RuntimeError(f"{self.name} is closed: cannot start {name}")
        task = asyncio.create_task(coro, name=f"{self.name}: {name}")
        self._tasks.add(task)
        task.add_done_callback(self._finished if report else self._tasks.discard)
        return task

    def tasks(self) -> set[asyncio.Task[Any]]:
        """This owner's live tasks (not its children's)."""
        return set(self._tasks)

    def child(self, name: str, close_within: float | None = None) -> Owner:
        """A sub-owner, closed (before this owner's own tasks) when this one closes."""
        owner = Owner(f"{self.name}/{name}", close_within)
        self._children.append(owner)
        return owner

    @property
    def closed(self) -> bool:
        return self._closed

    def __len__(self) -> int:
        return len(self._tasks)

    def tree(self) -> list[str]:
        """This owner's live tasks and its children's, by name (for logs and tests)."""
        names = sorted(t.get_name() for t in self._tasks)
        for child in self._children:
            names.extend(child.tree())
        return names

    async def aclose(self) -> None:
        """Close the children (last made first), then cancel this owner's tasks and wait
        for them all. Idempotent. Called from one of the tree's own tasks (a connection
        closed by one of its handlers), that task is neither cancelled nor waited for: it
        is the one closing, and goes on once the others are gone."""
        self._closed = True
        for owner in reversed(self._children):
            await owner.aclose()
        closing = asyncio.current_task()
        loop = asyncio.get_running_loop()
        deadline = None if self.close_within is None else loop.time() + self.close_within
        while tasks := [t for t in self._tasks if t is not closing]:
            for task in tasks:
                if not task.cancelling():  # once: a cleanup under way is not cut short
                    task.cancel()
            if deadline is None:
                await asyncio.gather(*tasks, return_exceptions=True)
                continue
            if deadline <= loop.time():
                log.warning("%s: %d tasks still ending after %gs, left to end: %s",
                            self.name, len(tasks), self.close_within,
                            ", ".join(sorted(t.get_name() for t in tasks)))
                return
            await asyncio.wait(tasks, timeout=deadline - loop.time())

    def _finished(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if task.cancelled():
            return
        error = task.exception()
        if error is not None:
            log.error("task %r failed: %r", task.get_name(), error, exc_info=error)


async def race(*contenders: Awaitable[T]) -> T:
    """The outcome (result or exception) of the first of ``contenders`` to finish; the
    others are cancelled and waited for before this returns."""
    tasks = [asyncio.ensure_future(c) for c in contenders]
    try:
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    winner = next(t for t in tasks if t in done)
    return winner.result()


async def stoppable_thread(fn: Callable[[threading.Event], T]) -> T:
    """``fn(stop)`` in a worker thread. A thread cannot be cancelled: when the caller is,
    ``stop`` is set and the thread waited for (``fn`` checks it between steps and gives
    up), so nothing it writes outlives the caller's cleanup."""
    stop = threading.Event()
    work = asyncio.ensure_future(asyncio.to_thread(fn, stop))
    try:
        return await asyncio.shield(work)
    except asyncio.CancelledError:
        stop.set()
        with contextlib.suppress(BaseException):
            await work
        raise
