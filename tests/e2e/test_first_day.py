"""First-day mistakes: each stops ``pycrid serve`` at once with what to do, or (CNI) shows
in Status."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
from pathlib import Path

import pytest
from cri_api.v1 import api_pb2 as pb

from tests.support.daemon import running_daemon, serve_command, with_private_sockets
from tests.support.network import CNI_SECTION, with_private_cni

pytestmark = pytest.mark.e2e

RUNTIME = '[plugins."pycrid.cri.v1.runtime"]'


def _serve(tmp_path: Path, config: str = "version = 2\n", address: str | None = None,
           prefix: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    path = tmp_path / "config.toml"
    path.write_text(with_private_cni(with_private_sockets(config, str(tmp_path)), str(tmp_path)))
    os.chmod(tmp_path, 0o755)
    address = address or str(tmp_path / "state" / "pycrid.sock")
    return subprocess.run(
        [*prefix, *serve_command(str(path), str(tmp_path / "root"), str(tmp_path / "state"),
                                 address)],
        capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)


def test_not_root(tmp_path: Path) -> None:
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.skip("setpriv (util-linux) is not installed")
    proc = _serve(tmp_path, prefix=(setpriv, "--reuid=65534", "--regid=65534",
                                    "--clear-groups"))
    assert proc.returncode == 1, proc.stderr
    assert ("pycrid must run as root (it mounts, creates network namespaces and cgroups)"
            in proc.stderr)
    assert "uid 65534" in proc.stderr
    assert not (tmp_path / "state").exists()


@pytest.mark.parametrize(("key", "binary"), [("runtime_path", "runc"),
                                             ("conmon_path", "conmon")])
def test_runc_or_conmon_missing(tmp_path: Path, key: str, binary: str) -> None:
    missing = str(tmp_path / "nowhere" / binary)
    proc = _serve(tmp_path, f'version = 2\n{RUNTIME}\n{key} = "{missing}"\n')
    assert proc.returncode == 1, proc.stderr
    assert f"{binary} binary '{missing}'" in proc.stderr
    assert "apt-get install runc conmon" in proc.stderr
    assert key in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "state" / "pycrid.sock").exists()


def test_socket_parent_is_a_file(tmp_path: Path) -> None:
    (tmp_path / "afile").write_text("")
    address = str(tmp_path / "afile" / "pycrid.sock")
    proc = _serve(tmp_path, address=address)
    assert proc.returncode == 1, proc.stderr
    assert f"cannot create the CRI socket directory {tmp_path / 'afile'}" in proc.stderr
    assert "it exists and is not a directory" in proc.stderr and "--address" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_socket_dir_on_read_only_fs(tmp_path: Path) -> None:
    # sysfs: even root cannot create a directory there.
    proc = _serve(tmp_path, address="/sys/pycrid-first-day/pycrid.sock")
    assert proc.returncode == 1, proc.stderr
    assert "cannot create the CRI socket directory /sys/pycrid-first-day" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_socket_served_by_another_process(tmp_path: Path) -> None:
    # A second pycrid is refused by the lock (test_daemon.py); any other server is too.
    (tmp_path / "state").mkdir()
    address = str(tmp_path / "state" / "pycrid.sock")
    with socket.socket(socket.AF_UNIX) as other:
        other.bind(address)
        other.listen()
        proc = _serve(tmp_path, address=address)
        assert proc.returncode == 1, proc.stderr
        assert f"{address} is served by another process" in proc.stderr
        assert os.path.exists(address)  # left alone


@pytest.mark.skipif(os.path.isdir("/run/systemd/system"), reason="systemd is running here")
def test_systemd_cgroup_driver_without_systemd(tmp_path: Path) -> None:
    proc = _serve(tmp_path, f'version = 2\n{RUNTIME}\ncgroup_driver = "systemd"\n')
    assert proc.returncode == 2, proc.stderr
    assert 'plugins."pycrid.cri.v1.runtime".cgroup_driver' in proc.stderr
    assert "systemd is not running on this host" in proc.stderr
    assert 'cgroup_driver = "cgroupfs"' in proc.stderr
    assert not (tmp_path / "state" / "pycrid.sock").exists()


def test_empty_cni_conf_dir_is_network_not_ready(tmp_path: Path) -> None:
    conf_dir = tmp_path / "empty-net.d"
    conf_dir.mkdir()
    config = f'version = 2\n{CNI_SECTION}\nconf_dir = "{conf_dir}"\n'
    with running_daemon(str(tmp_path), config) as d:
        st = d.client.runtime.Status(pb.StatusRequest(), timeout=5).status
        conds = {c.type: c for c in st.conditions}
        assert conds["RuntimeReady"].status is True
        net = conds["NetworkReady"]
        assert net.status is False
        assert net.reason == "NetworkPluginNotReady"
        assert str(conf_dir) in net.message
        assert "no network config found" in net.message
