"""``pycrid status`` and ``pycrid nri plugins`` as subprocesses against a real daemon with
a pod, a running container and an external NRI plugin connected."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pycrid import release
from tests.support.daemon import Daemon, containerd_socket, nri_paths
from tests.support.images import TestImages
from tests.support.network import conf_dir
from tests.support.nri_plugins import external_plugin, has_event, wait_events
from tests.support.pods import Pods, busybox_daemon, container_config, pod_config, wait_for
from tests.support.registry import LocalRegistry

pytestmark = pytest.mark.e2e


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pycrid", *args], capture_output=True,
                          text=True, timeout=60)


def cli_json(*args: str) -> tuple[int, Any]:
    proc = cli(*args, "--json")
    assert proc.stdout, proc.stderr
    return proc.returncode, json.loads(proc.stdout)


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory, registry: LocalRegistry,
           test_images: TestImages) -> Iterator[Daemon]:
    base = tmp_path_factory.mktemp("status")
    with busybox_daemon(base, registry, test_images) as d:
        yield d


def test_status_and_plugins(daemon: Daemon, pods: Pods, tmp_path: Path) -> None:
    sock = daemon.address
    rc, empty = cli_json("status", "--address", sock)
    assert rc == 0
    assert empty["runtime"] == {"name": "pycrid", "version": release.runtime_version(),
                                "api_version": "v1"}
    assert (empty["daemon"]["version"], empty["daemon"]["commit"]) == (release.VERSION,
                                                                       release.commit())
    assert {c["type"]: c["status"] for c in empty["conditions"]} == {
        "RuntimeReady": True, "NetworkReady": True}
    assert empty["pods"] == {"SANDBOX_READY": 0, "SANDBOX_NOTREADY": 0}
    nri_socket = nri_paths(daemon.extra["base"])["socket_path"]
    assert empty["nri"] == {"enabled": True, "socket": nri_socket, "plugins": []}
    assert empty["ready"] is True
    d = empty["daemon"]
    assert d["pid"] == daemon.proc.pid and d["uptime_seconds"] >= 0
    assert d["config_file"] == os.path.join(daemon.extra["base"], "config.toml")
    assert (d["root"], d["state"]) == (daemon.root, daemon.state)
    assert d["sockets"] == {"cri": daemon.address, "nri": nri_socket, "metrics": "",
                            "containerd": containerd_socket(daemon.extra["base"])}
    assert empty["streaming"]["url"].startswith("http://127.0.0.1:")
    assert empty["images"]["count"] == 1  # busybox, pulled by the fixture
    assert empty["images"]["bytes"] > 0
    assert empty["network"]["conf_dir"] == conf_dir(daemon.extra["base"])
    assert [n["name"] for n in empty["network"]["networks"]] == ["pycrid-test"]
    assert empty["network"]["error"] == "" and empty["warnings"] == []
    text = dict(line.split(":", 1) for line in cli("status", "--address", sock).stdout
                .splitlines())
    assert text["PID"].strip().startswith(f"{daemon.proc.pid}, up ")
    assert text["CRI socket"].strip() == daemon.address
    assert text["containerd API"].strip().startswith(containerd_socket(daemon.extra["base"]))
    assert text["Config"].strip() == d["config_file"]
    assert text["CNI networks"].strip().startswith("pycrid-test (")
    assert text["Images"].strip().startswith("1 (")
    # Debian's runc 1.1 has no idmapped mounts: no pods in a user namespace here.
    assert [(h["name"], h["user_namespaces"]) for h in empty["handlers"]
            if not h["sandboxed"]] == [("runc", False)]
    handler_rows = {k.strip(): v for k, v in text.items()}
    assert "no user namespaces (its runc lacks idmapped mounts: runc 1.2 or later)" in \
        handler_rows["runc"], text

    record = tmp_path / "plugin.jsonl"
    with external_plugin(nri_socket, "recorder", "stat", "42", record=record) as plugin:
        wait_events(record, has_event("Synchronize"), 20, "the plugin to synchronise")
        pod = pod_config()
        sid = pods.run(pod)
        cid = pods.run_container(sid, container_config(daemon.extra["busybox"], "sleeper",
                                                       command=["sleep", "300"]), pod)
        created = pods.create(sid, container_config(daemon.extra["busybox"], "idle",
                                                     command=["true"]), pod)

        rc, st = cli_json("status", "--address", sock)
        assert rc == 0
        assert st["pods"] == {"SANDBOX_READY": 1, "SANDBOX_NOTREADY": 0}
        assert st["containers"] == {"CONTAINER_CREATED": 1, "CONTAINER_RUNNING": 1,
                                    "CONTAINER_EXITED": 0, "CONTAINER_UNKNOWN": 0}
        [p] = st["nri"]["plugins"]
        assert (p["name"], p["index"], p["pid"]) == ("stat", "42", plugin.pid)
        assert "CreateContainer" in p["events"] and "RunPodSandbox" in p["events"]
        assert p["calls"]["CreateContainer"]["count"] == 2
        assert p["calls"]["CreateContainer"]["errors"] == 0
        assert p["calls"]["RunPodSandbox"]["count"] == 1
        assert p["calls"]["StartContainer"]["count"] == 1
        assert p["calls"]["CreateContainer"]["max_ms"] >= p["calls"]["CreateContainer"][
            "mean_ms"] > 0

        rc, nri = cli_json("nri", "plugins", "--address", sock)
        assert rc == 0 and nri["enabled"] is True and len(nri["plugins"]) == 1
        [q] = nri["plugins"]
        assert {k: q[k] for k in ("name", "index", "events", "pid", "connected_since")} == {
            k: p[k] for k in ("name", "index", "events", "pid", "connected_since")}
        assert q["calls"]["CreateContainer"]["count"] == 2
        table = cli("nri", "plugins", "--address", sock)
        assert table.returncode == 0
        header, row = table.stdout.splitlines()
        assert header.split() == ["INDEX", "NAME", "EVENTS", "CALLS", "ERRORS", "MEAN", "LAST",
                                  "ERROR"]
        cells = row.split()
        assert cells[:2] == ["42", "stat"] and int(cells[4]) == 0 and cells[6] == "-"
        assert int(cells[3]) >= 2 + 1 + 1  # Configure, Synchronize, RunPodSandbox, ...

        text = cli("status", "--address", sock)
        assert text.returncode == 0
        lines = dict(line.split(":", 1) for line in text.stdout.splitlines())
        assert lines["Pods"].strip() == "1 ready, 0 notready"
        assert lines["Containers"].strip() == "1 created, 1 running, 0 exited, 0 unknown"
        assert lines["NRI plugins"].strip() == "1"
        assert lines["  42-stat"].strip().startswith(
            f"{','.join(p['events'])}; ") and ", 0 errors" in lines["  42-stat"]
        pods.remove(created)
        pods.stop(cid)
    pods.cleanup()

    # A network condition turning false is exit code 1 (the conf dir is watched).
    conflist = Path(conf_dir(daemon.extra["base"])) / "10-test.conflist"
    aside = tmp_path / "10-test.conflist"
    os.rename(conflist, aside)
    try:
        wait_for(lambda: cli("status", "--address", sock).returncode == 1,
                 what="NetworkReady to turn false")
        rc, st = cli_json("status", "--address", sock)
        assert rc == 1
        net = next(c for c in st["conditions"] if c["type"] == "NetworkReady")
        assert net["status"] is False and net["reason"] == "NetworkPluginNotReady"
    finally:
        os.rename(aside, conflist)
    wait_for(lambda: cli("status", "--address", sock).returncode == 0,
             what="NetworkReady to come back")


def test_unreachable_socket_is_exit_2(tmp_path: Path) -> None:
    sock = str(tmp_path / "nobody.sock")
    for args in (("status",), ("nri", "plugins")):
        proc = cli(*args, "--address", sock)
        assert proc.returncode == 2, args
        assert f"pycrid: nothing answers at {sock}: no such file" in proc.stderr
        assert "StatusCode" not in proc.stderr and "UNAVAILABLE" not in proc.stderr
        assert proc.stdout == ""
    # --json stays JSON (tests/unit/test_status_unreachable.py has every reason).
    code, doc = cli_json("status", "--address", sock)
    assert code == 2
    assert doc["ready"] is False and doc["error"].startswith(f"nothing answers at {sock}")


def test_default_address_comes_from_the_config(tmp_path: Path) -> None:
    sock = str(tmp_path / "from-config.sock")
    config = tmp_path / "config.toml"
    config.write_text(f'version = 2\n[grpc]\naddress = "{sock}"\n')
    proc = cli("status", "--config", str(config))
    assert proc.returncode == 2
    assert sock in proc.stderr


def test_a_failing_plugin_shows_its_last_error(daemon: Daemon, pods: Pods,
                                              tmp_path: Path) -> None:
    nri_socket = nri_paths(daemon.extra["base"])["socket_path"]
    record = tmp_path / "failing.jsonl"
    with external_plugin(nri_socket, "fail", "flaky", "43", "--on", "PostStartContainer",
                         "--reason", "out of tokens", record=record):
        wait_events(record, has_event("Synchronize"), 20, "the plugin to synchronise")
        pod = pod_config()
        sid = pods.run(pod)
        # A Post* event is one whose error is only logged: the call succeeds.
        pods.run_container(sid, container_config(daemon.extra["busybox"], "c",
                                                 command=["sleep", "300"]), pod)
        wait_events(record, has_event("Failing"), 20, "the plugin to fail PostStartContainer")
        rc, nri = cli_json("nri", "plugins", "--address", daemon.address)
        assert rc == 0
        [p] = [p for p in nri["plugins"] if p["name"] == "flaky"]
        assert p["last_error"] == "PostStartContainer: out of tokens"
        assert p["calls"]["PostStartContainer"] == {**p["calls"]["PostStartContainer"],
                                                    "count": 1, "errors": 1}
        assert p["calls"]["CreateContainer"]["errors"] == 0
        text = cli("status", "--address", daemon.address).stdout
        [row] = [line for line in text.splitlines() if line.startswith("  43-flaky:")]
        assert "1 errors" in row and row.endswith("last error: PostStartContainer: out of tokens")
    pods.cleanup()
