"""One node, one daemon: a second pycrid never shares the root, the state directory or a
socket of a running one, and a daemon removes only the sockets and lock files it made."""

from __future__ import annotations

import os
import socket
import subprocess
from pathlib import Path

import pytest
from cri_api.v1 import api_pb2 as pb

from tests.support.daemon import (
    NRI_SECTION,
    Daemon,
    nri_paths,
    running_daemon,
    serve_command,
)
from tests.support.network import with_private_cni
from tests.support.nri_plugins import external_plugin, has_event, wait_events

pytestmark = pytest.mark.e2e


def _second(tmp_path: Path, root: str, state: str, address: str,
            config_text: str = "version = 2\n") -> subprocess.CompletedProcess[str]:
    """A second ``pycrid serve`` (with its own CNI and NRI unless the config says)."""
    base = tmp_path / "second"
    base.mkdir(exist_ok=True)
    config = base / "config.toml"
    if NRI_SECTION not in config_text:
        config_text += NRI_SECTION + "\n" + "".join(
            f'{k} = "{v}"\n' for k, v in nri_paths(str(base)).items())
    config.write_text(with_private_cni(config_text, str(base)))
    return subprocess.run(serve_command(str(config), root, state, address),
                          capture_output=True, text=True, timeout=60,
                          stdin=subprocess.DEVNULL)


def _still_serving(d: Daemon) -> None:
    assert d.client.runtime.Version(pb.VersionRequest(), timeout=5).runtime_name == "pycrid"
    assert d.proc.poll() is None


def test_second_daemon_on_the_same_root_is_refused(tmp_path: Path) -> None:
    with running_daemon(str(tmp_path / "a")) as d:
        lock = os.path.join(d.root, "pycrid.lock")
        assert Path(lock).read_text().strip() == str(d.proc.pid)
        other = str(tmp_path / "other.sock")
        proc = _second(tmp_path, d.root, d.state, other)
        assert proc.returncode == 1, proc.stderr
        assert (f"the root directory {d.root} is in use by another pycrid "
                f"(pid {d.proc.pid} holds the lock {lock})") in proc.stderr
        assert "--root" in proc.stderr
        # It stopped before reading anything: no recovery, no socket of its own.
        assert "recovered" not in proc.stderr
        assert "Traceback" not in proc.stderr
        assert not os.path.exists(other) and not os.path.exists(other + ".lock")
        _still_serving(d)


def test_second_daemon_on_the_same_state_is_refused(tmp_path: Path) -> None:
    with running_daemon(str(tmp_path / "a")) as d:
        proc = _second(tmp_path, str(tmp_path / "own-root"), d.state,
                       str(tmp_path / "other.sock"))
        assert proc.returncode == 1, proc.stderr
        lock = os.path.join(d.state, "pycrid.lock")
        assert (f"the state directory {d.state} is in use by another pycrid "
                f"(pid {d.proc.pid} holds the lock {lock})") in proc.stderr
        assert "recovered" not in proc.stderr
        # The root lock it took first was given back as it stopped.
        assert not (tmp_path / "own-root" / "pycrid.lock").exists()
        _still_serving(d)


def test_lock_files_go_away_at_a_clean_stop(tmp_path: Path) -> None:
    with running_daemon(str(tmp_path)) as d:
        locks = [os.path.join(d.root, "pycrid.lock"), os.path.join(d.state, "pycrid.lock"),
                 d.address + ".lock"]
        for lock in locks:
            assert Path(lock).read_text().strip() == str(d.proc.pid), lock
    assert d.proc.returncode == 0
    assert [lock for lock in locks if os.path.exists(lock)] == []


def test_a_stale_lock_file_does_not_stop_a_start(tmp_path: Path) -> None:
    # What a killed daemon leaves: the files, with a pid, but no lock held.
    root, state = tmp_path / "root", tmp_path / "state"
    root.mkdir()
    state.mkdir()
    (root / "pycrid.lock").write_text("999999\n")
    (state / "pycrid.sock.lock").write_text("999999\n")
    with running_daemon(str(tmp_path)) as d:
        assert (root / "pycrid.lock").read_text().strip() == str(d.proc.pid)
    assert not (root / "pycrid.lock").exists()


def test_second_daemon_does_not_take_over_the_nri_socket(tmp_path: Path) -> None:
    with running_daemon(str(tmp_path / "a")) as d:
        nri_sock = nri_paths(str(tmp_path / "a"))["socket_path"]
        before = os.stat(nri_sock)
        b = tmp_path / "b"
        proc = _second(tmp_path, str(b / "root"), str(b / "state"), str(b / "pycrid.sock"),
                       f'version = 2\n{NRI_SECTION}\nsocket_path = "{nri_sock}"\n'
                       f'plugin_path = "{b}/plugins"\n')
        assert proc.returncode == 1, proc.stderr
        assert f"the NRI socket {nri_sock} is served by another process" in proc.stderr
        assert 'socket_path in [plugins."pycrid.nri.v1.nri"]' in proc.stderr
        assert "accepting on" not in proc.stderr
        assert "recovered" not in proc.stderr  # refused before recovery
        after = os.stat(nri_sock)
        assert (after.st_dev, after.st_ino) == (before.st_dev, before.st_ino)
        # Plugins still reach the first daemon.
        record = tmp_path / "plugin.jsonl"
        with external_plugin(nri_sock, "recorder", "probe", "50", record=record):
            wait_events(record, has_event("Synchronize"), what="the probe's Synchronize")
        _still_serving(d)


def _foreign_listener(path: str) -> socket.socket:
    """Another process's socket put where ours was."""
    os.unlink(path)
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(path)
    s.listen()
    return s


def test_at_exit_only_the_daemons_own_sockets_are_removed(tmp_path: Path) -> None:
    with running_daemon(str(tmp_path)) as d:
        nri_sock = nri_paths(str(tmp_path))["socket_path"]
        foreign_nri = _foreign_listener(nri_sock)
        foreign_cri = _foreign_listener(d.address)
        mine = {p: os.stat(p).st_ino for p in (nri_sock, d.address)}
    try:
        assert d.proc.returncode == 0
        for path, ino in mine.items():
            assert os.path.exists(path) and os.stat(path).st_ino == ino, path
        assert "no longer the socket this daemon created" in d.log()
    finally:
        foreign_nri.close()
        foreign_cri.close()


def test_a_dead_nri_socket_is_replaced(tmp_path: Path) -> None:
    nri_sock = nri_paths(str(tmp_path))["socket_path"]
    os.makedirs(os.path.dirname(nri_sock))
    dead = socket.socket(socket.AF_UNIX)
    dead.bind(nri_sock)
    dead.close()  # the file stays, nobody listens: a crashed runtime's leftover
    with running_daemon(str(tmp_path)) as d:
        assert f"replacing stale socket {nri_sock}" in d.log()
        record = tmp_path / "plugin.jsonl"
        with external_plugin(nri_sock, "recorder", "probe", "50", record=record):
            wait_events(record, has_event("Synchronize"), what="the probe's Synchronize")
    assert not os.path.exists(nri_sock)
