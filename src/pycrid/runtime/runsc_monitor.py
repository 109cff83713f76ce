"""What conmon watches for a gVisor sub-container, and how the daemon starts one.

runsc runs every container of a pod in the pod's one sandbox process. The pod's first
container (the pause) makes that sandbox: ``runsc create`` writes the sandbox's pid to
its pid file, the sandbox becomes conmon's child (conmon is a subreaper) and conmon
watches it as it watches a runc init. The pod's other containers are sub-containers
(``io.kubernetes.cri.container-type: container`` and ``io.kubernetes.cri.sandbox-id``,
runsc/specutils/cri.go): their ``runsc create`` exits with no process left behind and
writes the *sandbox's* pid, which is not conmon's child. conmon then finds no child at
all and records an exit at once. And unlike runc, runsc hands a sub-container the stdio
of ``runsc start``, not of ``runsc create`` (runsc/container/container.go Start).

gVisor's containerd shim answers both by passing the container's pipes to ``runsc
start`` and waiting with ``runsc wait`` (pkg/shim/proc/init.go). Under conmon the same
is done by a small monitor that conmon runs as the OCI runtime (``MONITOR``, POSIX sh):
it runs ``runsc create``, then leaves a child behind that holds conmon's pipes as its
stdio, writes that child's pid to conmon's pid file and exits. The child waits on a FIFO
in the bundle for the daemon's word; the daemon runs ``runsc start`` with the child's
stdio (``/proc/<child>/fd/0-2``: the very pipes conmon reads and attaches to), says go,
and the child turns into ``runsc wait`` and exits with the container's status, which
conmon records as for any container. So logs, attach, reopen and exit files are
conmon's, unchanged.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os

from pycrid.runtime.monitors import read_pid_file

#: The monitor. Called by conmon as ``sh -c MONITOR pycrid-runsc-monitor RUNSC FLAGS...
#: create --bundle B --pid-file P [--console-socket S] ID``.
MONITOR = r"""
runsc=$1; shift
bundle= pidfile= id= prev=
for a do
  case $prev in --bundle) bundle=$a ;; --pid-file) pidfile=$a ;; esac
  prev=$a id=$a
done
go=$bundle/runsc-go
rm -f "$go" && mkfifo -m 600 "$go" || exit 125
prev=
for a do
  shift
  [ "$prev" = --pid-file ] && a=$a.sandbox
  set -- "$@" "$a"
  prev=$a
done
"$runsc" "$@" || { status=$?; rm -f "$go"; exit "$status"; }
keep=1
for a do
  shift
  [ "$a" = create ] && keep=0
  [ "$keep" = 1 ] && set -- "$@" "$a"
done
exec 3<&0
(
  exec 0<&3 3<&-
  trap '' HUP INT QUIT TERM
  read -r _ <"$go" || :
  rm -f "$go"
  out=$("$runsc" "$@" wait "$id" </dev/null 2>>"$bundle/runsc-wait.log")
  status=${out##*'"exitStatus":'}
  status=${status%%[!0-9]*}
  exit "${status:-137}"
) &
echo "$!" >"$pidfile"
"""
#: $0 of the monitor, so it shows as itself in ps.
NAME = "pycrid-runsc-monitor"
#: The FIFO the monitor's child waits on, in the bundle.
GO_FIFO = "runsc-go"
#: How long the daemon waits for the monitor's child to open the FIFO.
_GO_WAIT = 10.0


def sandbox_pid_file(bundle: str) -> str:
    """Where ``runsc create`` of a sub-container wrote the sandbox's pid (beside conmon's
    pid file, which holds the monitor's child)."""
    return os.path.join(bundle, "pidfile.sandbox")


def monitor_pid(bundle: str) -> int:
    return read_pid_file(os.path.join(bundle, "pidfile"))


def open_stdio(pid: int) -> list[int]:
    """The monitor child's stdin, stdout and stderr (conmon's pipes), opened anew through
    /proc; the caller closes them."""
    fds: list[int] = []
    try:
        for n, mode in ((0, os.O_RDONLY), (1, os.O_WRONLY), (2, os.O_WRONLY)):
            fds.append(os.open(f"/proc/{pid}/fd/{n}", mode | os.O_CLOEXEC))
    except OSError:
        for fd in fds:
            os.close(fd)
        raise
    return fds


async def say(bundle: str, word: str) -> bool:
    """Wake the monitor's child, which then becomes ``runsc wait`` (``word``, start or
    stop, is for the log: after a start it waits for the container's exit, after a
    delete runsc answers at once). False when no child listens (it is gone)."""
    path = os.path.join(bundle, GO_FIFO)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + _GO_WAIT
    while True:
        try:
            fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC)
            break
        except FileNotFoundError:
            return False
        except OSError as e:
            # ENXIO: nobody has it open for reading yet (the child is on its way).
            if e.errno != errno.ENXIO or loop.time() > deadline \
                    or not _alive(monitor_pid(bundle)):
                return False
            await asyncio.sleep(0.005)
    try:
        os.write(fd, f"{word}\n".encode())
    except OSError:
        return False
    finally:
        os.close(fd)
    return True


def _alive(pid: int) -> bool:
    if pid <= 0:
        return False
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, 0)
        return True
    return False
