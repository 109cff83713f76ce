"""The daemon as a process: socket, lock, config errors, signals, and the runtime-wide calls."""

from __future__ import annotations

import json
import os
import re
import socket
import stat
import subprocess
import sys
from pathlib import Path

import grpc
import pytest
from cri_api.v1 import api_pb2 as pb

from pycrid import release
from tests.support.daemon import (
    CRIClient,
    running_daemon,
    serve_command,
    wait_ready,
    with_private_cadvisor,
    with_private_sockets,
)

pytestmark = pytest.mark.e2e


def test_version_status_runtime_config(tmp_path: Path) -> None:
    with running_daemon(str(tmp_path)) as d:
        v = d.client.runtime.Version(pb.VersionRequest(), timeout=5)
        assert (v.runtime_name, v.runtime_api_version) == ("pycrid", "v1")
        # The release with the commit it was built from (this checkout's HEAD).
        assert v.runtime_version == release.runtime_version()
        assert v.runtime_version.startswith(release.VERSION)
        st = d.client.runtime.Status(pb.StatusRequest(verbose=True), timeout=5)
        conds = {c.type: c for c in st.status.conditions}
        assert conds["RuntimeReady"].status is True
        assert conds["NetworkReady"].status is True  # the test network (tests/support)
        cni = json.loads(st.info["cniconfig"])
        assert [n["Config"]["Name"] for n in cni["Networks"]] == ["pycrid-test"]
        config = json.loads(st.info["config"])
        assert config["root"] == d.root
        daemon = json.loads(st.info["daemon"])
        assert (daemon["version"], daemon["commit"]) == (release.VERSION, release.commit())
        shown = subprocess.run([sys.executable, "-m", "pycrid", "status", "--address",
                                d.address], capture_output=True, text=True, timeout=30)
        assert re.search(rf"^Release: +{re.escape(release.VERSION)}, commit "
                         rf"{release.commit() or 'unknown'}$", shown.stdout, re.M), shown.stdout
        assert json.loads(st.info["warnings"]) == []
        rc = d.client.runtime.RuntimeConfig(pb.RuntimeConfigRequest(), timeout=5)
        assert rc.linux.cgroup_driver == pb.CgroupDriver.CGROUPFS
        mode = stat.S_IMODE(os.stat(d.address).st_mode)
        assert mode == 0o660
        assert stat.S_ISSOCK(os.stat(d.address).st_mode)
    assert d.proc.returncode == 0
    assert not os.path.exists(d.address)
    assert "stopped" in d.log()


def test_every_cri_rpc_is_served(tmp_path: Path) -> None:
    """All 35 methods of CRI v1 (RuntimeService 30, ImageService 5), each called with an
    empty request over the real socket: an answer or a refusal of the request, never
    UNIMPLEMENTED (the edge's answer for a method no servicer has; tests/unit/
    test_instrument.py checks that one)."""
    services = {s.name: s for s in pb.DESCRIPTOR.services_by_name.values()}
    assert (len(services["RuntimeService"].methods), len(services["ImageService"].methods)) == (
        30, 5)
    with running_daemon(str(tmp_path)) as d:
        stubs = {"RuntimeService": d.client.runtime, "ImageService": d.client.images}
        codes = {}
        for name, service in services.items():
            for method in service.methods:
                call = getattr(stubs[name], method.name)
                request = getattr(pb, method.input_type.name)()
                try:
                    answer = call(request, timeout=10)
                    if method.server_streaming:
                        answer.cancel()
                    codes[method.name] = grpc.StatusCode.OK
                except grpc.RpcError as e:
                    codes[method.name] = e.code()
        assert len(codes) == 35
        assert [m for m, c in codes.items() if c == grpc.StatusCode.UNIMPLEMENTED] == []
        assert codes["CheckpointContainer"] == grpc.StatusCode.INVALID_ARGUMENT


def test_second_daemon_on_same_socket_is_refused(tmp_path: Path) -> None:
    with running_daemon(str(tmp_path / "a")) as d:
        other = tmp_path / "b"
        proc = subprocess.run(
            serve_command(None, str(other / "root"), str(other / "state"), d.address),
            capture_output=True, text=True, timeout=60)
        assert proc.returncode == 1
        assert (f"the CRI socket {d.address} is in use by another pycrid (pid {d.proc.pid} "
                f"holds the lock {d.address}.lock)") in proc.stderr
        # The first one is untouched.
        assert d.client.runtime.Version(pb.VersionRequest(), timeout=5).runtime_name == "pycrid"


def test_stale_socket_is_replaced(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    stale = socket.socket(socket.AF_UNIX)
    stale.bind(str(state / "pycrid.sock"))
    stale.close()  # the file stays, nobody listens: a crashed daemon's leftover
    with running_daemon(str(tmp_path)) as d:
        assert d.client.runtime.Version(pb.VersionRequest(), timeout=5).runtime_name == "pycrid"
        assert "replacing stale socket" in d.log()


def test_an_unknown_key_stops_start_up_naming_it(tmp_path: Path) -> None:
    """A key this release does not know, such as a newer release's in a config kept
    through a rollback, is not ignored: start-up stops (exit 2) naming it."""
    path = tmp_path / "config.toml"
    path.write_text('version = 2\nfrobnicate = true\n'
                    '[plugins."pycrid.cri.v1.images"]\nsandbox_imag = "x"\n')
    proc = subprocess.run(
        serve_command(str(path), str(tmp_path / "r"), str(tmp_path / "s"),
                      str(tmp_path / "s" / "x.sock")),
        capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "invalid configuration: 2 errors:" in proc.stderr
    assert f"config key frobnicate: not a key of pycrid {release.VERSION}" in proc.stderr
    assert ('config key plugins."pycrid.cri.v1.images".sandbox_imag: not a key of pycrid '
            f"{release.VERSION}; did you mean `sandbox_image`?") in proc.stderr
    assert not (tmp_path / "s" / "x.sock").exists()


@pytest.mark.parametrize(
    ("config", "key"),
    [
        ('version = 2\n[plugins."pycrid.cri.v1.images"]\nmax_concurrent_downloads = -1\n',
         'plugins."pycrid.cri.v1.images".max_concurrent_downloads'),
        ('version = 2\n[debug]\nformat = "xml"\n', "debug.format"),
        ("version = 7\n", "version"),
        # A configured signature policy must exist (only the default path may be absent).
        ('version = 2\n[plugins."pycrid.cri.v1.images"]\n'
         'signature_policy = "/nonexistent/policy.json"\n',
         'plugins."pycrid.cri.v1.images".signature_policy'),
    ],
)
def test_invalid_config_stops_startup_naming_the_key(tmp_path: Path, config: str,
                                                     key: str) -> None:
    path = tmp_path / "config.toml"
    path.write_text(config)
    proc = subprocess.run(
        serve_command(str(path), str(tmp_path / "r"), str(tmp_path / "s"),
                      str(tmp_path / "s" / "x.sock")),
        capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert key in proc.stderr
    assert "invalid configuration" in proc.stderr
    assert not (tmp_path / "s" / "x.sock").exists()


def test_every_invalid_value_is_reported_in_one_start(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    path.write_text('version = 2\n[debug]\nformat = "xml"\n'
                    '[plugins."pycrid.cri.v1.images"]\nmax_concurrent_downloads = -1\n'
                    '[plugins."pycrid.cri.v1.runtime"]\ncgroup_drivr = "systemd"\n')
    proc = subprocess.run(
        serve_command(str(path), str(tmp_path / "r"), str(tmp_path / "s"),
                      str(tmp_path / "s" / "x.sock")),
        capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "invalid configuration: 3 errors:" in proc.stderr
    assert "config key debug.format: must be one of" in proc.stderr
    assert ('config key plugins."pycrid.cri.v1.images".max_concurrent_downloads: must be at '
            "least 1") in proc.stderr
    assert ('config key plugins."pycrid.cri.v1.runtime".cgroup_drivr: not a key of pycrid '
            f"{release.VERSION}; did you mean `cgroup_driver`?") in proc.stderr


def test_json_logs_and_sigint(tmp_path: Path) -> None:
    root, state = tmp_path / "root", tmp_path / "state"
    address = str(state / "pycrid.sock")
    config = tmp_path / "config.toml"
    config.write_text(with_private_sockets("version = 2\n", str(tmp_path)))
    cmd = [*serve_command(str(config), str(root), str(state), address), "--log-format", "json"]
    log_path = tmp_path / "log"
    with open(log_path, "wb") as logf:
        proc = subprocess.Popen(cmd, stdout=logf, stderr=logf)
    from tests.support.daemon import Daemon

    d = Daemon(root=str(root), state=str(state), address=address, log_path=str(log_path),
               proc=proc, client=CRIClient(address))
    try:
        wait_ready(d)
    finally:
        d.client.close()
        proc.send_signal(2)
        proc.wait(30)
    assert proc.returncode == 0
    lines = [json.loads(line) for line in log_path.read_text().splitlines() if line.strip()]
    assert any(rec["msg"] == "pycrid is ready" for rec in lines)
    assert all({"time", "level", "msg"} <= rec.keys() for rec in lines)
    # debug level: every call is logged with its request id
    assert any(rec.get("rpc") == "/runtime.v1.RuntimeService/Version" and "request_id" in rec
               for rec in lines)


def test_tcp_listener_when_enabled(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    config = (f'version = 2\n[grpc]\ntcp_address = "127.0.0.1:{port}"\n'
              '[plugins."pycrid.grpc.v1.cri"]\ndisable_tcp_service = false\n')
    with running_daemon(str(tmp_path), config):
        channel = grpc.insecure_channel(f"127.0.0.1:{port}")
        try:
            from cri_api.v1 import api_pb2_grpc as pb_grpc

            v = pb_grpc.RuntimeServiceStub(channel).Version(pb.VersionRequest(), timeout=5)
            assert v.runtime_name == "pycrid"
        finally:
            channel.close()


def test_config_default_and_migrate_commands(tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, "-m", "pycrid", "config", "default"],
                         capture_output=True, text=True, check=True).stdout
    assert 'address = "/run/pycrid/pycrid.sock"' in out
    assert "max_concurrent_downloads = 3" in out
    old = tmp_path / "old.toml"
    old.write_text('version = 1\n[plugins."pycrid.grpc.v1.cri"]\nsandbox_image = "x.io/p:1"\n')
    new = subprocess.run([sys.executable, "-m", "pycrid", "config", "migrate", "-c", str(old)],
                         capture_output=True, text=True, check=True).stdout
    assert "version = 2" in new
    assert '[plugins."pycrid.cri.v1.images"]' in new
    assert 'sandbox_image = "x.io/p:1"' in new


def test_disabling_a_needed_plugin_stops_startup_with_its_name(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    path.write_text('version = 2\ndisabled_plugins = ["pycrid.cri.v1.images"]\n')
    proc = subprocess.run(
        serve_command(str(path), str(tmp_path / "r"), str(tmp_path / "s"),
                      str(tmp_path / "s" / "x.sock")),
        capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    # The first plugin that needs the images service names it.
    assert "pycrid.sandbox.v1.podsandbox" in proc.stderr
    assert "pycrid.cri.v1.images" in proc.stderr and "disabled" in proc.stderr
    assert not (tmp_path / "s" / "x.sock").exists()


def test_tcp_listener_config_errors_name_the_key(tmp_path: Path) -> None:
    for body, key in (
        ('[plugins."pycrid.grpc.v1.cri"]\ndisable_tcp_service = false\n', "grpc.tcp_address"),
        ('[grpc]\ntcp_address = "127.0.0.1:0"\ntcp_tls_cert = "/nonexistent/cert.pem"\n'
         'tcp_tls_key = "/nonexistent/key.pem"\n'
         '[plugins."pycrid.grpc.v1.cri"]\ndisable_tcp_service = false\n', "grpc.tcp_tls_cert"),
    ):
        path = tmp_path / "config.toml"
        path.write_text(with_private_cadvisor("version = 2\n" + body, str(tmp_path)))
        proc = subprocess.run(
            serve_command(str(path), str(tmp_path / "r"), str(tmp_path / "s"),
                          str(tmp_path / "s" / "x.sock")),
            capture_output=True, text=True, timeout=60)
        assert proc.returncode == 2, proc.stderr
        assert f"config key {key}" in proc.stderr
        assert not (tmp_path / "s" / "x.sock").exists()
