"""What /proc says about the runtime under test: who owns its socket, the memory of a
process, the per-container monitor processes, connections on a unix socket."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Collection
from typing import Any

from pycrid import unixsock


def memory_kib(pid: int) -> tuple[int, int]:
    """(RSS, PSS) of a process in KiB, from /proc/PID/status and /proc/PID/smaps_rollup."""
    rss = pss = 0
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1])
    with open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            if line.startswith("Pss:"):
                pss = int(line.split()[1])
    return rss, pss


def comm_of(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return ""


def command_line(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _pids() -> list[int]:
    return [int(e) for e in os.listdir("/proc") if e.isdigit()]


def _mentions(pid: int, words: Collection[str]) -> bool:
    cmd = command_line(pid)
    return any(w in cmd for w in words)


def monitor_pids(ours: Collection[str] | None = None) -> set[int]:
    """Per-container monitor processes: ``conmon`` (pycrid, CRI-O) or ``containerd-shim*``;
    with ``ours`` (ids and directories), only those whose command line names one of them
    (conmon takes ``--cid``, a shim ``-id``: another runtime's monitors are not ours)."""
    found = set()
    for pid in _pids():
        comm = comm_of(pid)
        if (comm == "conmon" or comm.startswith("containerd-shim")) and (
                ours is None or _mentions(pid, ours)):
            found.add(pid)
    return found


def runc_pids(ours: Collection[str] | None = None) -> set[int]:
    return {p for p in _pids() if comm_of(p) == "runc" and (ours is None or _mentions(p, ours))}


def processes_mentioning(text: str) -> list[int]:
    """Processes but this one whose command line contains ``text``."""
    return [p for p in _pids() if p != os.getpid() and text in command_line(p)]


def wait_gone(pids: Collection[int], timeout: float = 10.0) -> None:
    """Give exiting monitors a moment: conmon outlives its container by a few ms."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(os.path.exists(f"/proc/{p}") for p in pids):
        time.sleep(0.05)


def _unix_sockets(path: str) -> list[tuple[int, str]]:
    """(flags, inode) of every /proc/net/unix entry bound at ``path``."""
    path = os.path.normpath(path)  # a server may bind "///run/x.sock"
    found = []
    with open("/proc/net/unix") as f:
        next(f)
        for line in f:
            parts = line.split()
            if len(parts) >= 8 and os.path.normpath(parts[7]) == path:
                found.append((int(parts[3], 16), parts[6]))
    return found


def socket_owner(path: str) -> int | None:
    """The pid listening on the unix socket at ``path`` (any runtime's)."""
    return unixsock.listener_pid(path)


def accepted_connections(path: str) -> int:
    """Connections a server has accepted on its socket at ``path``: an accepted unix socket
    carries its listener's path in /proc/net/unix (the dialling end has none), and the
    entry goes away only once the server has closed its end."""
    return max(len(_unix_sockets(path)) - 1, 0)  # minus the listener


def first_line(cmd: list[str]) -> str:
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=10)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"unknown ({e})"
    return (out.stdout or out.stderr).strip().split("\n")[0]


def host_info(runc: str, conmon: str | None = None) -> dict[str, Any]:
    """Kernel, cpus, Python and the runc (and conmon) versions, for the report."""
    info = {"kernel": os.uname().release, "cpus": os.cpu_count(),
            "python": sys.version.split()[0], "runc": first_line([runc, "--version"])}
    if conmon:
        info["conmon"] = first_line([conmon, "--version"])
    return info


def _interrupt(_signum: int, _frame: Any) -> None:
    raise KeyboardInterrupt


def arm_signals() -> None:
    """SIGTERM and SIGINT both unwind through the cleanup, even if started ignoring them."""
    signal.signal(signal.SIGTERM, _interrupt)
    signal.signal(signal.SIGINT, signal.default_int_handler)


def mounts_under(path: str) -> list[str]:
    """Mount points at or below ``path`` (for leak checks)."""
    out = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            mp = line.split()[4].replace("\\040", " ")
            if mp == path or mp.startswith(path.rstrip("/") + "/"):
                out.append(mp)
    return out
