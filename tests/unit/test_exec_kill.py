"""A cut-short exec kills what runc started, whether or not runc wrote the pid file yet.

A shell script stands in for ``runc exec``: it starts the "exec'd process" (a ``sleep``
with a marker argument) as its child and writes the pid file late or never, as a real
runc that is descheduled between starting the process and writing the file does
(tests/e2e/test_streaming.py drives the same moment with the real runc).
"""

from __future__ import annotations

import asyncio
import os
import secrets
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from pycrid.runtime import exec_kill
from pycrid.runtime.interactive import run_exec
from pycrid.runtime.runc_cli import CappedSink
from pycrid.stdio import ProcessIO


def _marker() -> str:
    return str(1_000_000 + secrets.randbelow(9_000_000))


def _running(marker: str) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    if f.read() == f"sleep\0{marker}\0".encode():
                        found.append(int(entry))
            except OSError:
                pass
    return found


async def _until(cond: Callable[[], object], what: str, limit: float = 10) -> None:
    for _ in range(int(limit / 0.02)):
        if cond():
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


def _io() -> ProcessIO:
    return ProcessIO(tty=False, stdin=None, stdout=CappedSink(1 << 16), stderr=None,
                     resize=None)


#: "runc": starts the process (optionally in a session of its own, as a TTY exec is),
#: writes the pid file after ``$2`` seconds (never, for "never"), waits for it.
FAKE_RUNC = """#!/bin/sh
marker=$1 late=$2 pidfile=$3 session=$4
if [ "$session" = 1 ]; then setsid sleep "$marker" & else sleep "$marker" & fi
child=$!
if [ "$late" != never ]; then
  sleep "$late"; echo $child > "$pidfile.tmp"; mv "$pidfile.tmp" "$pidfile"
fi
wait
"""


@pytest.mark.parametrize(("late", "session"), [("never", False), ("never", True),
                                               ("0", False), ("0", True)])
async def test_a_cancelled_exec_leaves_no_process(tmp_path: Path, late: str,
                                                  session: bool) -> None:
    script = tmp_path / "runc"
    script.write_text(FAKE_RUNC)
    pid_path = str(tmp_path / "pid")
    marker = _marker()
    task = asyncio.ensure_future(run_exec(
        ["sh", str(script), marker, late, pid_path, "1" if session else "0"], pid_path, _io()))
    await _until(lambda: _running(marker), "the process to start")
    if late != "never":
        await _until(lambda: os.path.exists(pid_path), "the pid file")
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    # Killed before run_exec returned: not a moment later.
    assert _running(marker) == []


async def test_runc_stopped_while_its_children_are_killed_starts_nothing_more(
        tmp_path: Path) -> None:
    """Without the pid file runc is stopped first: a "runc" that would start a second
    process a moment later never does."""
    script = tmp_path / "runc"
    first, second = _marker(), _marker()
    script.write_text(f"#!/bin/sh\nsleep {first} &\nsleep 0.5\nsleep {second} &\nwait\n")
    pid_path = str(tmp_path / "pid")
    task = asyncio.ensure_future(run_exec(["sh", str(script)], pid_path, _io()))
    await _until(lambda: _running(first), "the first process")
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await asyncio.sleep(1)
    assert _running(first) == [] and _running(second) == []


async def test_an_exec_that_ends_is_not_killed(tmp_path: Path) -> None:
    out = CappedSink(100)
    code = await run_exec(["sh", "-c", "echo hi; exit 3"], str(tmp_path / "pid"),
                          ProcessIO(tty=False, stdin=None, stdout=out, stderr=None,
                                    resize=None))
    assert (code, bytes(out.data)) == (3, b"hi\n")


def test_exec_processes_follow_parentage_and_groups(tmp_path: Path) -> None:
    """A child that left runc's group (setsid) is still found, by its parent."""
    marker = _marker()
    runc = subprocess.Popen(["sh", "-c", f"setsid sleep {marker} & wait"],
                            start_new_session=True)
    try:
        for _ in range(500):
            if _running(marker):
                break
            time.sleep(0.01)
        (child,) = _running(marker)
        assert os.getpgid(child) != runc.pid
        assert child in exec_kill.exec_processes(runc.pid, None)
        assert runc.pid not in exec_kill.exec_processes(runc.pid, None)
    finally:
        for pid in _running(marker):
            os.kill(pid, 9)
        runc.kill()
        runc.wait()
