"""Signalling a container's init without spawning ``runc kill``.

``runc kill ID SIG`` reads ``<root>/<id>/state.json``, checks that the recorded init pid
still has the recorded start time (so a reused pid is never hit) and signals it. Doing the
same here saves a Go process start (about 6 ms and most of a CPU-millisecond of runc) on
every StopContainer and StopPodSandbox. A pidfd is opened before the check, so the process
that passed it is the one signalled, even if it dies and its pid is reused in between.

Where runc does more than signal the init, the caller still runs ``runc kill``:
SIGKILL of a container without a private PID namespace (newer runc kills every process of
its cgroup then), a frozen container (runc thaws it after SIGKILL), or any state this code
does not understand.
"""

from __future__ import annotations

import json
import os
import signal
from typing import Any


def _start_time(pid: int) -> int | None:
    """Field 22 of /proc/PID/stat (clock ticks after boot), as runc records it."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read()
    except OSError:
        return None
    fields = raw.rsplit(b")", 1)[-1].split()
    try:
        return int(fields[19])
    except (IndexError, ValueError):
        return None


def _private_pid_namespace(state: dict[str, Any]) -> bool:
    for ns in (state.get("config") or {}).get("namespaces") or []:
        if isinstance(ns, dict) and ns.get("type") == "NEWPID":
            return not ns.get("path")
    return False


def signal_init(runc_root: str, object_id: str, sig: int) -> bool | None:
    """True: signalled. False: its init is gone (runc would say "not running").
    None: not decided here; run ``runc kill``."""
    try:
        with open(os.path.join(runc_root, object_id, "state.json"), "rb") as f:
            state = json.load(f)
        pid = int(state["init_process_pid"])
        start = int(state["init_process_start"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if sig == signal.SIGKILL and not _private_pid_namespace(state):
        return None
    try:
        pidfd = os.pidfd_open(pid)
    except ProcessLookupError:
        return False
    except OSError:
        return None
    try:
        if _start_time(pid) != start:
            return False  # the init is gone and its pid belongs to someone else now
        if sig == signal.SIGKILL and _frozen(state):
            return None
        signal.pidfd_send_signal(pidfd, sig)
        return True
    except ProcessLookupError:
        return False
    finally:
        os.close(pidfd)


def _frozen(state: dict[str, Any]) -> bool:
    """cgroup v1 freezer state FROZEN/FREEZING, or v2 cgroup.freeze 1 (runc pause)."""
    paths = state.get("cgroup_paths") or {}
    for name, rel in (("freezer", "freezer.state"), ("", "cgroup.freeze")):
        base = paths.get(name)
        if not base:
            continue
        try:
            with open(os.path.join(base, rel)) as f:
                value = f.read().strip()
        except OSError:
            continue
        if value in ("FROZEN", "FREEZING", "1"):
            return True
    return False
