"""The process that makes a pod's namespaces when a user namespace is involved.

A thread can unshare network, IPC and UTS namespaces, but only a single-threaded
process may create or join a user namespace, and namespaces meant for a pod in a
user namespace must be owned by it (runc joins the pod's user namespace first and
then needs CAP_SYS_ADMIN over each namespace it joins). So the daemon runs this file
as ``python -S -I ns_helper.py JSON`` (the standard library only: it must start in a
few milliseconds), and the parent (:mod:`pycrid.host.userns`) pins what it made.

The request (JSON): ``user`` is "new" or the path of a user namespace to join;
``join`` maps namespace kinds to paths entered next; ``new`` lists the kinds to
unshare then (net, ipc, uts); ``hostname``, ``sysctls`` and ``lo_up`` are set up
inside. The talk on stdout and stdin, one line each: with a new user namespace the
helper says ``user``, the parent writes its id maps and answers ``mapped``; the
helper says ``ready`` when everything is made and stays until stdin closes. A
failure is one line on stderr and exit status 1.
"""

from __future__ import annotations

import ctypes
import fcntl
import json
import os
import socket
import struct
import sys
from typing import Any

CLONE_NEWUSER = 0x10000000
#: clone(2) flags by /proc/<pid>/ns file name.
FLAGS = {"user": CLONE_NEWUSER, "net": 0x40000000, "ipc": 0x08000000, "uts": 0x04000000}
_SIOCGIFFLAGS, _SIOCSIFFLAGS, _IFF_UP = 0x8913, 0x8914, 0x1

_libc = ctypes.CDLL(None, use_errno=True)


def _check(what: str, rc: int) -> None:
    if rc != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _open(path: str) -> int:
    return os.open(path, os.O_RDONLY | os.O_CLOEXEC)


def _setns(fd: int, kind: str) -> None:
    try:
        _check(f"setns {kind}", _libc.setns(fd, FLAGS[kind]))
    finally:
        os.close(fd)


def _become_root() -> None:
    """uid and gid 0 of the user namespace just entered (its root owns the namespaces'
    sysctl files; the capabilities came with the namespace)."""
    _check("setresgid 0", _libc.setresgid(0, 0, 0))
    _check("setgroups", _libc.setgroups(0, None))
    _check("setresuid 0", _libc.setresuid(0, 0, 0))


def _lo_up() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        req = struct.pack("16sH14x", b"lo", 0)
        flags = struct.unpack("16sH14x", fcntl.ioctl(s.fileno(), _SIOCGIFFLAGS, req))[1]
        fcntl.ioctl(s.fileno(), _SIOCSIFFLAGS, struct.pack("16sH14x", b"lo", flags | _IFF_UP))


def _say(word: str) -> None:
    os.write(1, word.encode() + b"\n")


def _hear() -> str:
    data = b""
    while not data.endswith(b"\n"):
        chunk = os.read(0, 64)
        if not chunk:
            break
        data += chunk
    return data.decode().strip()


def run(req: dict[str, Any]) -> None:
    user = req.get("user") or ""
    # Every namespace file is opened first, as the node's root: once in the pod's user
    # namespace the helper is its root, which may not pass through the daemon's
    # directories.
    user_fd = _open(user) if user and user != "new" else -1
    joins = [(kind, _open(path)) for kind, path in (req.get("join") or {}).items()]
    if user == "new":
        _check("unshare user", _libc.unshare(CLONE_NEWUSER))
        _say("user")
        if _hear() != "mapped":
            raise OSError(0, "the parent did not write the id maps")
        _become_root()
    elif user_fd >= 0:
        _setns(user_fd, "user")
        _become_root()
    for kind, fd in joins:
        _setns(fd, kind)
    flags = 0
    for kind in req.get("new") or ():
        flags |= FLAGS[kind]
    if flags:
        _check("unshare " + ",".join(req["new"]), _libc.unshare(flags))
    if req.get("hostname"):
        socket.sethostname(req["hostname"])
    if req.get("lo_up"):
        _lo_up()
    for key, value in (req.get("sysctls") or {}).items():
        name = key if "/" in key else key.replace(".", "/")
        with open("/proc/sys/" + name, "w") as f:
            f.write(value)
    _say("ready")
    _hear()  # until the parent has pinned what it wants and closes our stdin


def main() -> int:
    try:
        run(json.loads(sys.argv[1]))
    except (OSError, ValueError, KeyError) as e:
        os.write(2, f"{e}\n".encode())
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
