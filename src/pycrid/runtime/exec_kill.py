"""Ending an exec that is cut short (the client left, ExecSync's timeout): everything
``runc exec`` started, then runc.

runc writes the exec's pid file only after the process runs: ``runc exec`` returns
from starting it when the process has exec'd (the sync socket closes on exec), then
writes the file. On this machine the gap was 0-1.5 ms idle and 70 ms under CPU load, so
a cancellation can land while the process runs and the file is not there yet. Killing
runc alone then leaves the process running, reparented and out of reach. So the
processes are found by parentage as well as by the pid file: runc starts the exec's
process as its own child (its ``runc init`` stages clone with CLONE_PARENT), in runc's
process group unless it makes a session (a TTY). When the file is missing, runc is
stopped (SIGSTOP) before the search, so it starts nothing more while its children are
found and killed, and is then killed itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from pycrid.runtime.monitors import read_pid_file

#: After its process was killed, how long runc may take to reap it and exit before it
#: is killed too.
KILL_GRACE = 5.0
#: Searches for runc's children while it is stopped: a child killed while it was
#: cloning may have made one more (runc init's stages), which the next search finds.
_SEARCHES = 10

#: Ends an exec'd process the runtime keeps out of the host's reach (gVisor's runsc
#: exec: the process lives in the sandbox, and its pid file names runsc itself).
Stopper = Callable[[], Awaitable[None]]


async def kill_exec(pid_path: str, proc: asyncio.subprocess.Process,
                    stop: Stopper | None = None) -> None:
    """Kill what is left of the exec (nothing, after a normal exit) and return only once
    runc is gone, so a timed-out ExecSync answers with its process already dead (the
    kubelet's exec probes rely on it).

    With the pid file there, runc has started the process and starts nothing more: the
    exec's processes go first and runc, their reaper (a child subreaper), collects them
    and exits. Killing runc at the same moment would leave them to be reaped by others,
    and a container's init may never reap what is handed to it (a ``sleep`` as pid 1
    leaves zombies that ``ps`` still lists). runc itself is killed only if it does not
    follow within ``KILL_GRACE``. Without the file, runc is stopped first (see above)."""
    if proc.returncode is not None:
        return
    if stop is not None:
        with contextlib.suppress(Exception):
            await stop()
    started = read_pid_file(pid_path) or None
    if started is None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGSTOP)
        killed: set[int] = set()
        for _ in range(_SEARCHES):
            victims = exec_processes(proc.pid, None) - killed
            if not victims:
                break
            _kill_all(victims)
            killed |= victims
    else:
        victims = exec_processes(proc.pid, started)
        _kill_all(victims)
        if victims:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(proc.wait()), KILL_GRACE)
    if proc.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        await proc.wait()


def _kill_all(pids: set[int]) -> None:
    for pid in sorted(pids):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


@dataclass(frozen=True)
class _Proc:
    ppid: int
    pgid: int
    zombie: bool


def _processes() -> dict[int, _Proc]:
    """Every process's parent, process group and whether it is a zombie, from /proc."""
    table: dict[int, _Proc] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        # "pid (comm) state ppid pgrp ...": comm may hold spaces and parentheses.
        fields = stat[stat.rfind(b")") + 2:].split()
        if len(fields) >= 3:
            table[int(entry)] = _Proc(ppid=int(fields[1]), pgid=int(fields[2]),
                                      zombie=fields[0] == b"Z")
    return table


def exec_processes(runc_pid: int, started: int | None) -> set[int]:
    """The live processes the exec made, runc excepted (host pids): the one its pid file
    names (``started``), runc's descendants, and every member of runc's process group or
    of a group one of those leads (a TTY exec's session)."""
    table = _processes()
    found = {started} if started is not None and started in table else set()
    children: dict[int, list[int]] = {}
    for pid, p in table.items():
        children.setdefault(p.ppid, []).append(pid)
    todo = [runc_pid]
    while todo:
        for child in children.get(todo.pop(), ()):
            if child not in found:
                found.add(child)
                todo.append(child)
    groups = {runc_pid} | {table[pid].pgid for pid in found}
    found |= {pid for pid, p in table.items() if p.pgid in groups}
    return {pid for pid in found if pid != runc_pid and not table[pid].zombie}
