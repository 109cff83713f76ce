"""PathLock (one daemon per root, state and socket) and unixsock (never take over a live
socket, remove only our own)."""

from __future__ import annotations

import os
import socket
import stat
from pathlib import Path

import pytest

from pycrid.errors import FailedPrecondition
from pycrid.pathlock import PathLock
from pycrid.unixsock import check_free, listen


def test_a_held_lock_refuses_naming_path_and_pid(tmp_path: Path) -> None:
    path = str(tmp_path / "pycrid.lock")
    first = PathLock(path, what="the root directory /r", hint="choose another --root")
    first.acquire()
    assert Path(path).read_text() == f"{os.getpid()}\n"
    second = PathLock(path, what="the root directory /r", hint="choose another --root")
    with pytest.raises(FailedPrecondition) as e:
        second.acquire()
    assert str(e.value) == (f"the root directory /r is in use by another pycrid (pid "
                            f"{os.getpid()} holds the lock {path}); stop it first or choose "
                            "another --root")
    first.release()
    assert not os.path.exists(path)
    second.acquire()  # free again
    second.release()


def test_a_stale_lock_file_is_taken_over(tmp_path: Path) -> None:
    path = tmp_path / "pycrid.lock"
    path.write_text("424242\n")  # a killed daemon's: the kernel dropped its lock
    lock = PathLock(str(path), what="x", hint="y")
    lock.acquire()
    assert path.read_text() == f"{os.getpid()}\n"
    lock.release()


def test_an_unwritable_lock_dir_says_so(tmp_path: Path) -> None:
    with pytest.raises(FailedPrecondition, match=r"cannot create the lock file .* for the st"):
        PathLock(str(tmp_path / "missing" / "pycrid.lock"), what="the state directory /s",
                 hint="choose another --state").acquire()


def test_check_free(tmp_path: Path) -> None:
    path = str(tmp_path / "s.sock")
    assert check_free(path, what="the NRI socket", hint="set socket_path") is False
    dead = socket.socket(socket.AF_UNIX)
    dead.bind(path)
    dead.close()
    assert check_free(path, what="the NRI socket", hint="set socket_path") is True
    os.unlink(path)
    with socket.socket(socket.AF_UNIX) as live:
        live.bind(path)
        live.listen()
        with pytest.raises(FailedPrecondition,
                           match=r"the NRI socket .* is served by another process "
                                 rf"\(\S+, pid {os.getpid()}\); .* or set socket_path"):
            check_free(path, what="the NRI socket", hint="set socket_path")
    os.unlink(path)
    Path(path).write_text("not a socket")
    with pytest.raises(FailedPrecondition, match="exists and is not a socket"):
        check_free(path, what="the NRI socket", hint="set socket_path")
    assert Path(path).read_text() == "not a socket"


def test_listen_publishes_and_removes_only_its_own(tmp_path: Path) -> None:
    path = str(tmp_path / "nri.sock")
    sock, published = listen(path, what="the NRI socket", hint="h", mode=0o600)
    try:
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
        assert [p.name for p in tmp_path.iterdir()] == ["nri.sock"]  # no temporary left
        with socket.socket(socket.AF_UNIX) as c:
            c.connect(path)
        # Another process replaced it: at exit, that one stays.
        os.unlink(path)
        with socket.socket(socket.AF_UNIX) as other:
            other.bind(path)
            published.remove()
            assert os.path.exists(path)
        os.unlink(path)
        sock2, published2 = listen(path, what="the NRI socket", hint="h", mode=0o600)
        sock2.close()
        published2.remove()
        assert not os.path.exists(path)
    finally:
        sock.close()


def test_listen_refuses_a_live_socket(tmp_path: Path) -> None:
    path = str(tmp_path / "nri.sock")
    with socket.socket(socket.AF_UNIX) as live:
        live.bind(path)
        live.listen()
        ino = os.stat(path).st_ino
        with pytest.raises(FailedPrecondition, match="served by another process"):
            listen(path, what="the NRI socket", hint="h", mode=0o600)
        assert os.stat(path).st_ino == ino
        assert sorted(p.name for p in tmp_path.iterdir()) == ["nri.sock"]
