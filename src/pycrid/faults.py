"""Named fail points, so tests can make an operation fail at a chosen step.

The daemon reads ``PYCRID_FAILPOINTS`` (comma-separated) once at import:
``name`` makes ``failpoint(name)`` raise every time, ``name#N`` only the
first N times (a handler that is retried), ``name:kill`` SIGKILLs the
daemon on the spot (a crash at exactly that step), and ``name:stall`` holds
the operation there until its client has gone (its deadline passed; at most
``STALL_LIMIT`` seconds), so a test can cancel a call at exactly that step. With
the variable unset every call is a check of an empty set. containerd has the same
idea (its ``failpoint`` package); the point is to prove that every step's undo runs
and that a crash or a cancellation anywhere leaves nothing behind.

Every fail point is also a cancellation point (``operations.checkpoint``): an
operation whose client went away stops at its next named step.
"""

from __future__ import annotations

import asyncio
import os
import signal

from pycrid.errors import Internal
from pycrid.operations import checkpoint, current_scope

#: The longest a ``:stall`` fail point waits for its client to go away.
STALL_LIMIT = 30.0


def _parse(spec: str) -> tuple[frozenset[str], dict[str, int]]:
    always: set[str] = set()
    counted: dict[str, int] = {}
    for item in filter(None, (p.strip() for p in spec.split(","))):
        name, sep, times = item.partition("#")
        if sep and times.isdigit():
            counted[name] = int(times)
        else:
            always.add(item)
    return frozenset(always), counted


_ACTIVE, _COUNTED = _parse(os.environ.get("PYCRID_FAILPOINTS", ""))


def failpoint(name: str) -> None:
    """A named step of an operation, run in a worker thread or on the loop (where a
    ``:stall`` needs ``step``)."""
    if _ACTIVE or _COUNTED:
        if name + ":stall" in _ACTIVE:
            _stall_blocking(name)
        _fault(name)
    checkpoint(name)


async def step(name: str) -> None:
    """A named step on the event loop: ``failpoint``, with ``:stall`` waiting without
    blocking the loop."""
    if _ACTIVE and name + ":stall" in _ACTIVE and (scope := current_scope()) is not None:
        try:
            await asyncio.wait_for(scope.wait(), STALL_LIMIT)
        except TimeoutError:
            pass
    if _ACTIVE or _COUNTED:
        _fault(name)
    checkpoint(name)


def _stall_blocking(name: str) -> None:
    try:
        asyncio.get_running_loop()
    except RuntimeError:  # a worker thread: it may block
        if (scope := current_scope()) is not None:
            scope.wait_blocking(STALL_LIMIT)
        return
    raise Internal(f"fail point {name}:stall is on the event loop: it needs `await step()`")


def _fault(name: str) -> None:
    if name + ":kill" in _ACTIVE:
        os.kill(os.getpid(), signal.SIGKILL)
    left = _COUNTED.get(name, 0)
    if left > 0:
        _COUNTED[name] = left - 1
        raise Internal(f"failpoint {name} triggered ({left - 1} more)")
    if name in _ACTIVE:
        raise Internal(f"failpoint {name} triggered")
