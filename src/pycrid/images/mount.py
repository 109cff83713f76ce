"""mount(2) and umount2(2) through libc, and a reader of /proc/self/mountinfo.

Used for unpacking layers now and container root filesystems later; calling
the syscalls directly avoids a ``mount`` process per layer.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os

from pycrid.errors import Internal
from pycrid.images.snapshots import Mount

_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
_libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong,
                        ctypes.c_char_p]
_libc.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]

MS_RDONLY = 1
MS_NOSUID = 2
MS_NODEV = 4
MS_NOEXEC = 8
MS_REMOUNT = 32
MS_BIND = 4096
MS_REC = 16384
MNT_DETACH = 2

_FLAGS = {"ro": MS_RDONLY, "nosuid": MS_NOSUID, "nodev": MS_NODEV, "noexec": MS_NOEXEC,
          "bind": MS_BIND, "rbind": MS_BIND | MS_REC}


def _call(what: str, rc: int) -> None:
    if rc != 0:
        err = ctypes.get_errno()
        raise Internal(f"{what}: {os.strerror(err)} (errno {err})")


def mount(m: Mount, target: str) -> None:
    """Mount ``m`` on ``target``; a read-only bind mount is made in the two steps Linux needs."""
    flags, data = 0, []
    for opt in m.options:
        if opt in _FLAGS:
            flags |= _FLAGS[opt]
        elif opt != "rw":
            data.append(opt)
    fstype = None if m.type == "bind" else m.type
    if m.type == "bind":
        flags |= MS_BIND
    payload = ",".join(data)
    if len(payload) >= os.sysconf("SC_PAGE_SIZE"):
        raise Internal(f"mount options for {target} exceed one page ({len(payload)} bytes)")
    _call(f"mount {m.type} {m.source} on {target}",
          _libc.mount(m.source.encode(), target.encode(),
                      fstype.encode() if fstype else None, flags & ~MS_RDONLY
                      if m.type == "bind" else flags, payload.encode() or None))
    if m.type == "bind" and flags & MS_RDONLY:
        _call(f"remount {target} read-only",
              _libc.mount(None, target.encode(), None, flags | MS_REMOUNT, None))


def unmount(target: str, *, detach: bool = False) -> None:
    _call(f"unmount {target}", _libc.umount2(target.encode(), MNT_DETACH if detach else 0))


def mounts_under(path: str) -> list[str]:
    """Mount points at or below ``path``, deepest first (the order to unmount them in)."""
    base = os.path.realpath(path).rstrip("/")
    found = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            mp = line.split()[4].encode().decode("unicode_escape")
            if mp == base or mp.startswith(base + "/"):
                found.append(mp)
    return sorted(found, key=lambda p: p.count("/"), reverse=True)
