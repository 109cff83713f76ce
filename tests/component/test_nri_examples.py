"""The example plugins under examples/nri, run as real processes the two ways a
runtime meets them: launched as pre-installed plugins (socket on fd 3, the
three NRI_* variables as the whole environment, no arguments) and dialling a
socket as external plugins. The runtime side is the test's RuntimePeer."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
from collections.abc import AsyncIterator, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path

import pytest

from pycrid.nri import api
from pycrid.nri.wire.ttrpc import Code, TtrpcError
from tests.support.nri_runtime import RuntimePeer, launched_plugin, reap

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "nri"

POD = api.PodSandbox(
    id="pod1",
    name="web",
    namespace="default",
    annotations={
        "ulimits.noderesource.dev/container.app": (
            "- type: RLIMIT_NOFILE\n  hard: 4096\n  soft: 1024\n- type: nproc\n  hard: 9000\n"
            "  soft: 8000\n"
        ),
        "devices.noderesource.dev/container.app": (
            "- path: /dev/nri-null\n  type: c\n  major: 1\n  minor: 3\n  file_mode: 0666\n"
        ),
        "mounts.noderesource.dev/pod": (
            "- source: /srv/shared\n  destination: /host-dir\n  type: bind\n"
            "  options: [bind, ro]\n"
        ),
        "cdi-devices.noderesource.dev": "- vendor.com/gpu=0\n",
    },
)
APP = api.Container(id="c1", pod_sandbox_id="pod1", name="app")
OTHER = api.Container(id="c2", pod_sandbox_id="pod1", name="sidecar")


def wrapper(plugin_dir: Path, base: str, script: str, *args: str) -> Path:
    """The pre-installed wrapper the examples' README tells operators to write."""
    path = plugin_dir / base
    argv = " ".join([sys.executable, str(EXAMPLES / script), *args])
    path.write_text(f'#!/bin/sh\nexec {argv} "$@"\n')
    path.chmod(0o755)
    return path


def preinstalled(
    path: Path,
) -> AbstractAsyncContextManager[tuple[RuntimePeer, subprocess.Popen[bytes]]]:
    """Launch ``path`` as containerd does, named after its NN-name file name."""
    idx, name = api.parse_plugin_name(path.name)
    return launched_plugin([str(path)], name, idx, path.parent / f"{path.name}.log")


@asynccontextmanager
async def external(
    tmp_path: Path, script: str, *args: str
) -> AsyncIterator[tuple[RuntimePeer, subprocess.Popen[bytes]]]:
    """Start the example dialling a socket of ours, as an external plugin."""
    path = str(tmp_path / "nri.sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(1)
    listener.setblocking(False)
    proc = subprocess.Popen(  # noqa: ASYNC220 - started once, reaped by _reap
        [sys.executable, str(EXAMPLES / script), "--socket-path", path, *args],
        stderr=(tmp_path / "plugin.log").open("wb"),
    )
    peer = RuntimePeer()
    try:
        conn, _ = await asyncio.get_running_loop().sock_accept(listener)
        await peer.attach(conn)
        yield peer, proc
    finally:
        listener.close()
        await peer.aclose()
        await reap(proc)


async def start(peer: RuntimePeer, config: str = "") -> tuple[api.RegisterPluginRequest, int]:
    reg = await peer.registered
    resp = await peer.configure(config)
    await peer.call("Synchronize", api.SynchronizeRequest(pods=[POD], containers=[]))
    return reg, resp.events


async def create(peer: RuntimePeer, container: api.Container = APP) -> api.ContainerAdjustment:
    req = api.CreateContainerRequest(pod=POD, container=container)
    resp = await peer.call("CreateContainer", req)
    adjust: api.ContainerAdjustment = resp.adjust
    return adjust


def expected_rlimits() -> list[api.POSIXRlimit]:
    return [
        api.POSIXRlimit(type="RLIMIT_NOFILE", hard=4096, soft=1024),
        api.POSIXRlimit(type="RLIMIT_NPROC", hard=9000, soft=8000),
    ]


# ---------------------------------------------------------------- pre-installed


async def test_ulimit_adjuster_preinstalled(tmp_path: Path) -> None:
    path = wrapper(tmp_path, "20-ulimit-adjuster", "ulimit_adjuster.py")
    async with asyncio.timeout(20), preinstalled(path) as (peer, proc):
        reg, events = await start(peer)
        assert (reg.plugin_name, reg.plugin_idx) == ("ulimit-adjuster", "20")
        assert events == api.event_bit(api.Event.CREATE_CONTAINER)
        adjust = await create(peer)
        assert list(adjust.rlimits) == expected_rlimits()
        assert list((await create(peer, OTHER)).rlimits) == []
    assert proc.returncode == 0


async def test_device_injector_preinstalled(tmp_path: Path) -> None:
    path = wrapper(tmp_path, "30-device-injector", "device_injector.py")
    async with asyncio.timeout(20), preinstalled(path) as (peer, proc):
        reg, events = await start(peer)
        assert (reg.plugin_name, reg.plugin_idx) == ("device-injector", "30")
        assert events == api.event_bit(api.Event.CREATE_CONTAINER)
        adjust = await create(peer)
        dev = api.LinuxDevice(path="/dev/nri-null", type="c", major=1, minor=3)
        dev.file_mode.value = 0o666
        assert list(adjust.linux.devices) == [dev]
        assert list(adjust.mounts) == [
            api.Mount(destination="/host-dir", source="/srv/shared", type="bind",
                      options=["bind", "ro"])
        ]
        assert [d.name for d in adjust.CDI_devices] == ["vendor.com/gpu=0"]
        # The sidecar has no per-container device, but gets the pod-wide mount.
        other = await create(peer, OTHER)
        assert list(other.linux.devices) == []
        assert [m.destination for m in other.mounts] == ["/host-dir"]
    assert proc.returncode == 0


async def test_logger_preinstalled_with_config(tmp_path: Path) -> None:
    path = wrapper(tmp_path, "10-logger", "logger.py")
    log_file = tmp_path / "events.log"
    config = f"events: [CreateContainer, StopContainer]\nsetEnv: SEEN\nlogFile: {log_file}\n"
    async with asyncio.timeout(20), preinstalled(path) as (peer, proc):
        reg, events = await start(peer, config)
        assert (reg.plugin_name, reg.plugin_idx) == ("logger", "10")
        assert events == api.event_bit(api.Event.CREATE_CONTAINER) | api.event_bit(
            api.Event.STOP_CONTAINER
        )
        adjust = await create(peer)
        assert [(e.key, e.value) for e in adjust.env] == [
            ("-SEEN", ""),
            ("SEEN", f"logger-pid-{proc.pid}"),
        ]
        await peer.call("StopContainer", api.StopContainerRequest(pod=POD, container=APP))
    assert proc.returncode == 0
    logged = log_file.read_text()
    assert "CreateContainer" in logged and "StopContainer" in logged and 'id: "c1"' in logged


async def test_launched_plugin_with_bad_config_fails_configure(tmp_path: Path) -> None:
    path = wrapper(tmp_path, "10-logger", "logger.py")
    async with asyncio.timeout(20), preinstalled(path) as (peer, proc):
        await peer.registered
        with pytest.raises(TtrpcError) as err:
            await peer.configure("events: [NoSuchEvent]\n")
        assert "NoSuchEvent" in err.value.message
    # The plugin gives up when configuration fails, like the Go stub.
    assert proc.returncode == 1


# ---------------------------------------------------------------- external


@pytest.mark.parametrize(
    ("script", "args", "idx"),
    [
        ("logger.py", ("--idx", "10", "--add-annotation", "seen"), "10"),
        ("ulimit_adjuster.py", ("--name", "ulimits", "--idx", "20"), "20"),
        ("device_injector.py", ("--name", "devices", "--idx", "30"), "30"),
    ],
)
async def test_examples_run_as_external_plugins(
    tmp_path: Path, script: str, args: Sequence[str], idx: str
) -> None:
    async with asyncio.timeout(20), external(tmp_path, script, *args) as (peer, proc):
        reg, events = await start(peer)
        assert reg.plugin_idx == idx
        adjust = await create(peer)
        if script == "logger.py":
            assert reg.plugin_name == "logger.py"  # the program name, as the Go stub does
            assert events == api.VALID_EVENTS
            assert dict(adjust.annotations) == {"seen": f"logger-pid-{proc.pid}"}
        elif script == "ulimit_adjuster.py":
            assert list(adjust.rlimits) == expected_rlimits()
        else:
            assert [d.path for d in adjust.linux.devices] == ["/dev/nri-null"]
    assert proc.returncode == 0


# ---------------------------------------------------------------- bad annotations


@pytest.mark.parametrize(
    ("script", "annotation", "value", "message"),
    [
        ("ulimit_adjuster.py", "ulimits.noderesource.dev/container.app",
         "- type: RLIMIT_BOGUS\n  hard: 1\n  soft: 1\n", "RLIMIT_BOGUS"),
        ("ulimit_adjuster.py", "ulimits.noderesource.dev/container.app",
         "- type: nofile\n  hard: 1\n  soft: 2\n", "hard limit >= soft limit"),
        ("device_injector.py", "devices.noderesource.dev/container.app",
         "path: [unterminated", "invalid device annotation"),
        ("device_injector.py", "mounts.noderesource.dev", "just a string", "not a YAML list"),
    ],
)
async def test_bad_annotation_fails_the_call_not_the_plugin(
    tmp_path: Path, script: str, annotation: str, value: str, message: str
) -> None:
    bad_pod = api.PodSandbox(id="pod2", name="bad", annotations={annotation: value})
    async with asyncio.timeout(20), external(tmp_path, script, "--idx", "50") as (peer, proc):
        await start(peer)
        with pytest.raises(TtrpcError) as err:
            await peer.call(
                "CreateContainer", api.CreateContainerRequest(pod=bad_pod, container=APP)
            )
        assert err.value.code == Code.UNKNOWN
        assert message in err.value.message
        # Still serving.
        await create(peer, OTHER)
        assert proc.poll() is None
    assert proc.returncode == 0
