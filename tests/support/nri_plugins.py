"""NRI test plugins for the end-to-end tests, written with the SDK, in one module.

Run one as ``python -m tests.support.nri_plugins <kind> [options]`` from the project
root. Every kind can record what it receives (``--record FILE``, one JSON line per
event) and can restrict what it *does* (adjust, hang, crash, reject) to containers or
pods carrying a label (``--match-label KEY=VALUE``), so a plugin attached to a shared
daemon leaves other tests' containers alone. Kinds:

``recorder``   records every event (it subscribes to all but validation; ``--events``
               changes that).
``adjuster``   adds ``--env K=V``, ``--annotation K=V``, ``--mount SRC:DST`` (a read-only
               bind mount of a host dir) and ``--rlimit TYPE:SOFT:HARD`` to every
               matching CreateContainer.
``hang``       never answers ``--on EVENT`` (CreateContainer by default); with
               ``--block`` it sleeps with the event loop blocked, so it cannot even see
               the runtime hang up on it.
``crash``      ``os._exit(3)`` in ``--on EVENT`` (after recording it).
``fail``       answers ``--on EVENT`` with an error (``--reason TEXT``) and carries on.
``validator``  rejects containers whose name matches ``--reject-name REGEX`` with
               ``--reason TEXT``.
``slow-register``  a recorder that waits ``--register-delay`` before connecting and
               ``--sync-delay`` inside Synchronize.

A runtime-launched (pre-installed) plugin gets no arguments, no PATH and only the
NRI_* variables, so ``install_preinstalled`` writes a wrapper script that ``cd``s to the
project, sets PYTHONPATH and execs this interpreter with the options baked in.
Helpers for tests: ``plugin_command``, ``external_plugin`` (owns the subprocess),
``install_preinstalled``, ``read_events``, ``wait_events``, ``pid_gone``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from pycrid.nri import Adjustment, api, run

PROJECT = Path(__file__).resolve().parents[2]
MODULE = "tests.support.nri_plugins"
KINDS = ("recorder", "adjuster", "hang", "crash", "fail", "validator", "slow-register")

# ---------------------------------------------------------------- the plugin


def _pod_fields(pod: api.PodSandbox) -> dict[str, Any]:
    return {"pod_id": pod.id, "pod_name": pod.name, "pod_namespace": pod.namespace,
            "pod_pid": pod.pid,
            "pod_namespaces": [[ns.type, ns.path] for ns in pod.linux.namespaces]}


def _container_fields(container: api.Container) -> dict[str, Any]:
    return {
        "container_id": container.id,
        "container_name": container.name,
        "container_pod_id": container.pod_sandbox_id,
        "state": api.ContainerState.Name(container.state),
        "exit_code": container.exit_code,
        "started_at": container.started_at,
        "finished_at": container.finished_at,
        "pid": container.pid,
    }


class TestPlugin:
    """Implements every handler (some as coroutines, so it does not subclass the SDK's
    ``Plugin``, whose no-op signatures are plain functions); ``configure`` narrows the
    subscription to ``mask``."""

    __test__ = False  # not a pytest test class

    def __init__(self, ns: argparse.Namespace) -> None:
        self.kind: str = ns.kind
        self.record_path: str = ns.record or ""
        self.on: str = ns.on
        self.block: bool = ns.block
        self.sync_delay: float = ns.sync_delay
        self.reject_name = re.compile(ns.reject_name) if ns.reject_name else None
        self.reason: str = ns.reason
        self.match: list[tuple[str, str]] = [_pair(m, "=") for m in ns.match_label]
        self.env: list[tuple[str, str]] = [_pair(e, "=") for e in ns.env]
        self.annotations: list[tuple[str, str]] = [_pair(a, "=") for a in ns.annotation]
        self.mounts: list[tuple[str, str]] = [_pair(m, ":") for m in ns.mount]
        self.rlimits: list[tuple[str, int, int]] = []
        for spec in ns.rlimit:
            kind, soft, hard = spec.split(":")
            self.rlimits.append((kind, int(soft), int(hard)))
        if ns.events:
            self.mask = api.parse_event_mask(ns.events)
        else:
            self.mask = api.VALID_EVENTS
            if self.kind != "validator":
                self.mask &= ~api.event_bit(api.Event.VALIDATE_CONTAINER_ADJUSTMENT)

    # -- recording and behaviour

    def record(self, event: str, **fields: Any) -> None:
        if not self.record_path:
            return
        line = json.dumps({"event": event, "plugin_pid": os.getpid(),
                           "time": time.time(), **fields}) + "\n"
        # One write per line on an O_APPEND descriptor: lines never interleave.
        fd = os.open(self.record_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line.encode())
        finally:
            os.close(fd)

    def matches(self, pod: api.PodSandbox | None, container: api.Container | None = None) -> bool:
        if not self.match:
            return True
        for key, value in self.match:
            if container is not None and container.labels.get(key) == value:
                return True
            if pod is not None and pod.labels.get(key) == value:
                return True
        return False

    async def misbehave(
        self, event: str, pod: api.PodSandbox | None, container: api.Container | None = None
    ) -> None:
        """Hang or crash here, if this is the plugin's event and the object matches."""
        if event != self.on or not self.matches(pod, container):
            return
        if self.kind == "crash":
            self.record("Crashing", on=event)
            os._exit(3)
        if self.kind == "fail":
            self.record("Failing", on=event)
            raise RuntimeError(self.reason)
        if self.kind == "hang":
            self.record("Hanging", on=event, blocking=self.block)
            if self.block:
                time.sleep(3600)  # noqa: ASYNC251 - the whole plugin is stuck, not just this call
            await asyncio.sleep(3600)

    async def pod_event(self, event: str, pod: api.PodSandbox) -> None:
        self.record(event, **_pod_fields(pod))
        await self.misbehave(event, pod)

    async def container_event(
        self, event: str, pod: api.PodSandbox, container: api.Container
    ) -> None:
        self.record(event, **_pod_fields(pod), **_container_fields(container))
        await self.misbehave(event, pod, container)

    # -- lifetime

    def configure(self, config: str, runtime_name: str, runtime_version: str) -> int:
        self.record("Configure", config=config, runtime_name=runtime_name,
                    runtime_version=runtime_version)
        return self.mask

    async def synchronize(
        self, pods: list[api.PodSandbox], containers: list[api.Container]
    ) -> None:
        if self.sync_delay:
            await asyncio.sleep(self.sync_delay)
        self.record("Synchronize", pods=[p.id for p in pods],
                    containers=[c.id for c in containers],
                    container_states={c.id: api.ContainerState.Name(c.state)
                                      for c in containers})
        await self.misbehave("Synchronize", None)

    def shutdown(self) -> None:
        self.record("Shutdown")

    # -- pods

    async def run_pod_sandbox(self, pod: api.PodSandbox) -> None:
        await self.pod_event("RunPodSandbox", pod)

    async def update_pod_sandbox(
        self, pod: api.PodSandbox, overhead: api.LinuxResources, resources: api.LinuxResources
    ) -> None:
        await self.pod_event("UpdatePodSandbox", pod)

    async def post_update_pod_sandbox(self, pod: api.PodSandbox) -> None:
        await self.pod_event("PostUpdatePodSandbox", pod)

    async def stop_pod_sandbox(self, pod: api.PodSandbox) -> None:
        await self.pod_event("StopPodSandbox", pod)

    async def remove_pod_sandbox(self, pod: api.PodSandbox) -> None:
        await self.pod_event("RemovePodSandbox", pod)

    # -- containers

    async def create_container(
        self, pod: api.PodSandbox, container: api.Container
    ) -> Adjustment | None:
        await self.container_event("CreateContainer", pod, container)
        if self.kind != "adjuster" or not self.matches(pod, container):
            return None
        adjust = Adjustment()
        for key, value in self.env:
            adjust.add_env(key, value)
        for key, value in self.annotations:
            adjust.add_annotation(key, value)
        for source, destination in self.mounts:
            adjust.add_mount(destination, source, "bind", ["rbind", "ro"])
        for kind, soft, hard in self.rlimits:
            adjust.add_rlimit(kind, hard=hard, soft=soft)
        return adjust

    async def post_create_container(self, pod: api.PodSandbox, container: api.Container) -> None:
        await self.container_event("PostCreateContainer", pod, container)

    async def start_container(self, pod: api.PodSandbox, container: api.Container) -> None:
        await self.container_event("StartContainer", pod, container)

    async def post_start_container(self, pod: api.PodSandbox, container: api.Container) -> None:
        await self.container_event("PostStartContainer", pod, container)

    async def update_container(
        self, pod: api.PodSandbox, container: api.Container, resources: api.LinuxResources
    ) -> None:
        await self.container_event("UpdateContainer", pod, container)

    async def post_update_container(self, pod: api.PodSandbox, container: api.Container) -> None:
        await self.container_event("PostUpdateContainer", pod, container)

    async def stop_container(self, pod: api.PodSandbox, container: api.Container) -> None:
        await self.container_event("StopContainer", pod, container)

    async def remove_container(self, pod: api.PodSandbox, container: api.Container) -> None:
        await self.container_event("RemoveContainer", pod, container)

    async def validate_container_adjustment(
        self, request: api.ValidateContainerAdjustmentRequest
    ) -> None:
        container = request.container
        self.record("ValidateContainerAdjustment", **_pod_fields(request.pod),
                    **_container_fields(container),
                    plugins=[f"{p.index}-{p.name}" for p in request.plugins])
        await self.misbehave("ValidateContainerAdjustment", request.pod, container)
        if self.reject_name is not None and self.reject_name.search(container.name):
            self.record("Rejected", container_id=container.id, container_name=container.name)
            raise ValueError(self.reason)


def _pair(text: str, sep: str) -> tuple[str, str]:
    key, found, value = text.partition(sep)
    if not found or not key:
        raise argparse.ArgumentTypeError(f"expected KEY{sep}VALUE, got {text!r}")
    return key, value


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=f"python -m {MODULE}", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("kind", choices=KINDS)
    p.add_argument("--name", help="plugin name (a launched plugin gets it from NRI_PLUGIN_NAME)")
    p.add_argument("--idx", help="plugin index (a launched plugin gets it from NRI_PLUGIN_IDX)")
    p.add_argument("--socket-path", help="NRI socket to dial (external plugins)")
    p.add_argument("--record", default="", help="append one JSON line per event here")
    p.add_argument("--events", default="", help="subscription, e.g. 'all' or 'pod,StopContainer'")
    p.add_argument("--match-label", action="append", default=[], metavar="KEY=VALUE",
                   help="act only on containers/pods with this label (repeatable: any)")
    p.add_argument("--env", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--annotation", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--mount", action="append", default=[], metavar="HOSTDIR:DEST")
    p.add_argument("--rlimit", action="append", default=[], metavar="TYPE:SOFT:HARD")
    p.add_argument("--on", default="CreateContainer", help="event to hang or crash in")
    p.add_argument("--block", action="store_true", help="hang with the event loop blocked")
    p.add_argument("--reject-name", default="", help="validator: container names to reject")
    p.add_argument("--reason", default="rejected by test validator")
    p.add_argument("--register-delay", type=float, default=0.0)
    p.add_argument("--sync-delay", type=float, default=0.0)
    p.add_argument("--verbose", action="store_true")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    ns = parser().parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if ns.verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
                        stream=sys.stderr)
    if ns.kind == "slow-register" and not ns.register_delay:
        ns.register_delay = 1.0
    if ns.register_delay:
        time.sleep(ns.register_delay)
    plugin = TestPlugin(ns)
    status = run(plugin, name=ns.name, idx=ns.idx, socket_path=ns.socket_path)
    plugin.record("Exited", status=status)
    return status


# ---------------------------------------------------------------- helpers for tests


def plugin_command(kind: str, *args: str) -> list[str]:
    return [sys.executable, "-m", MODULE, kind, *args]


def _env() -> dict[str, str]:
    path = os.environ.get("PYTHONPATH", "")
    return {**os.environ, "PYTHONPATH": f"{PROJECT}{os.pathsep}{path}" if path else str(PROJECT)}


def stop_process(proc: subprocess.Popen[bytes], grace: float = 5.0) -> None:
    """SIGTERM, then SIGKILL after ``grace``; always reaped."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@contextlib.contextmanager
def external_plugin(
    socket_path: str | os.PathLike[str],
    kind: str,
    name: str,
    idx: str,
    *args: str,
    record: str | os.PathLike[str] | None = None,
    log: str | os.PathLike[str] | None = None,
) -> Iterator[subprocess.Popen[bytes]]:
    """Run a test plugin dialling ``socket_path`` as ``idx-name``; killed on exit.

    With ``record`` it records there; ``log`` gets its stderr (default: next to the record
    file, else discarded)."""
    argv = ["--name", name, "--idx", idx, "--socket-path", str(socket_path), *args]
    if record is not None:
        argv += ["--record", str(record)]
        log = log or f"{record}.stderr"
    with open(log or os.devnull, "ab") as out:
        proc = subprocess.Popen(plugin_command(kind, *argv), cwd=PROJECT, env=_env(),
                                stdin=subprocess.DEVNULL, stdout=out, stderr=out)
    try:
        yield proc
    finally:
        stop_process(proc)


def install_preinstalled(
    plugin_dir: str | os.PathLike[str],
    base: str,
    kind: str,
    *args: str,
    record: str | os.PathLike[str] | None = None,
    log: str | os.PathLike[str] | None = None,
) -> Path:
    """Write ``plugin_dir/base`` (``NN-name``): an executable wrapper a runtime can launch
    with an empty environment. Its stderr goes to ``log`` (default ``<record>.stderr``)."""
    directory = Path(plugin_dir)
    directory.mkdir(parents=True, exist_ok=True)
    argv = list(args)
    if record is not None:
        argv += ["--record", str(record)]
        log = log or f"{record}.stderr"
    command = " ".join(shlex.quote(a) for a in plugin_command(kind, *argv))
    redirect = f" 2>>{shlex.quote(str(log))}" if log else ""
    path = directory / base
    path.write_text(
        "#!/bin/sh\n"
        f"cd {shlex.quote(str(PROJECT))} || exit 1\n"
        f"PYTHONPATH={shlex.quote(str(PROJECT))}\n"
        "export PYTHONPATH\n"
        f"exec {command}{redirect}\n"
    )
    path.chmod(0o755)
    return path


def read_events(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The recorded events, oldest first (a missing file is no events)."""
    try:
        with open(path) as f:
            return [json.loads(line) for line in f if line.endswith("\n")]
    except FileNotFoundError:
        return []


def wait_events(
    path: str | os.PathLike[str],
    cond: Callable[[list[dict[str, Any]]], bool],
    timeout: float = 20.0,
    what: str = "recorded events",
) -> list[dict[str, Any]]:
    """Poll the record file until ``cond(events)``; returns the events."""
    deadline = time.monotonic() + timeout
    while True:
        events = read_events(path)
        if cond(events):
            return events
        if time.monotonic() > deadline:
            tail = "\n".join(json.dumps(e) for e in events[-20:])
            raise AssertionError(f"timed out waiting for {what} in {path}; last events:\n{tail}")
        time.sleep(0.05)


def has_event(name: str, **fields: Any) -> Callable[[list[dict[str, Any]]], bool]:
    return lambda events: any(
        e["event"] == name and all(e.get(k) == v for k, v in fields.items()) for e in events)


def pid_gone(pid: int) -> bool:
    """Whether ``pid`` has exited (gone, or a zombie nobody has reaped yet)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] in ("Z", "X")
    except FileNotFoundError:
        return True


if __name__ == "__main__":
    sys.exit(main())
