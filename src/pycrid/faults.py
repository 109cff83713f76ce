"""Named fail points, so tests can make an operation fail at a chosen step.

The daemon reads ``PYCRID_FAILPOINTS`` (comma-separated) once at import:
``name`` makes ``failpoint(name)`` raise every time, ``name#N`` only the
first N times (a handler that is retried), and ``name:kill`` SIGKILLs the
daemon on the spot (a crash at exactly that step). With the variable unset
every call is a check of an empty set. containerd has the same idea (its
``failpoint`` package); the point is to prove that every step's undo runs and
that a crash anywhere is recovered.
"""

from __future__ import annotations

import os
import signal

from pycrid.errors import Internal


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
    if not _ACTIVE and not _COUNTED:
        return
    if name + ":kill" in _ACTIVE:
        os.kill(os.getpid(), signal.SIGKILL)
    left = _COUNTED.get(name, 0)
    if left > 0:
        _COUNTED[name] = left - 1
        raise Internal(f"failpoint {name} triggered ({left - 1} more)")
    if name in _ACTIVE:
        raise Internal(f"failpoint {name} triggered")
