"""Named fail points, so tests can make an operation fail at a chosen step.

The daemon reads ``PYCRID_FAILPOINTS`` (comma-separated names) once at import;
``failpoint(name)`` raises there, or, for ``name:kill``, SIGKILLs the daemon on
the spot (a crash at exactly that step). With the variable unset every call is
a set lookup on an empty set. containerd has the same idea (its ``failpoint``
package); the point is to prove that every step's undo runs.
"""

from __future__ import annotations

import os
import signal

from pycrid.errors import Internal

_ACTIVE = frozenset(p for p in os.environ.get("PYCRID_FAILPOINTS", "").split(",") if p)


def failpoint(name: str) -> None:
    if not _ACTIVE:
        return
    if name + ":kill" in _ACTIVE:
        os.kill(os.getpid(), signal.SIGKILL)
    if name in _ACTIVE:
        raise Internal(f"failpoint {name} triggered")
