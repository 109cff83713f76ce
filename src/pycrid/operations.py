"""Operations that outlive their caller, and the steps at which they may stop.

A gRPC handler is cancelled the moment its client goes away (the kubelet's deadline for
RunPodSandbox passed, ``crictl`` was interrupted). Cancelled in the middle of a step, an
operation leaves that step half done: a netns made by a thread that goes on without
it, a conmon that creates its container after the undo deleted it. So the mutating CRI
calls run as tasks of their own (``Operations.run``): the client's cancellation never
reaches them. A call that builds something (RunPodSandbox, CreateContainer) is told
instead, through its ``CancelScope``, and stops at its next named step
(``checkpoint``), where its undo stack knows exactly what exists; the others complete.
Either way what is recorded is the truth. containerd gets the same effect by running
its deferred cleanups with a fresh context (``util.DeferContext``) after the request's
is cancelled.

``finish`` awaits a step to its end through cancellations (undo steps, threads and
child processes that would go on without us); ``interruptible`` lets a step whose own
cancellation is clean (a pull removes its scratch snapshots) stop as soon as the client
has gone. A CNI ADD is not one: a plugin killed half-way may leave the host's network
broken (see core/pods/run.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import logging
import threading
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, Concatenate, ParamSpec, Protocol, TypeVar

from pycrid.errors import Cancelled
from pycrid.tasks import Owner

log = logging.getLogger(__name__)

T = TypeVar("T")
P = ParamSpec("P")

#: How long a stop of the daemon lets operations reach their next step and undo (or
#: finish) before they are cancelled outright (recovery at the next start does the rest).
CLOSE_WITHIN = 30.0


class CancelScope:
    """One operation's "your client went away", readable from its worker threads too."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._flag = threading.Event()
        self._event = asyncio.Event()

    @property
    def requested(self) -> bool:
        return self._flag.is_set()

    def request(self) -> None:
        """On the event loop: stop at the next step."""
        self._flag.set()
        self._event.set()

    async def wait(self) -> None:
        await self._event.wait()

    def wait_blocking(self, timeout: float) -> bool:
        """In a worker thread: until requested, at most ``timeout`` seconds."""
        return self._flag.wait(timeout)


_current: contextvars.ContextVar[CancelScope | None] = contextvars.ContextVar(
    "pycrid operation", default=None)


def current_scope() -> CancelScope | None:
    """The scope of the operation running here (threads it started included), if any."""
    return _current.get()


def beyond_operation(fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
    """``fn`` called outside the running operation's scope: for what it registers that
    outlives the operation (a loop reader, a timer, a task), which copies the context
    it is made in and must not be stopped later because that client went away."""
    ctx = contextvars.copy_context()
    ctx.run(_current.set, None)
    return ctx.run(fn, *args, **kwargs)


def checkpoint(step: str) -> None:
    """Between two steps: raise ``Cancelled`` if the operation's client went away, so its
    undo runs from a known point."""
    scope = _current.get()
    if scope is not None and scope.requested:
        raise Cancelled(f"{scope.name}: the client went away; stopped at step {step} "
                        "and undone")


class Operations:
    """Runs each mutating CRI call as a task of ``owner``, shielded from its caller."""

    def __init__(self, owner: Owner, close_within: float = CLOSE_WITHIN) -> None:
        self._owner = owner
        self._close_within = close_within
        self._scopes: dict[asyncio.Task[Any], CancelScope] = {}

    async def run(self, name: str, coro: Coroutine[Any, Any, T], *,
                  undo_on_cancel: bool = False) -> T:
        """``coro``'s result. If the caller is cancelled, the call goes on: with
        ``undo_on_cancel`` it stops at its next step and undoes itself, otherwise it
        completes. Either way its outcome is logged, since nobody else hears it."""
        scope = CancelScope(name) if undo_on_cancel else None

        async def body() -> T:
            if scope is not None:
                _current.set(scope)  # this task's own context, and what it starts
            return await coro

        task: asyncio.Task[T] = self._owner.spawn(body(), name, report=False)
        if scope is not None:
            self._scopes[task] = scope
            task.add_done_callback(self._scopes.pop)
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            if task.done():
                raise  # cancelled itself (the daemon is stopping)
            if scope is not None:
                scope.request()
            task.add_done_callback(_orphaned_outcome)
            raise

    async def aclose(self) -> None:
        """Ask every cancellable operation to stop at its next step, let them all end
        (at most ``close_within``), then cancel what is left."""
        for scope in self._scopes.values():
            scope.request()
        tasks = self._owner.tasks()
        if tasks:
            await asyncio.wait(tasks, timeout=self._close_within)
        await self._owner.aclose()


class HasOperations(Protocol):
    """What the core's operation functions take first (ContainerParts, PodParts)."""

    @property
    def operations(self) -> Operations: ...


PartsT = TypeVar("PartsT", bound=HasOperations)


def detached(name: str, *, undo_on_cancel: bool = False) -> Callable[
        [Callable[Concatenate[PartsT, P], Coroutine[Any, Any, T]]],
        Callable[Concatenate[PartsT, P], Awaitable[T]]]:
    """Make a core operation (a function of its parts) run through ``parts.operations``."""
    def wrap(fn: Callable[Concatenate[PartsT, P], Coroutine[Any, Any, T]]
             ) -> Callable[Concatenate[PartsT, P], Awaitable[T]]:
        @functools.wraps(fn)
        async def call(parts: PartsT, /, *args: P.args, **kwargs: P.kwargs) -> T:
            return await parts.operations.run(name, fn(parts, *args, **kwargs),
                                              undo_on_cancel=undo_on_cancel)
        return call
    return wrap


class Undo(contextlib.AsyncExitStack):
    """An operation's undo stack whose async steps each run to their end (``finish``):
    a cancellation landing inside one (the daemon stopping) is raised after it, and the
    steps below it still run. Every step must be idempotent: it may be pushed before
    the step it undoes, so a step cut short is undone too."""

    def push_async_callback(self, callback: Callable[P, Awaitable[T]], /,
                            *args: P.args, **kwds: P.kwargs) -> Callable[P, Awaitable[T]]:
        async def whole(*a: P.args, **k: P.kwargs) -> T:
            return await finish(callback(*a, **k))

        super().push_async_callback(whole, *args, **kwds)
        return callback

    async def __aexit__(self, *exc: Any) -> bool | None:
        # The steps undo whatever the cancellation left: they run outside its scope, so
        # a named step inside one does not stop it half-way.
        token = _current.set(None)
        try:
            return await super().__aexit__(*exc)
        finally:
            _current.reset(token)


def _orphaned_outcome(task: asyncio.Task[Any]) -> None:
    """How a call whose client had gone away ended."""
    if task.cancelled():
        log.warning("%s: cancelled while its client was gone", task.get_name())
    elif (error := task.exception()) is None:
        log.info("%s: completed after its client had gone", task.get_name())
    elif isinstance(error, Cancelled):
        log.info("%s", error)
    else:
        log.warning("%s: failed after its client had gone: %s", task.get_name(), error)


async def finish(aw: Awaitable[T]) -> T:
    """``aw`` run to its end even if the caller is cancelled meanwhile; the cancellation
    is raised once it has ended. For steps that must not stop half-way: an undo step, a
    thread or a child process that would go on without us."""
    task = asyncio.ensure_future(aw)
    interrupted = False
    while not task.done():
        try:
            await asyncio.shield(task)
        except asyncio.CancelledError:
            if not task.done():
                interrupted = True
    if interrupted:
        if not task.cancelled() and (failed := task.exception()) is not None:
            # The undo that follows handles what it did; the cancellation is the answer.
            log.warning("a step failed while its operation was being cancelled: %s", failed)
        raise asyncio.CancelledError
    return task.result()


async def interruptible(aw: Awaitable[T]) -> T:
    """``aw``, cancelled as soon as the operation's client goes away (then ``Cancelled``
    is raised): only for steps whose cancellation leaves nothing behind."""
    scope = _current.get()
    if scope is None:
        return await aw
    task = asyncio.ensure_future(aw)
    stop = asyncio.ensure_future(scope.wait())
    try:
        await asyncio.wait({task, stop}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stop.cancel()
        if not task.done():
            task.cancel()
            await _settle(task)
    if task.cancelled():
        raise Cancelled(f"{scope.name}: the client went away; stopped and undone")
    return task.result()


async def _settle(task: asyncio.Future[Any]) -> None:
    """Until ``task`` has ended, through cancellations of the waiter (re-raised after)."""
    interrupted = False
    while not task.done():
        try:
            await asyncio.wait({task})
        except asyncio.CancelledError:
            interrupted = True
    if interrupted:
        raise asyncio.CancelledError
