"""Running under systemd: the unit file, sd_notify readiness and journald-style logs."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from cri_api.v1 import api_pb2 as pb

from tests.support.daemon import CRIClient, serve_command, with_private_sockets
from tests.support.network import with_private_cni

pytestmark = pytest.mark.e2e


def _install(unit_dir: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pycrid", "install-service", "--unit-dir",
                           str(unit_dir), *extra], capture_output=True, text=True, timeout=60)


def test_install_service_writes_the_unit(tmp_path: Path) -> None:
    proc = _install(tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "systemctl daemon-reload && systemctl enable --now pycrid" in proc.stdout
    unit = (tmp_path / "pycrid.service").read_text()
    exe = os.path.join(os.path.dirname(sys.executable), "pycrid")  # the venv's script
    lines = set(unit.splitlines())
    assert f"ExecStart={exe} serve" in lines
    assert os.access(exe, os.X_OK)
    for want in ("Type=notify", "Delegate=yes", "KillMode=process", "Restart=always",
                 "RestartSec=5", "LimitNPROC=infinity", "LimitCORE=infinity",
                 "LimitNOFILE=1048576", "TasksMax=infinity", "OOMScoreAdjust=-999",
                 "ExecStartPre=-/sbin/modprobe overlay",
                 "After=network.target local-fs.target", "WantedBy=multi-user.target"):
        assert want in lines, want
    assert "@PYCRID@" not in unit
    # The path is in ExecStart and nowhere else (not in a comment, where it made no sense).
    assert [line for line in unit.splitlines() if exe in line] == [f"ExecStart={exe} serve"]
    assert unit.startswith("# pycrid, a Kubernetes CRI runtime. Written by `pycrid "
                           "install-service`, which puts\n# the absolute path of the pycrid "
                           "executable in ExecStart.\n")

    again = _install(tmp_path)
    assert again.returncode == 0 and "already up to date" in again.stdout
    (tmp_path / "pycrid.service").write_text(unit + "# local edit\n")
    refused = _install(tmp_path)
    assert refused.returncode == 1 and "--force" in refused.stderr
    assert (tmp_path / "pycrid.service").read_text().endswith("# local edit\n")
    assert _install(tmp_path, "--force").returncode == 0
    assert (tmp_path / "pycrid.service").read_text() == unit


def test_unit_passes_systemd_analyze_verify(tmp_path: Path) -> None:
    if shutil.which("systemd-analyze") is None:
        pytest.skip("systemd-analyze is not installed")
    assert _install(tmp_path).returncode == 0
    proc = subprocess.run(["systemd-analyze", "verify", str(tmp_path / "pycrid.service")],
                          capture_output=True, text=True, timeout=60)
    # It checks keys and the ExecStart binary offline; it needs no running systemd.
    assert proc.returncode == 0, proc.stderr
    assert "Unknown key" not in proc.stderr and "Failed to parse" not in proc.stderr


def _fields(data: bytes) -> dict[str, str]:
    return dict(line.split("=", 1) for line in data.decode().splitlines())


def test_notify_ready_stopping_and_journald_lines(tmp_path: Path) -> None:
    root, state = tmp_path / "root", tmp_path / "state"
    address = str(state / "pycrid.sock")
    config = tmp_path / "config.toml"
    config.write_text(with_private_cni(with_private_sockets("version = 2\n", str(tmp_path)),
                                       str(tmp_path)))
    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    notify.bind(str(tmp_path / "notify"))
    notify.settimeout(60)
    log_path = tmp_path / "log"
    with open(log_path, "wb") as logf:
        st = os.fstat(logf.fileno())
        env = {**os.environ, "NOTIFY_SOCKET": str(tmp_path / "notify"),
               "JOURNAL_STREAM": f"{st.st_dev}:{st.st_ino}"}
        proc = subprocess.Popen(serve_command(str(config), str(root), str(state), address),
                                stdout=logf, stderr=logf, env=env)
    client = CRIClient(address)
    try:
        ready = _fields(notify.recv(4096))
        # At READY=1 the daemon answers (before it, every call is UNAVAILABLE).
        conds = {c.type: c.status for c in client.runtime.Status(
            pb.StatusRequest(), timeout=5).status.conditions}
        assert conds["RuntimeReady"] is True
        assert ready == {"READY": "1", "MAINPID": str(proc.pid),
                         "STATUS": f"serving CRI on {address}"}
        proc.send_signal(signal.SIGTERM)
        stopping = _fields(notify.recv(4096))
        assert stopping["STOPPING"] == "1"
        assert proc.wait(30) == 0
    finally:
        client.close()
        notify.close()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    lines = [line for line in log_path.read_text().splitlines() if line.strip()]
    assert "<6>pycrid: pycrid is ready" in lines
    assert "<6>pycrid: stopped" in lines
    assert any(line.startswith("<7>") for line in lines)  # --log-level debug
    # Every line (tracebacks included) carries a priority, none a timestamp of its own.
    assert all(line[:3] in ("<3>", "<4>", "<6>", "<7>") for line in lines), lines[:5]
    assert not any(line[3:5] == "20" for line in lines)
