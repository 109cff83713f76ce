"""Namespaces pinned on files: made by a short-lived thread, kept by a bind mount.

A namespace lives as long as something holds it: a process in it, an open
descriptor, or a bind mount of its ``/proc/.../ns/<kind>`` file. A pinned
namespace needs no process at all (CRI-O's ``pinns``). Namespaces belong to
threads, so a thread of our own can ``unshare`` new ones (network, IPC, UTS
may be unshared by one thread of a threaded process), set them up from inside,
pin them and end; the rest of the daemon never leaves its own.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import os
import threading
from collections.abc import Callable, Mapping
from typing import TypeVar

from pycrid.errors import Internal
from pycrid.host.mounts import Mount, mount, unmount

T = TypeVar("T")

_libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
#: clone(2) flags by /proc/<pid>/ns file name.
CLONE_FLAGS = {"net": 0x40000000, "ipc": 0x08000000, "uts": 0x04000000}


def in_own_thread(work: Callable[[], T], name: str) -> T:
    """``work()`` in a thread of its own that ends with it: a thread that joined or made
    a namespace must never run other work."""
    result: list[T] = []
    failure: list[BaseException] = []

    def run() -> None:
        try:
            result.append(work())
        except BaseException as e:
            failure.append(e)

    t = threading.Thread(target=run, name=name)
    t.start()
    t.join()
    if failure:
        raise failure[0]
    return result[0]


def unshare(kinds: int) -> None:
    if _libc.unshare(kinds) != 0:
        err = ctypes.get_errno()
        raise Internal(f"unshare(0x{kinds:x}): {os.strerror(err)}")


def setns(path: str, kind: str) -> None:
    """Move the calling thread into the namespace pinned at ``path``."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        if _libc.setns(fd, CLONE_FLAGS[kind]) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"setns {path}: {os.strerror(err)}")
    finally:
        os.close(fd)


def pin_new(paths: Mapping[str, str], setup: Callable[[], None] = lambda: None,
            join: Mapping[str, str] | None = None) -> None:
    """New namespaces of the kinds in ``paths`` (``net``, ``ipc``, ``uts``), each pinned at
    its path (a new file). ``join`` names existing pinned namespaces to enter first;
    ``setup`` runs inside all of them before they are pinned (raise ``lo``, set the
    hostname, write sysctls). On failure nothing stays pinned."""
    for path in paths.values():
        os.makedirs(os.path.dirname(path), mode=0o711, exist_ok=True)
        os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDONLY, 0o444))

    def work() -> None:
        for kind, path in (join or {}).items():
            setns(path, kind)
        flags = 0
        for kind in paths:
            flags |= CLONE_FLAGS[kind]
        unshare(flags)
        setup()
        for kind, path in paths.items():
            mount(Mount("bind", f"/proc/thread-self/ns/{kind}"), path)

    try:
        in_own_thread(work, "pin-" + "-".join(paths))
    except BaseException as err:
        for path in paths.values():
            unpin(path)
        if isinstance(err, Internal):
            raise
        raise Internal(f"pin {', '.join(paths)} namespace at {', '.join(paths.values())}: "
                       f"{err}") from err


def unpin(path: str) -> None:
    """Unpin and delete ``path``; nothing to do if it is already gone."""
    try:
        unmount(path, detach=True)
    except Internal as e:
        if f"errno {errno.EINVAL}" not in str(e) and f"errno {errno.ENOENT}" not in str(e):
            raise
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


def is_pinned(path: str) -> bool:
    """Whether ``path`` still holds a namespace (an nsfs mount on it)."""
    try:
        return os.stat(path).st_dev != os.stat(os.path.dirname(path)).st_dev
    except FileNotFoundError:
        return False


def write_sysctls(values: Mapping[str, str]) -> None:
    """Write ``net.ipv4.x``-style keys under /proc/sys, as seen by the calling thread
    (call inside the namespaces they belong to)."""
    for key, value in values.items():
        path = "/proc/sys/" + (key if "/" in key else key.replace(".", "/"))
        try:
            with open(path, "w") as f:
                f.write(value)
        except OSError as e:
            raise Internal(f"sysctl {key}={value}: {e.strerror}") from None
