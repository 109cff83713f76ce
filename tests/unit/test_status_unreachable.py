"""``pycrid status`` with no daemon to ask: why, in words, and --json still JSON (exit 2)."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from pycrid.status_command import UNREACHABLE


def status(*args: str, prefix: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*prefix, sys.executable, "-m", "pycrid", "status", *args],
                          capture_output=True, text=True, timeout=60)


def check(address: str, why: str, prefix: tuple[str, ...] = ()) -> None:
    plain = status("--address", address, prefix=prefix)
    assert plain.returncode == UNREACHABLE == 2, plain.stderr
    assert plain.stdout == ""
    assert plain.stderr.startswith(f"pycrid: nothing answers at {address}: {why}"), plain.stderr
    assert "StatusCode" not in plain.stderr and "failed to connect" not in plain.stderr
    as_json = status("--address", address, "--json", prefix=prefix)
    assert as_json.returncode == 2
    doc = json.loads(as_json.stdout)
    assert doc["ready"] is False
    assert doc["error"] == plain.stderr.removeprefix("pycrid: ").rstrip("\n")


def test_no_such_file(tmp_path: Path) -> None:
    check(str(tmp_path / "pycrid.sock"), "no such file (pycrid is not running")


def test_connection_refused(tmp_path: Path) -> None:
    path = str(tmp_path / "pycrid.sock")
    dead = socket.socket(socket.AF_UNIX)
    dead.bind(path)
    dead.close()  # a crashed daemon's socket file
    check(path, "connection refused (the socket file is there but no process listens")


def test_not_a_socket(tmp_path: Path) -> None:
    (tmp_path / "pycrid.sock").write_text("")
    check(str(tmp_path / "pycrid.sock"), "it is not a socket")


@pytest.fixture
def root_only_socket() -> Iterator[str]:
    """A listening socket, mode 0660 root:root, in a directory anyone can enter."""
    d = tempfile.mkdtemp(prefix="pycrid-status-")
    os.chmod(d, 0o755)
    path = os.path.join(d, "pycrid.sock")
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(path)
        os.chmod(path, 0o660)
        s.listen()
        try:
            yield path
        finally:
            shutil.rmtree(d)


def test_permission_denied(root_only_socket: str) -> None:
    setpriv = shutil.which("setpriv")
    if setpriv is None or os.geteuid() != 0:
        pytest.skip("needs root and setpriv (util-linux) to ask as another user")
    check(root_only_socket, "permission denied (the socket is mode 0660, owner 0, group 0",
          prefix=(setpriv, "--reuid=65534", "--regid=65534", "--clear-groups"))


def test_a_bad_config_is_json_too(tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    config.write_text('version = 2\n[grpc]\naddress = 5\n')
    proc = status("--config", str(config), "--json")
    assert proc.returncode == 2
    doc = json.loads(proc.stdout)
    assert doc["ready"] is False
    assert doc["error"].startswith("invalid configuration: config key grpc.address")
