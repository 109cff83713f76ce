"""sd_notify datagrams: path and abstract sockets, the variable taken out of the env."""

from __future__ import annotations

import os
import socket
import uuid
from pathlib import Path

import pytest

from pycrid.sdnotify import ENV, Notifier


def _lines(data: bytes) -> dict[str, str]:
    return dict(line.split("=", 1) for line in data.decode().splitlines())


def test_path_socket_gets_ready_with_pid_and_status(tmp_path: Path) -> None:
    path = str(tmp_path / "notify")
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
        s.bind(path)
        n = Notifier(path)
        assert n.enabled and n.ready("serving CRI on /run/x.sock")
        got = _lines(s.recv(4096))
    assert got == {"READY": "1", "MAINPID": str(os.getpid()),
                   "STATUS": "serving CRI on /run/x.sock"}


def test_abstract_socket_form() -> None:
    name = f"pycrid-test-{uuid.uuid4().hex}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
        s.bind(b"\0" + name.encode())
        n = Notifier("@" + name)
        assert n.address == b"\0" + name.encode()
        assert n.stopping()
        assert _lines(s.recv(4096)) == {"STOPPING": "1", "STATUS": "stopping"}


def test_unset_or_unsupported_is_a_no_op() -> None:
    assert not Notifier(None).enabled
    assert not Notifier(None).ready("x")
    assert not Notifier("vsock:2:1234").enabled


def test_nobody_listening_does_not_raise(tmp_path: Path) -> None:
    assert Notifier(str(tmp_path / "gone")).ready("x") is False


def test_from_env_removes_the_variable(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # runc would otherwise proxy the socket into containers and wait for their READY=1.
    monkeypatch.setenv(ENV, str(tmp_path / "n"))
    n = Notifier.from_env()
    assert n.address == str(tmp_path / "n")
    assert ENV not in os.environ
