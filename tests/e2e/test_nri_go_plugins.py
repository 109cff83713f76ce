"""NRI with the real Go plugins of containerd/nri (``../shared/interop/bin``, built from
containerd/nri at 8ec8b28 against NRI API v0.12.2): each dials a pycrid daemon's NRI socket
as an external plugin; what it does is checked inside a running container, and what it saw
is read from its own log.

The module's daemon has them all at once, in index order:

``05-nri-differ``, ``95-nri-differ``  one process, two plugins: 95 logs what the plugins
    between them changed in each object (``-indices 05,95``);
``10-nri-logger``  logs every event with the whole pod/container, adds an env var and an
    annotation (value ``logger-pid-<its pid>``) to every container;
``20-ulimit-adjuster``  rlimits from the pod annotation
    ``ulimits.noderesource.dev/container.<name>``;
``30-nri-device-injector``  device nodes and mounts from the pod annotations
    ``devices.noderesource.dev/container.<name>``, ``mounts.noderesource.dev/...``;
``40-template``  logs one line per event (``Creating container ns/pod/name...``).

The logger and template change or see every container of the daemon, so this module has
a daemon of its own. Every plugin process is stopped when its context ends.
"""

from __future__ import annotations

import contextlib
import json
import re
import resource
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
from cri_api.v1 import api_pb2 as pb

from tests.support.daemon import Daemon, nri_paths
from tests.support.images import TestImages
from tests.support.interop import require
from tests.support.nri_plugins import stop_process
from tests.support.pods import Pods, busybox_daemon, container_config, pod_config, wait_for
from tests.support.registry import LocalRegistry

pytestmark = pytest.mark.e2e

#: The socket flag of each plugin (upstream is not consistent).
SOCKET_FLAG = {"nri-logger": "-socket-path", "nri-device-injector": "-socket-path",
               "nri-differ": "-socket-path", "nri-template": "-socket",
               "nri-ulimit-adjuster": "-socket"}

#: The plugins of the module's daemon, as the daemon names them (index-name).
MODULE_PLUGINS = {"05-nri-differ", "95-nri-differ", "10-nri-logger", "20-ulimit-adjuster",
                  "30-nri-device-injector", "40-template"}

LIFECYCLE = ["RunPodSandbox", "CreateContainer", "PostCreateContainer", "StartContainer",
             "PostStartContainer", "StopContainer", "RemoveContainer", "StopPodSandbox",
             "RemovePodSandbox"]

# NOFILE limits the ulimit-adjuster sets: under the hard limit the daemon inherits from us
# (root here lacks CAP_SYS_RESOURCE, so a container's hard limit can only go down).
_, HARD_NOFILE = resource.getrlimit(resource.RLIMIT_NOFILE)
NOFILE = (1357, 2468)

#: The message of one logrus text line: quoted (Go escapes) when it has to be, else bare.
_MSG = re.compile(r'\smsg=(?:"((?:[^"\\]|\\.)*)"|(\S*))')


@dataclass
class GoPlugin:
    binary: str
    proc: subprocess.Popen[bytes]
    log: Path

    def raw(self, start: int = 0) -> list[str]:
        """Its log's lines from line ``start`` on."""
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        return text.splitlines()[start:]

    def lines(self, start: int = 0) -> list[str]:
        """The ``msg`` of each logrus line from line ``start`` on."""
        found = []
        for line in self.raw(start):
            m = _MSG.search(line)
            if m is None:
                continue
            if m[1] is None:
                found.append(m[2])
                continue
            try:
                found.append(json.loads(f'"{m[1]}"'))  # Go's quoting, bar rare \x escapes
            except ValueError:
                found.append(m[1])
        return found


@contextlib.contextmanager
def go_plugin(binary: str, socket: str, log: Path, *args: str) -> Iterator[GoPlugin]:
    """Run ``bin/<binary>`` dialling ``socket``, its output to ``log``; stopped afterwards."""
    path = require(binary)
    with open(log, "ab") as out:
        proc = subprocess.Popen([str(path), SOCKET_FLAG[binary], socket, *args],
                                stdin=subprocess.DEVNULL, stdout=out, stderr=out)
    try:
        yield GoPlugin(binary, proc, log)
    finally:
        stop_process(proc)


def connected(daemon: Daemon) -> set[str]:
    """The plugins the daemon has registered and synchronised (CRI Status, verbose)."""
    info = daemon.client.runtime.Status(pb.StatusRequest(verbose=True), timeout=10).info
    nri = json.loads(info.get("nri") or "{}")
    return {f"{p['index']}-{p['name']}" for p in nri.get("plugins", [])}


def wait_connected(daemon: Daemon, names: set[str], plugins: list[GoPlugin]) -> None:
    def ready() -> bool:
        for p in plugins:
            if p.proc.poll() is not None:
                raise AssertionError(f"{p.binary} exited with {p.proc.returncode}:\n"
                                     f"{p.log.read_text(errors='replace')[-2000:]}")
        return names <= connected(daemon)

    try:
        wait_for(ready, 30, f"the Go plugins {sorted(names)} to register")
    except AssertionError as e:
        raise AssertionError(f"{e}\ndaemon log:\n{daemon.log()[-3000:]}") from None


def dumped(lines: list[str]) -> list[tuple[str, str, str]]:
    """(event, tag, id) from the dumps of nri-logger (and nri-device-injector -verbose), in
    order: ``<Event>: <tag>:`` opens the YAML of one object (tag ``pod`` or ``container``),
    whose top-level ``id:`` line is ``<Event>:    id: <id>``."""
    found: list[tuple[str, str, str]] = []
    event, tag = "", ""
    for line in lines:
        head = re.fullmatch(r"(\w+): (\w+):", line)
        if head:
            event, tag = head[1], head[2]
            continue
        body = re.fullmatch(r"(\w+):    id: (\S+)", line)
        if body and body[1] == event:
            found.append((event, tag, body[2]))
    return found


def lifecycle_of(lines: list[str], sid: str, cid: str) -> list[tuple[str, str]]:
    """(event, id) of the pod ``sid``'s pod events and the container ``cid``'s events."""
    return [(event, oid) for event, tag, oid in dumped(lines)
            if (tag, oid) in (("pod", sid), ("container", cid))
            and (tag == "pod") == event.endswith("PodSandbox")]


def sleeper(image: str, name: str) -> Any:
    """Pid 1 of its own pid namespace; exits at once on SIGTERM."""
    return container_config(image, name, command=[
        "sh", "-c", "trap 'exit 0' TERM; while true; do sleep 0.1; done"],
        linux=pb.LinuxContainerConfig(security_context=pb.LinuxContainerSecurityContext(
            namespace_options=pb.NamespaceOption(pid=pb.CONTAINER))))


def nofile(limits: str) -> tuple[int, int]:
    line = next(x for x in limits.splitlines() if x.startswith("Max open files"))
    soft, hard = line.split()[3:5]
    return int(soft), int(hard)


# ---------------------------------------------------------------- the module's daemon


@dataclass
class GoEnv:
    daemon: Daemon
    base: Path
    socket: str
    busybox: str
    plugins: dict[str, GoPlugin]


@pytest.fixture(scope="module")
def go(tmp_path_factory: pytest.TempPathFactory, registry: LocalRegistry,
       test_images: TestImages) -> Iterator[GoEnv]:
    for binary in SOCKET_FLAG:
        require(binary)
    assert HARD_NOFILE >= NOFILE[1], f"the NOFILE hard limit {HARD_NOFILE} is too low"
    base = tmp_path_factory.mktemp("nri-go")
    logs = base / "plugin-logs"
    logs.mkdir()
    with busybox_daemon(base, registry, test_images) as d, contextlib.ExitStack() as stack:
        socket = nri_paths(str(base))["socket_path"]

        def start(key: str, binary: str, *args: str) -> GoPlugin:
            return stack.enter_context(go_plugin(binary, socket, logs / f"{key}.log", *args))

        plugins = {
            "differ": start("differ", "nri-differ", "-indices", "05,95"),
            "logger": start("logger", "nri-logger", "-idx", "10", "-add-env", "NRI_LOGGER",
                            "-add-annotation", "nri.logger/pid"),
            "ulimit": start("ulimit", "nri-ulimit-adjuster", "-idx", "20", "-name",
                            "ulimit-adjuster", "-verbose"),
            "devices": start("devices", "nri-device-injector", "-idx", "30", "-verbose"),
            "template": start("template", "nri-template", "-idx", "40", "-name", "template"),
        }
        wait_connected(d, MODULE_PLUGINS, list(plugins.values()))
        yield GoEnv(daemon=d, base=base, socket=socket, busybox=d.extra["busybox"],
                    plugins=plugins)


@pytest.fixture
def pods(go: GoEnv) -> Iterator[Pods]:
    p = Pods(go.daemon.client)
    try:
        yield p
    finally:
        p.cleanup()


def test_go_plugins_adjust_a_running_container(go: GoEnv, pods: Pods, tmp_path: Path) -> None:
    host = tmp_path / "host-dir"
    host.mkdir()
    (host / "file").write_text("from the device injector\n")
    pod = pod_config(annotations={
        "ulimits.noderesource.dev/container.work":
            f"- type: nofile\n  soft: {NOFILE[0]}\n  hard: {NOFILE[1]}\n",
        "devices.noderesource.dev/container.work":
            "- path: /dev/nri-null\n  type: c\n  major: 1\n  minor: 3\n  file_mode: 438\n",
        "mounts.noderesource.dev/container.work":
            f"- source: {host}\n  destination: /nri-mount\n  type: bind\n"
            "  options: [rbind, ro]\n",
    })
    sid = pods.run(pod)
    cid = pods.run_container(sid, sleeper(go.busybox, "work"), pod)
    pods.wait_state(cid, pb.CONTAINER_RUNNING)
    logger_value = f"logger-pid-{go.plugins['logger'].proc.pid}"

    # nri-logger: an env var and an annotation.
    env = pods.exec(cid, ["env"]).stdout.decode().splitlines()
    assert f"NRI_LOGGER={logger_value}" in env, env
    spec = json.loads(pods.status(cid, verbose=True).info["info"])["runtimeSpec"]
    assert spec["annotations"].get("nri.logger/pid") == logger_value, spec["annotations"]

    # nri-ulimit-adjuster: the container's own process has exactly the limits. An exec'd
    # process's soft NOFILE is unreliable with runc 1.1 built with Go >= 1.19
    # (opencontainers/runc#4195, fixed by #4266: it may come out equal to the hard one);
    # its hard limit is what the adjustment set.
    assert {"type": "RLIMIT_NOFILE", "soft": NOFILE[0], "hard": NOFILE[1]} in (
        spec["process"].get("rlimits") or []), spec["process"].get("rlimits")
    assert nofile(pods.exec(cid, ["cat", "/proc/1/limits"]).stdout.decode()) == NOFILE
    assert nofile(pods.exec(cid, ["cat", "/proc/self/limits"]).stdout.decode())[1] == NOFILE[1]

    # nri-device-injector: the device node, usable (the device cgroup allows it), and a
    # read-only bind mount.
    r = pods.exec(cid, ["stat", "-c", "%F %t:%T %a", "/dev/nri-null"])
    assert (r.exit_code, r.stdout.decode().strip()) == (0, "character special file 1:3 666"), r
    r = pods.exec(cid, ["sh", "-c", "echo hello > /dev/nri-null && head -c 4 /dev/nri-null "
                                    "| wc -c"])
    assert (r.exit_code, r.stdout.decode().strip()) == (0, "0"), r.stderr
    r = pods.exec(cid, ["cat", "/nri-mount/file"])
    assert (r.exit_code, r.stdout.decode()) == (0, "from the device injector\n"), r.stderr
    assert b"Read-only" in pods.exec(cid, ["sh", "-c", "touch /nri-mount/x"]).stderr
    devices = go.plugins["devices"].lines()
    assert any(f'{pod.metadata.name}/work: injected device "/dev/nri-null"' in x
               for x in devices), devices[-20:]

    # A container the annotations do not name gets the logger's changes only.
    plain = pods.run_container(sid, sleeper(go.busybox, "plain"), pod)
    assert pods.exec(plain, ["test", "-e", "/dev/nri-null"]).exit_code == 1
    assert nofile(pods.exec(plain, ["cat", "/proc/1/limits"]).stdout.decode()) != NOFILE
    assert f"NRI_LOGGER={logger_value}" in pods.exec(plain, ["env"]).stdout.decode()

    # nri-differ at 95 saw what 10..40 changed in the container since 05 saw it.
    changes = [x for x in go.plugins["differ"].lines()
               if x.startswith("[95] CreateContainer: container: ")]
    for change in (f"[Annotations nri.logger/pid]: From: <nil> -> To: {logger_value}",
                   f"From: <nil> -> To: NRI_LOGGER={logger_value}",
                   f"[Rlimits 0 Hard]: From: <nil> -> To: {NOFILE[1]}",
                   "[Linux Devices 0 Path]: From: <nil> -> To: /dev/nri-null",
                   "Destination]: From: <nil> -> To: /nri-mount"):
        assert any(change in x for x in changes), (change, changes)


def test_go_plugins_see_the_lifecycle_in_order(go: GoEnv, pods: Pods) -> None:
    start = {key: len(p.raw()) for key, p in go.plugins.items()}
    pod = pod_config()
    sid = pods.run(pod)
    cid = pods.run_container(sid, sleeper(go.busybox, "life"), pod)
    pods.wait_state(cid, pb.CONTAINER_RUNNING)
    pods.stop(cid, timeout=10)
    pods.remove(cid)
    pods.stop_pod(sid)
    pods.remove_pod(sid)

    # nri-logger: each event with the object it is about.
    logger, template, differ = (go.plugins[k] for k in ("logger", "template", "differ"))
    want = [(e, sid if e.endswith("PodSandbox") else cid) for e in LIFECYCLE]
    seen = wait_for(lambda: (ev := lifecycle_of(logger.lines(start["logger"]), sid, cid))
                    and ev[-1] == want[-1] and ev, 20, "nri-logger to log RemovePodSandbox")
    assert seen == want, seen

    # nri-template: one line per event, by name.
    ns, name = pod.metadata.namespace, pod.metadata.name
    ctr = f"{ns}/{name}/life"
    template_want = [f"Started pod {ns}/{name}...", f"Creating container {ctr}...",
                     f"Created container {ctr}...", f"Starting container {ctr}...",
                     f"Started container {ctr}...", f"Stopped container {ctr}...",
                     f"Removed container {ctr}...", f"Stopped pod {ns}/{name}...",
                     f"Removed pod {ns}/{name}..."]
    lines = wait_for(lambda: (t := [x for x in template.lines(start["template"])
                                    if f"{ns}/{name}" in x])
                     and t[-1] == template_want[-1] and t, 20, "nri-template's last line")
    assert lines == template_want, lines

    # nri-differ at 95: the same events in the same order (the differ says which event and
    # whether the plugins in between changed the pod or container).
    events: list[str] = []
    for line in differ.lines(start["differ"]):
        m = re.match(r"\[95\] (\w+): (pod|container): ", line)
        if m and (not events or events[-1] != m[1]):
            events.append(m[1])
    assert events == LIFECYCLE, events

    # nri-ulimit-adjuster and nri-device-injector (-verbose) subscribe to CreateContainer
    # only.
    ulimit = go.plugins["ulimit"].raw()[start["ulimit"]:]
    assert any('msg="create container"' in x and "container=life" in x for x in ulimit), ulimit
    devices = go.plugins["devices"].lines(start["devices"])
    assert [(e, i) for e, t, i in dumped(devices) if t == "container"] == [
        ("CreateContainer", cid)], devices[-20:]


def test_late_go_plugin_is_synchronized_with_what_exists(go: GoEnv, pods: Pods) -> None:
    pod = pod_config()
    sid = pods.run(pod)
    cid = pods.run_container(sid, sleeper(go.busybox, "early"), pod)
    pods.wait_state(cid, pb.CONTAINER_RUNNING)
    with go_plugin("nri-logger", go.socket, go.base / "plugin-logs" / "late.log",
                   "-idx", "60", "-events", "CreateContainer") as late:
        late_name = "60-nri-logger"
        wait_connected(go.daemon, {late_name}, [late])
        lines = late.lines()
        pods_at = lines.index("Synchronize: pods:")
        ctrs_at = lines.index("Synchronize: containers:")
        # A list of objects: each one's top-level keys are one level in.
        ids = {"pods": [], "containers": []}
        for part, chunk in (("pods", lines[pods_at:ctrs_at]), ("containers", lines[ctrs_at:])):
            ids[part] = [m[1] for m in (re.fullmatch(r"Synchronize:    [- ] id: (\S+)", x)
                                        for x in chunk) if m]
        assert sid in ids["pods"] and cid in ids["containers"], ids
        # Then the next event reaches it, and only the events it asked for.
        second = pods.run_container(sid, sleeper(go.busybox, "later"), pod)
        seen = wait_for(lambda: [(e, t) for e, t, i in dumped(late.lines()) if i == second],
                        20, "the late logger to see the next container")
        assert seen == [("CreateContainer", "container")], seen
        assert not any(x.startswith("RunPodSandbox:") for x in late.lines())


def test_go_plugins_get_shutdown_and_exit_with_the_daemon(
        tmp_path: Path, registry: LocalRegistry, test_images: TestImages) -> None:
    require("nri-template")
    require("nri-logger")
    socket = nri_paths(str(tmp_path))["socket_path"]
    with busybox_daemon(tmp_path, registry, test_images) as d, \
            go_plugin("nri-template", socket, tmp_path / "template.log",
                      "-idx", "40", "-name", "template") as template, \
            go_plugin("nri-logger", socket, tmp_path / "logger.log", "-idx", "10") as logger:
        wait_connected(d, {"40-template", "10-nri-logger"}, [template, logger])
        assert d.stop() == 0
        # (nri-logger's Shutdown handler dumps no object, so it logs nothing.)
        assert "Runtime shutting down..." in template.lines(), template.lines()
        # Both end on their own when the daemon hangs up: the stub's close callback or its
        # Run returning, whichever sees it first, exits with 1.
        for plugin in (template, logger):
            try:
                code = plugin.proc.wait(10)
            except subprocess.TimeoutExpired:
                raise AssertionError(f"{plugin.binary} still runs after the daemon "
                                     "stopped") from None
            ends = {"Connection to the runtime lost, exiting...",
                    "plugin exited with error ttrpc: server closed",
                    "plugin exited (ttrpc: server closed)"}
            assert (code, bool(ends & set(plugin.lines()))) == (1, True), plugin.lines()[-5:]


@pytest.mark.skipif(shutil.which("runsc") is None,
                    reason="runsc (gVisor) is not installed: apt-get install runsc")
def test_go_plugins_with_a_gvisor_pod(go: GoEnv, pods: Pods) -> None:
    """The same real plugins and a pod of the runsc handler (offered without config): they
    see its lifecycle, what gVisor honours (rlimits, mounts, env) reaches the sandboxed
    process, and what it would drop (a device node) fails the create naming the field."""
    start = {key: len(p.raw()) for key, p in go.plugins.items()}
    pod = pod_config(annotations={
        "ulimits.noderesource.dev/container.work":
            f"- type: nofile\n  soft: {NOFILE[0]}\n  hard: {NOFILE[1]}\n",
        "devices.noderesource.dev/container.devs":
            "- path: /dev/nri-null\n  type: c\n  major: 1\n  minor: 3\n  file_mode: 438\n"})
    sid = pods.run(pod, "runsc")
    cid = pods.run_container(sid, sleeper(go.busybox, "work"), pod)
    assert "Starting gVisor" in pods.exec(cid, ["busybox", "dmesg"]).stdout.decode()
    # gVisor (2022) has no /proc/PID/limits: the shell's ulimit reads them.
    limits = pods.exec(cid, ["sh", "-c", "ulimit -Sn; ulimit -Hn"]).stdout.decode().split()
    assert tuple(map(int, limits)) == NOFILE, limits
    env = pods.exec(cid, ["env"]).stdout.decode().splitlines()
    assert any(x.startswith("NRI_LOGGER=logger-pid-") for x in env), env
    with pytest.raises(grpc.RpcError) as e:
        pods.create(sid, sleeper(go.busybox, "devs"), pod)
    assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION, e.value.details()
    assert "NRI adjustment linux.devices" in (e.value.details() or ""), e.value.details()
    assert not [c for c in pods.rt.ListContainers(pb.ListContainersRequest(), timeout=10)
                .containers if c.pod_sandbox_id == sid and c.metadata.name == "devs"]
    pods.stop(cid, timeout=10)
    pods.remove(cid)
    pods.stop_pod(sid)
    pods.remove_pod(sid)
    logger = go.plugins["logger"]
    want = [("RunPodSandbox", sid), ("CreateContainer", cid), ("PostCreateContainer", cid),
            ("StartContainer", cid), ("PostStartContainer", cid), ("StopContainer", cid),
            ("RemoveContainer", cid), ("StopPodSandbox", sid), ("RemovePodSandbox", sid)]
    seen = wait_for(lambda: (ev := lifecycle_of(logger.lines(start["logger"]), sid, cid))
                    and ev[-1] == want[-1] and ev, 20, "nri-logger to log RemovePodSandbox")
    assert seen == want, seen
