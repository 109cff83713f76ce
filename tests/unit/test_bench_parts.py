"""The pure parts of ``pycrid bench``: statistics, the report table, the floor's bundle,
the sandbox image a runtime reports, argument checks, and the /proc readers."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pycrid import cli
from pycrid.bench import nri_load as nri
from pycrid.bench.command import int_list
from pycrid.bench.cri import Pods
from pycrid.bench.floor import floor_spec, host_rootfs
from pycrid.bench.procs import accepted_connections, memory_kib, socket_owner
from pycrid.bench.report import Section, guarded, table
from pycrid.bench.run import default_endpoint, sandbox_image_of
from pycrid.bench.target import Target
from pycrid.bench.timing import p90, stats, timed


def test_stats_of_samples() -> None:
    vals = [float(v) for v in range(1, 11)]
    s = stats(vals)
    assert s == {"median": 5.5, "p90": pytest.approx(9.1), "min": 1.0, "max": 10.0, "n": 10}
    assert stats([3.0])["p90"] == 3.0 and stats([3.0])["median"] == 3.0
    assert p90([1.0, 2.0]) == pytest.approx(1.9)
    with pytest.raises(ValueError):
        stats([])


def test_timed_returns_the_value_and_milliseconds() -> None:
    ms, got = timed(lambda: (time.sleep(0.01), 42)[1])
    assert got == 42 and ms >= 10.0


def test_ratio_is_median_over_the_floor_median() -> None:
    sec = Section("lifecycle")
    sec.figure("CreateContainer", [10.0, 30.0, 20.0], floor="runc create")
    sec.figure("orphan", [1.0], floor="no such floor")
    sec.floor("runc create", [4.0, 5.0, 6.0])
    sec.finish()
    assert sec.figures["CreateContainer"]["ratio"] == pytest.approx(20.0 / 5.0)
    assert sec.figures["orphan"]["floor"] is None and sec.figures["orphan"]["ratio"] is None
    doc = sec.as_json()
    assert doc["samples"]["CreateContainer"] == [10.0, 30.0, 20.0]
    assert doc["skipped"] is None and doc["floors"]["runc create"]["n"] == 3


def test_table_rows_floors_skips_and_notes() -> None:
    times = Section("lifecycle", notes=["a note"])
    times.floor("runc create", [4.0, 5.0, 6.0])
    times.figure("CreateContainer", [10.0, 12.0, 14.0], floor="runc create")
    times.finish()
    mem = Section("rss")
    mem.floor("daemon RSS idle", [65632], unit="KiB")
    mem.figure("daemon RSS, 3 pods", [67464], unit="KiB", floor="daemon RSS idle")
    mem.finish()
    text = table([times, mem, Section("nri", skipped="no NRI socket")])
    lines = text.splitlines()
    assert lines[0].split() == ["section", "figure", "unit", "median", "p90", "floor", "ratio"]
    assert set(lines[1]) == {"-"}
    row = next(line for line in lines if "CreateContainer" in line).split()
    assert row[-4:] == ["12.0", f"{p90([10.0, 12.0, 14.0]):.1f}", "5.00", "2.40x"]
    assert any(line.split()[1:4] == ["floor:", "runc", "create"] for line in lines)
    mem_row = next(line for line in lines if "3 pods" in line).split()
    assert mem_row[-4:] == ["67,464", "-", "65,632", "1.03x"]  # one sample: no p90
    assert any("skipped: no NRI socket" in line for line in lines)
    assert lines[-2:] == ["notes:", "  lifecycle: a note"]


def test_a_failing_section_is_an_error_and_the_run_goes_on() -> None:
    errors: list[str] = []

    def broken() -> Section:
        raise RuntimeError("RunPodSandbox: network not ready\ndetails")

    sec = guarded("lifecycle", broken, errors)
    assert sec.skipped == "error: RunPodSandbox: network not ready"
    assert errors == ["lifecycle: RunPodSandbox: network not ready"]


def test_nri_without_a_socket_is_skipped_with_a_reason(tmp_path: Path) -> None:
    target = Target(tmp_path, None, Pods(None), "busybox", "unix:///x.sock", None, None)
    sec = nri.run(target, [0, 1, 5], rounds=1)
    assert sec.skipped is not None and "--nri-socket" in sec.skipped
    assert not sec.figures


def test_sandbox_image_as_runtimes_report_it() -> None:
    assert sandbox_image_of({"images": {"sandbox_image": "reg/pause:3.10", "count": 1}}) \
        == "reg/pause:3.10"
    # containerd 1.x and 2.x verbose Status
    assert sandbox_image_of({"config": {"sandboxImage": "registry.k8s.io/pause:3.8"}}) \
        == "registry.k8s.io/pause:3.8"
    assert sandbox_image_of({"config": {"PinnedImages": {"sandbox": "k8s/pause:3.10"}}}) \
        == "k8s/pause:3.10"
    assert sandbox_image_of({"config": "not json"}) is None
    assert sandbox_image_of({}) is None


def test_default_endpoint_is_the_configs_socket(tmp_path: Path) -> None:
    cfg = tmp_path / "config.toml"
    cfg.write_text('version = 2\n[grpc]\naddress = "/run/elsewhere/pycrid.sock"\n')
    assert default_endpoint(str(cfg)) == "/run/elsewhere/pycrid.sock"


def test_floor_rootfs_binds_host_directories_and_copies_symlinks(tmp_path: Path) -> None:
    host = tmp_path / "host"
    (host / "usr" / "bin").mkdir(parents=True)
    (host / "lib32").mkdir()
    os.symlink("usr/bin", host / "bin")
    rootfs = tmp_path / "rootfs"
    mounts = host_rootfs(rootfs, host)
    assert [(m["destination"], m["source"]) for m in mounts] == [
        ("/usr", str(host / "usr")), ("/lib32", str(host / "lib32"))]
    assert all({"rbind", "ro"} <= set(m["options"]) for m in mounts)
    assert os.readlink(rootfs / "bin") == "usr/bin"
    assert not (rootfs / "lib64").exists()
    assert {p.name for p in rootfs.iterdir()} == {"usr", "lib32", "bin", "proc", "dev",
                                                 "sys", "tmp"}


def test_floor_spec_is_pycrids_base_spec_read_only(tmp_path: Path) -> None:
    spec = floor_spec(tmp_path / "rootfs", ["sleep", "3600"])
    assert spec["root"] == {"path": str(tmp_path / "rootfs"), "readonly": True}
    assert spec["process"]["args"] == ["sleep", "3600"]
    assert spec["process"]["terminal"] is False
    assert all("path" not in ns for ns in spec["linux"]["namespaces"])
    destinations = [m["destination"] for m in spec["mounts"]]
    assert {"/proc", "/dev", "/sys", "/usr"} <= set(destinations)


def test_bench_arguments() -> None:
    assert int_list("0,1, 5") == [0, 1, 5]
    with pytest.raises(Exception, match="non-negative"):
        int_list("1,-2")
    with pytest.raises(SystemExit) as e:
        cli.main(["bench"])  # --image is required
    assert e.value.code == 2
    assert cli.main(["bench", "--image", "busybox", "--iterations", "0"]) == 2
    assert cli.main(["bench", "--image", "busybox", "--endpoint", "tcp://x:1"]) == 2


def test_socket_owner_and_accepted_connections(tmp_path: Path) -> None:
    path = tmp_path / "s.sock"
    server = subprocess.Popen(
        [sys.executable, "-c",
         "import socket, sys, time\n"
         "s = socket.socket(socket.AF_UNIX); s.bind(sys.argv[1]); s.listen()\n"
         "conns = []\n"
         "print('ready', flush=True)\n"
         "while True: conns.append(s.accept()[0])\n", str(path)],
        stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout is not None and server.stdout.readline() == "ready\n"
        clients = [socket.socket(socket.AF_UNIX) for _ in range(2)]
        for c in clients:
            c.connect(str(path))
        deadline = time.monotonic() + 10
        while accepted_connections(str(path)) != 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert accepted_connections(str(path)) == 2
        # Last: asking who listens is a connection of its own (this server keeps it).
        assert socket_owner(str(path)) == server.pid
        assert socket_owner(str(tmp_path / "none.sock")) is None
        rss, pss = memory_kib(server.pid)
        assert rss > 0 and 0 < pss <= rss
        for c in clients:
            c.close()
    finally:
        server.kill()
        server.wait()
