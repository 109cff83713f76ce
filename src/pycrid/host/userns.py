"""User namespaces of pods (KEP-127): id maps, namespaces pinned on files, and what the
mapped root may reach.

A pod in a user namespace has it pinned like its other namespaces, and every
namespace it owns (network, IPC, UTS) is made *inside* it: runc joins the pod's user
namespace first, and may then only join namespaces that user namespace owns.
containerd does the same (internal/cri/server/sandbox_run_linux.go
``setupNetnsWithinUserns``: the netns is created in a new user namespace with the
pod's mappings; podsandbox/helpers_linux.go ``pinUserNamespace`` pins the netns's
owner). Creating or joining a user namespace needs a single-threaded process:
:mod:`pycrid.host.ns_helper`, run for the moment it takes; this module pins what it
made with bind mounts of its ``/proc/<pid>/ns`` files.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import select
import stat
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from pycrid.errors import Internal
from pycrid.host import ns_helper
from pycrid.host.idmap import IDMap
from pycrid.host.mounts import Mount, mount
from pycrid.host.pins import unpin

#: ioctl_ns(2): a file descriptor of the user namespace owning a namespace.
NS_GET_USERNS = 0xB701
#: How long the helper may take to answer (it needs a few milliseconds).
_HELPER_TIMEOUT = 30.0


@dataclass(frozen=True)
class NamespaceRequest:
    """What the helper makes and what of it gets pinned, by kind (``user``, ``net``,
    ``ipc``, ``uts``) at a path (a new file)."""

    pins: Mapping[str, str]
    #: A new user namespace with these maps; or ``user``: the path of one to join.
    idmap: IDMap | None = None
    user: str = ""
    join: Mapping[str, str] = field(default_factory=dict)
    new: Sequence[str] = ()
    hostname: str = ""
    sysctls: Mapping[str, str] = field(default_factory=dict)
    lo_up: bool = False

    def helper_request(self) -> dict[str, object]:
        return {"user": "new" if self.idmap is not None else self.user,
                "join": dict(self.join), "new": list(self.new), "hostname": self.hostname,
                "sysctls": dict(self.sysctls), "lo_up": self.lo_up}


class _Helper:
    """One run of ns_helper: line by line on its stdout, with a deadline."""

    def __init__(self, req: NamespaceRequest) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-S", "-I", ns_helper.__file__, json.dumps(req.helper_request())],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            close_fds=True)
        self.deadline = time.monotonic() + _HELPER_TIMEOUT

    def expect(self, word: str) -> None:
        assert self.proc.stdout is not None
        out = self.proc.stdout
        left = self.deadline - time.monotonic()
        # poll, not select: the daemon's descriptors (a pidfd per conmon) pass 1024.
        ready = select.poll()
        ready.register(out, select.POLLIN)
        if left <= 0 or not ready.poll(left * 1000):
            raise Internal(f"namespace helper did not answer within {_HELPER_TIMEOUT:.0f}s")
        line = out.readline().decode(errors="replace").strip()
        if line != word:
            raise Internal(f"namespace helper: {self._failure()}")

    def say(self, word: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(word.encode() + b"\n")
        self.proc.stdin.flush()

    def _failure(self) -> str:
        self.close()
        assert self.proc.stderr is not None
        return self.proc.stderr.read().decode(errors="replace").strip() or \
            f"exited with status {self.proc.returncode}"

    def close(self) -> None:
        """Close its stdin (it ends) and reap it; killed if it lingers."""
        if self.proc.stdin is not None and not self.proc.stdin.closed:
            with contextlib.suppress(BrokenPipeError):
                self.proc.stdin.close()
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def write_maps(pid: int, idmap: IDMap) -> None:
    """The uid and gid maps of process ``pid``'s new user namespace."""
    for kind in ("uid", "gid"):
        with open(f"/proc/{pid}/{kind}_map", "w") as f:
            f.write(idmap.map_file(kind))


def pin_namespaces(req: NamespaceRequest) -> None:
    """Make the namespaces ``req`` asks for in a helper process and pin those in
    ``req.pins``. On failure nothing stays pinned."""
    for path in req.pins.values():
        os.makedirs(os.path.dirname(path), mode=0o711, exist_ok=True)
        os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDONLY, 0o444))
    helper: _Helper | None = None
    try:
        helper = _Helper(req)
        if req.idmap is not None:
            helper.expect("user")
            write_maps(helper.proc.pid, req.idmap)
            helper.say("mapped")
        helper.expect("ready")
        for kind, path in req.pins.items():
            mount(Mount("bind", f"/proc/{helper.proc.pid}/ns/{kind}"), path)
    except BaseException as err:
        for path in req.pins.values():
            unpin(path)
        if isinstance(err, Internal):
            raise
        raise Internal(f"pin {', '.join(req.pins)} namespace at "
                       f"{', '.join(req.pins.values())}: {err}") from err
    finally:
        if helper is not None:
            helper.close()


def pin_owner(ns_path: str, target: str) -> None:
    """Pin the user namespace that owns the namespace pinned at ``ns_path`` (a pod's
    netns made inside its user namespace) at ``target``, a new file."""
    os.makedirs(os.path.dirname(target), mode=0o711, exist_ok=True)
    os.close(os.open(target, os.O_CREAT | os.O_EXCL | os.O_RDONLY, 0o444))
    try:
        fd = os.open(ns_path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            owner = fcntl.ioctl(fd, NS_GET_USERNS)
        finally:
            os.close(fd)
        try:
            mount(Mount("bind", f"/proc/self/fd/{owner}"), target)
        finally:
            os.close(owner)
    except BaseException as err:
        unpin(target)
        if isinstance(err, Internal):
            raise
        raise Internal(f"pin the user namespace of {ns_path} at {target}: {err}") from err


def blocked_dir(path: str, uid: int, gid: int) -> str | None:
    """The first directory from / down to ``path`` that host ``uid``/``gid`` (a pod's
    mapped root) cannot search, or None. runc resolves the bundle's rootfs from inside
    the pod's user namespace, where host-owned directories give it no privilege."""
    parts = os.path.realpath(path).split("/")
    for i in range(1, len(parts) + 1):
        d = "/".join(parts[:i]) or "/"
        st = os.stat(d)
        if st.st_uid == uid:
            bit = stat.S_IXUSR
        elif st.st_gid == gid:
            bit = stat.S_IXGRP
        else:
            bit = stat.S_IXOTH
        if not st.st_mode & bit:
            return d
    return None


def open_to_mapped_root(path: str, idmap: IDMap) -> None:
    """A bundle directory the pod's root must enter: group-owned by its gid, mode 0710
    (containerd's prepareBundleDirectoryPermissions, core/runtime/v2/bundle_linux.go)."""
    os.chown(path, -1, idmap.root()[1])
    os.chmod(path, 0o710)


def open_userns(path: str) -> int:
    """A descriptor of the user namespace pinned at ``path`` (for idmapped mounts)."""
    return os.open(path, os.O_RDONLY | os.O_CLOEXEC)


def ns_inode(path: str) -> int:
    """The inode of the namespace at ``path`` (equal inodes: the same namespace)."""
    return os.stat(path).st_ino

