"""mount(2), umount2(2), openat2(2), linkat(2) of an open file and idmapped mounts
through libc, and the mounts under a path.

Used for unpacking layers, container root filesystems and image volumes;
calling the syscalls directly avoids a ``mount`` process per layer.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
from dataclasses import dataclass

from pycrid.errors import Internal
from pycrid.host import mountinfo


@dataclass(frozen=True)
class Mount:
    """One mount(2) call: filesystem type, source and options (as ``mount -o`` takes them)."""

    type: str
    source: str
    options: tuple[str, ...] = ()


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
        if m.type != "overlay":
            raise Internal(f"mount options for {target} exceed one page ({len(payload)} bytes)")
        _mount_overlay_by_parts(data, flags, target)
        return
    _call(f"mount {m.type} {m.source} on {target}",
          _libc.mount(m.source.encode(), target.encode(),
                      fstype.encode() if fstype else None, flags & ~MS_RDONLY
                      if m.type == "bind" else flags, payload.encode() or None))
    if m.type == "bind" and flags & MS_RDONLY:
        _call(f"remount {target} read-only",
              _libc.mount(None, target.encode(), None, flags | MS_REMOUNT, None))


def unmount(target: str, *, detach: bool = False) -> None:
    _call(f"unmount {target}", _libc.umount2(target.encode(), MNT_DETACH if detach else 0))


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64),
                ("resolve", ctypes.c_uint64)]


_SYS_OPENAT2 = 437  # the same number on every architecture
_RESOLVE_NO_MAGICLINKS, _RESOLVE_NO_SYMLINKS, _RESOLVE_BENEATH = 0x02, 0x04, 0x08


def _openat2(root: str | int, path: str, flags: int, resolve: int) -> int:
    """openat2(2) of ``path`` under directory ``root`` (a path, or an fd of it); OSError
    as open(2) would raise."""
    dirfd = os.open(root, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC) \
        if isinstance(root, str) else root
    try:
        how = _OpenHow(flags=flags | os.O_CLOEXEC, mode=0, resolve=resolve)
        fd = int(_libc.syscall(ctypes.c_long(_SYS_OPENAT2), ctypes.c_int(dirfd),
                               os.fsencode(path), ctypes.byref(how),
                               ctypes.c_size_t(ctypes.sizeof(how))))
        if fd < 0:
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err), path)
        return fd
    finally:
        if isinstance(root, str):
            os.close(dirfd)


def real_dir_beneath(root: str, path: str) -> str:
    """The symlink-free host path of directory ``path`` inside ``root``.

    The kernel resolves ``path`` (openat2 with RESOLVE_BENEATH: ``..``, absolute
    names and symlinks may not leave ``root``, as Go's os.Root refuses them);
    raises OSError with ENOENT (missing), ENOTDIR (not a directory) or EXDEV
    (escapes ``root``).
    """
    fd = _openat2(root, path, os.O_PATH | os.O_DIRECTORY,
                  _RESOLVE_BENEATH | _RESOLVE_NO_MAGICLINKS)
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    finally:
        os.close(fd)


def open_no_symlinks(root: str | int, path: str) -> int:
    """A read-only fd of ``path`` inside ``root`` (a directory, or an fd of one opened
    O_PATH) reached through no symlink at all (and never outside ``root``): ELOOP where a
    component is one, ENOENT where it is missing."""
    return _openat2(root, path, os.O_RDONLY | os.O_NOFOLLOW,
                    _RESOLVE_BENEATH | _RESOLVE_NO_SYMLINKS | _RESOLVE_NO_MAGICLINKS)


def open_no_symlinks_dir(root: str | int, path: str) -> int:
    """An O_PATH fd of directory ``path`` inside ``root``, reached as open_no_symlinks
    reaches a file (ENOTDIR where it is not a directory)."""
    return _openat2(root, path, os.O_PATH | os.O_DIRECTORY,
                    _RESOLVE_BENEATH | _RESOLVE_NO_SYMLINKS | _RESOLVE_NO_MAGICLINKS)


_AT_SYMLINK_FOLLOW = 0x400


def link_fd(fd: int, path: str) -> None:
    """A new name ``path`` for the file open as ``fd`` (linkat(2) through its /proc
    link, followed: os.link would link the /proc symlink itself)."""
    src = f"/proc/self/fd/{fd}".encode()
    if _libc.linkat(_AT_FDCWD, src, _AT_FDCWD, os.fsencode(path), _AT_SYMLINK_FOLLOW) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err), path)


def mounts_under(path: str) -> list[str]:
    """Mount points at or below ``path``, deepest first (the order to unmount them in)."""
    base = os.path.realpath(path).rstrip("/")
    found = [m.mount_point for m in mountinfo.read(strict=True)
             if m.mount_point == base or m.mount_point.startswith(base + "/")]
    # Deepest first; among mounts stacked on one path, the newest (listed last) first.
    order = {mp: i for i, mp in enumerate(found)}
    return sorted(found, key=lambda p: (p.count("/"), order[p]), reverse=True)


# The new mount API (Linux 5.2+; "lowerdir+" since 6.8) takes overlay options one
# at a time, so a stack of layers is not bound by mount(2)'s one-page option
# string. The syscall numbers of these calls are the same on every architecture.
_SYS_MOVE_MOUNT, _SYS_FSOPEN, _SYS_FSCONFIG, _SYS_FSMOUNT = 429, 430, 431, 432
_FSCONFIG_SET_FLAG, _FSCONFIG_SET_STRING, _FSCONFIG_CMD_CREATE = 0, 1, 6
_MOUNT_ATTRS = {MS_RDONLY: 0x1, MS_NOSUID: 0x2, MS_NODEV: 0x4, MS_NOEXEC: 0x8}
_AT_FDCWD, _MOVE_MOUNT_F_EMPTY_PATH = -100, 0x4
#: The kernel copies each fsconfig value with a 256-byte limit.
_MAX_VALUE = 255


def _sys(what: str, nr: int, *args: object) -> int:
    rc = int(_libc.syscall(ctypes.c_long(nr), *args))
    if rc < 0:
        err = ctypes.get_errno()
        hint = " (a lowerdir list longer than one page needs Linux 6.8+)" \
            if err in (errno.ENOSYS, errno.EINVAL) else ""
        raise Internal(f"{what}: {os.strerror(err)} (errno {err}){hint}")
    return rc


def _mount_overlay_by_parts(data: list[str], flags: int, target: str) -> None:
    """Mount an overlay whose options are too long for mount(2): one layer per fsconfig."""
    params: list[tuple[str, str | None]] = []
    for opt in data:
        name, eq, val = opt.partition("=")
        if name == "lowerdir" and eq:
            params += [("lowerdir+", layer) for layer in val.split(":")]
        else:
            params.append((name, val if eq else None))
    fs = _sys(f"fsopen overlay for {target}", _SYS_FSOPEN, b"overlay", ctypes.c_uint(1))
    try:
        for key, value in params:
            if value is not None and len(value.encode()) > _MAX_VALUE:
                raise Internal(f"overlay option {key} for {target} is longer than "
                               f"{_MAX_VALUE} bytes")
            _sys(f"overlay option {key}={value} for {target}", _SYS_FSCONFIG, ctypes.c_int(fs),
                 ctypes.c_uint(_FSCONFIG_SET_FLAG if value is None else _FSCONFIG_SET_STRING),
                 key.encode(), None if value is None else value.encode(), ctypes.c_int(0))
        _sys(f"create overlay for {target}", _SYS_FSCONFIG, ctypes.c_int(fs),
             ctypes.c_uint(_FSCONFIG_CMD_CREATE), None, None, ctypes.c_int(0))
        attrs = sum(bit for flag, bit in _MOUNT_ATTRS.items() if flags & flag)
        mfd = _sys(f"fsmount overlay for {target}", _SYS_FSMOUNT, ctypes.c_int(fs),
                   ctypes.c_uint(1), ctypes.c_uint(attrs))
        try:
            _sys(f"move overlay mount to {target}", _SYS_MOVE_MOUNT, ctypes.c_int(mfd), b"",
                 ctypes.c_int(_AT_FDCWD), target.encode(),
                 ctypes.c_uint(_MOVE_MOUNT_F_EMPTY_PATH))
        finally:
            os.close(mfd)
    finally:
        os.close(fs)


# Idmapped mounts (Linux 5.12+): a detached copy of a mount tree (open_tree with
# OPEN_TREE_CLONE) whose files show, through it, with their ids shifted by a user
# namespace's maps (mount_setattr with MOUNT_ATTR_IDMAP), attached with move_mount.
# containerd's core/mount/mount_idmapped_linux.go IDMapMountWithAttrs does the same.
_SYS_OPEN_TREE, _SYS_MOUNT_SETATTR = 428, 442
_OPEN_TREE_CLONE, _AT_EMPTY_PATH, _AT_RECURSIVE = 0x1, 0x1000, 0x8000
_MOUNT_ATTR_RDONLY, _MOUNT_ATTR_IDMAP = 0x1, 0x100000
_MS_PRIVATE = 1 << 18


class _MountAttr(ctypes.Structure):
    _fields_ = [("attr_set", ctypes.c_uint64), ("attr_clr", ctypes.c_uint64),
                ("propagation", ctypes.c_uint64), ("userns_fd", ctypes.c_uint64)]


def _os_call(what: str, nr: int, *args: object) -> int:
    rc = int(_libc.syscall(ctypes.c_long(nr), *args))
    if rc < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")
    return rc


def idmapped_bind(source: str, target: str, userns_fd: int, *, readonly: bool = False) -> None:
    """Bind ``source`` (recursively) on ``target`` with its ids shifted by the maps of
    the user namespace ``userns_fd``: a file the node's uid 0 owns shows as owned by the
    namespace's root. Raises OSError (EINVAL, EPERM, EOPNOTSUPP: the kernel or the file
    system cannot)."""
    tree = _os_call(f"open_tree {source}", _SYS_OPEN_TREE, ctypes.c_int(_AT_FDCWD),
                    source.encode(), ctypes.c_uint(_OPEN_TREE_CLONE | os.O_CLOEXEC |
                                                   _AT_RECURSIVE))
    try:
        attr = _MountAttr(attr_set=_MOUNT_ATTR_IDMAP | (_MOUNT_ATTR_RDONLY if readonly else 0),
                          attr_clr=0, propagation=_MS_PRIVATE, userns_fd=userns_fd)
        _os_call(f"idmap {source}", _SYS_MOUNT_SETATTR, ctypes.c_int(tree), b"",
                 ctypes.c_uint(_AT_EMPTY_PATH | _AT_RECURSIVE), ctypes.byref(attr),
                 ctypes.c_size_t(ctypes.sizeof(attr)))
        _os_call(f"attach the idmapped {source} on {target}", _SYS_MOVE_MOUNT,
                 ctypes.c_int(tree), b"", ctypes.c_int(_AT_FDCWD), target.encode(),
                 ctypes.c_uint(_MOVE_MOUNT_F_EMPTY_PATH))
    finally:
        os.close(tree)
