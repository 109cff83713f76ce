"""``runc checkpoint`` with CRIU, and what a CRIU failure left in its log.

runc runs ``criu`` from its PATH (runc 1.1 also has a global ``--criu`` flag, runc 1.5
has none), and conmon passes its own PATH on to ``runc restore``. So the daemon keeps a
directory holding only a ``criu`` link to the binary checked at start, and puts it
first on the PATH of both: whatever ``criu_path`` names, the same CRIU runs.

The flags are CRI-O's (internal/oci/runtime_oci.go, ``CheckpointContainer``):
``--leave-running`` because forensic checkpointing never stops the container (containerd
passes the same through its shim), and ``--file-locks`` so a process holding a lock does
not make the dump fail. Established TCP connections, external unix sockets and shell
jobs are refused by CRIU, as in both.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from dataclasses import dataclass

from pycrid.host import criu
from pycrid.host.binaries import search_path as binary_search_path
from pycrid.host.criu import CriuSupport
from pycrid.runtime.interface import CheckpointPaths

#: CRIU's logs: in the work path for a dump, in the bundle (conmon's work path) for a
#: restore (checkpointctl's DumpLogFile and RestoreLogFile).
DUMP_LOG = "dump.log"
RESTORE_LOG = "restore.log"


@dataclass(frozen=True)
class CheckpointSupport:
    """What checkpointing needs: the host's CRIU (checked at start) and a runc that says
    it can use it (``runc features``: org.opencontainers.runc.checkpoint.enabled)."""

    criu: CriuSupport = CriuSupport()
    runc_can: bool = False


NO_CHECKPOINTS = CheckpointSupport()


def criu_path_dir(state_dir: str, criu: CriuSupport) -> str:
    """``<state>/criu``, holding a ``criu`` link to the checked binary ("" when CRIU
    does not work: nothing would run it)."""
    if not criu.works or not criu.path:
        return ""
    d = os.path.join(state_dir, "criu")
    os.makedirs(d, mode=0o700, exist_ok=True)
    link = os.path.join(d, "criu")
    tmp = link + ".new"
    with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp)
    os.symlink(os.path.abspath(criu.path), tmp)
    os.replace(tmp, link)
    return d


def search_path(criu_dir: str) -> str:
    """The PATH runc and conmon get when they may run CRIU."""
    return f"{criu_dir}:{binary_search_path()}" if criu_dir else binary_search_path()


def checkpoint_args(object_id: str, paths: CheckpointPaths) -> list[str]:
    return ["checkpoint", "--leave-running", "--file-locks", "--image-path", paths.images,
            "--work-path", paths.work, object_id]


async def run(argv: list[str], path_env: str) -> tuple[int, bytes]:
    """Run ``argv`` in a session of its own: a cancel (the request's timeout) kills it and
    the CRIU it started, together. (exit code, stderr)."""
    proc = await asyncio.create_subprocess_exec(
        *argv, env={"PATH": path_env}, start_new_session=True,
        stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE)
    try:
        _, err = await proc.communicate()
    except BaseException:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        await asyncio.shield(proc.wait())
        raise
    return (proc.returncode if proc.returncode is not None else -1), err


#: Error lines every failed run has, which say nothing of why: CRIU adjusting its own
#: rlimit without CAP_SYS_RESOURCE, the summary, and its cgroup helper going away after.
_NOISE = ("rlimit:", "Dumping FAILED", "Restoring FAILED", "cg: cgroupd:")


def criu_errors(log_path: str, limit: int = 2) -> str:
    """The first ``Error`` lines of a CRIU log (the first is the cause, the rest follow
    from it), without their source locations; "" when the log is missing or says none."""
    try:
        with open(log_path, errors="replace") as f:
            found = [e for e in criu.error_lines(f) if not e.startswith(_NOISE)]
    except OSError:
        return ""
    return "; ".join(found[:limit])
