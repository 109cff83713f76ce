"""Upgrade and rollback with the real thing (docs/upgrades.md).

The release before this one is built from this repository's own history
(tests/support/releases.py: ``git archive`` of its commit, a virtualenv, ``pip install``).
It runs pods in every state on a root; this checkout's daemon then starts on the same root
and config and must list everything as it was, the running containers answering ExecSync
and logging on, exit codes kept, the created container startable, and a pod stopped and
removed leaving nothing; it makes objects of its own. Then the rollback: the release
before starts on the state this checkout wrote, with the same checks, and finally stops
and removes everything, leaving nothing.

The releases compared are named here (``PREVIOUS``): the next release moves it forward.
The pods: one without a pause process (the default, drop_infra_ctr), one with a pause,
one in a user namespace when the interop runc (1.5.1, idmapped mounts) is there, one on
gVisor when runsc is installed. Each check prints what it saw (``pytest -s``).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from cri_api.v1 import api_pb2 as pb

from pycrid import release
from tests.support import interop
from tests.support.daemon import Daemon, mapped_root_state, running_daemon, serve_command
from tests.support.images import TestImages
from tests.support.pods import (
    Pods,
    container_cgroups,
    container_config,
    daemon_config,
    leftovers,
    log_text,
    pod_config,
    processes_mentioning,
    wait_for,
)
from tests.support.registry import LocalRegistry
from tests.support.releases import Built, Release, build

pytestmark = pytest.mark.e2e

#: The release before this checkout: what nodes run when this one is rolled out.
PREVIOUS = Release("0.1.0", "43375f64be39e281e1b39e76e1bd2101ca78df67")

#: A container that logs a numbered line every 0.2 s, for ever.
TICKER = "i=0; while true; do echo tick $i; i=$((i+1)); sleep 0.2; done"


@pytest.fixture(scope="session")
def previous(tmp_path_factory: pytest.TempPathFactory) -> Built:
    """The release before, built once per session (about 4 s here)."""
    built = build(PREVIOUS, tmp_path_factory.mktemp("previous-release"))
    print(f"\nbuilt {built.version_line} from {PREVIOUS.commit[:12]} in {built.seconds:.1f} s")
    return built


def _idmap_runc() -> Path | None:
    """The interop runc when it makes idmapped mounts (user-namespace pods), else None."""
    try:
        return interop.idmap_runc()
    except pytest.skip.Exception:
        return None


@dataclass
class Node:
    """One root and config that both releases run on, and what the test made there."""

    base: Path
    config: str
    state: str
    busybox: str
    userns: bool
    runsc: bool
    #: Pod name -> (id, its PodSandboxConfig, handler).
    pods: dict[str, tuple[str, Any, str]] = field(default_factory=dict)
    #: Container name -> id.
    ctrs: dict[str, str] = field(default_factory=dict)
    #: What each check saw, in order: (phase, check, result).
    seen: list[tuple[str, str, str]] = field(default_factory=list)

    @contextlib.contextmanager
    def daemon(self, python: str) -> Iterator[tuple[Daemon, Pods]]:
        with running_daemon(str(self.base), self.config, state_dir=self.state,
                            python=python) as d:
            yield d, Pods(d.client)

    def note(self, phase: str, check: str, result: str) -> None:
        self.seen.append((phase, check, result))
        print(f"[{phase}] {check}: {result}")


@pytest.fixture
def node(tmp_path: Path, registry: LocalRegistry, test_images: TestImages) -> Iterator[Node]:
    runc = _idmap_runc()
    config = daemon_config(registry, test_images, tmp_path)
    if runc is not None:
        config += ('[plugins."pycrid.cri.v1.runtime".runtimes.userns.options]\n'
                   f'BinaryName = "{runc}"\n')
    with contextlib.ExitStack() as stack:
        # A user-namespace pod's mapped root must pass through the state directory.
        state = (stack.enter_context(mapped_root_state()) if runc is not None
                 else str(tmp_path / "state"))
        yield Node(base=tmp_path, config=config, state=state,
                   busybox=test_images.busybox.ref(registry), userns=runc is not None,
                   runsc=shutil.which("runsc") is not None)


def _userns_pod(name: str) -> Any:
    pod = pod_config(name)
    opts = pod.linux.security_context.namespace_options
    opts.userns_options.mode = pb.POD
    opts.userns_options.uids.add(host_id=300000, container_id=0, length=65536)
    opts.userns_options.gids.add(host_id=300000, container_id=0, length=65536)
    return pod


def _run_pod(node: Node, pods: Pods, name: str, *, pause: bool = False,
             userns: bool = False, handler: str = "") -> str:
    pod = (_userns_pod(name) if userns else pod_config(name))
    pod.log_directory = str(node.base / "logs" / name)
    if pause:
        pod.linux.security_context.namespace_options.pid = pb.POD
    sid = pods.run(pod, handler=handler)
    node.pods[name] = (sid, pod, handler)
    return sid


def _container(node: Node, pods: Pods, pod: str, name: str, command: list[str], *,
               start: bool = True) -> str:
    sid, config, _ = node.pods[pod]
    cfg = container_config(node.busybox, name, command=command, log_path=f"{name}.log")
    if config.linux.security_context.namespace_options.HasField("userns_options"):
        cfg.linux.security_context.namespace_options.CopyFrom(
            config.linux.security_context.namespace_options)
        cfg.linux.security_context.namespace_options.pid = pb.CONTAINER
    cid = pods.create(sid, cfg, config)
    if start:
        pods.start(cid)
    node.ctrs[name] = cid
    return cid


@dataclass(frozen=True)
class Listed:
    """What the CRI lists: pod id -> state; container id -> (state, exit code, finished)."""

    pods: dict[str, int]
    ctrs: dict[str, tuple[int, int, int]]


def _listed(pods: Pods) -> Listed:
    listed = pods.rt.ListPodSandbox(pb.ListPodSandboxRequest(), timeout=30).items
    ctrs = {}
    for c in pods.rt.ListContainers(pb.ListContainersRequest(), timeout=30).containers:
        st = pods.status(c.id).status
        ctrs[c.id] = (st.state, st.exit_code, st.finished_at)
    return Listed({p.id: p.state for p in listed}, ctrs)


def _describe(node: Node, listed: Listed) -> str:
    names = {cid: name for name, cid in node.ctrs.items()}
    pod_names = {sid: name for name, (sid, _, _) in node.pods.items()}
    pods = ", ".join(f"{pod_names.get(s, s[:12])} {pb.PodSandboxState.Name(st)[8:]}"
                     for s, st in sorted(listed.pods.items(), key=lambda i: pod_names[i[0]]))
    ctrs = ", ".join(
        f"{names.get(c, c[:12])} {pb.ContainerState.Name(st)[10:]}"
        + (f" ({code})" if st == pb.CONTAINER_EXITED else "")
        for c, (st, code, _) in sorted(listed.ctrs.items(), key=lambda i: names[i[0]]))
    return f"pods: {pods}; containers: {ctrs}"


def _answers_exec(node: Node, pods: Pods, phase: str, running: list[str]) -> None:
    for name in running:
        r = pods.exec(node.ctrs[name], ["sh", "-c", "echo ok from $(hostname)"], timeout=30)
        assert r.exit_code == 0 and r.stdout.startswith(b"ok from"), (name, r)
    node.note(phase, "ExecSync in every running container", f"{len(running)} answered "
              f"exit 0 ({', '.join(running)})")


def _logs_flow(node: Node, pods: Pods, phase: str, name: str) -> None:
    """The ticker's log grows, and survives a rotation: ReopenContainerLog, which this
    daemon asks of a conmon the other release started."""
    cid = node.ctrs[name]
    path = pods.status(cid).status.log_path

    def ticks(p: str) -> list[int]:
        return [int(n) for n in re.findall(r"^tick (\d+)$", log_text(p), re.M)]

    before = max(ticks(path))
    wait_for(lambda: max(ticks(path)) > before + 2, 20, "the ticker to log on")
    os.rename(path, path + ".1")
    pods.rt.ReopenContainerLog(pb.ReopenContainerLogRequest(container_id=cid), timeout=30)
    wait_for(lambda: os.path.exists(path) and len(ticks(path)) >= 3, 20,
             "ticks in the reopened log")
    first = ticks(path)[0]
    assert first > before, (first, before)
    node.note(phase, f"logs of {name}", f"tick {before} before, grew, rotated by "
              f"ReopenContainerLog: the new file starts at tick {first}")


def _gone(node: Node, ids: list[str]) -> list[str]:
    """What is left of these objects: processes, cgroups, mounts and files naming them."""
    left = [p for i in ids for p in processes_mentioning(i)]
    left += container_cgroups(ids)
    with open("/proc/self/mountinfo") as f:
        left += [line.split()[4] for line in f if any(i in line for i in ids)]
    for where in ("containers", "sandboxes", "exits"):
        d = os.path.join(node.state, where)
        left += [n for n in (os.listdir(d) if os.path.isdir(d) else []) if n in ids]
    return left


def _schemas(node: Node, phase: str) -> dict[str, int]:
    """The schema version of each component of the state, noted with the releases table."""
    db = sqlite3.connect(f"file:{node.base / 'root' / 'metadata' / 'pycrid.db'}?mode=ro",
                         uri=True)
    try:
        versions = dict(db.execute("SELECT component, version FROM schema_versions"))
        tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master")}
        started = (db.execute("SELECT release FROM releases ORDER BY at").fetchall()
                   if "releases" in tables else [])
    finally:
        db.close()
    node.note(phase, "state", f"schema versions {dict(sorted(versions.items()))}; releases "
              "table " + (f"lists {[r[0] for r in started]}" if "releases" in tables
                          else "absent"))
    return {str(k): int(v) for k, v in versions.items()}


def _versions(node: Node, d: Daemon, phase: str) -> str:
    v = d.client.runtime.Version(pb.VersionRequest(), timeout=10)
    node.note(phase, "CRI Version", f"{v.runtime_name} {v.runtime_version}")
    return str(v.runtime_version)


def test_upgrade_then_rollback(previous: Built, node: Node) -> None:
    """Every pod and container kept both ways; or, where this checkout raised a schema
    version the release before does not know, the rollback refused by name and nothing
    touched (then this checkout removes everything)."""
    this = release.runtime_version()
    print(f"\nupgrade {PREVIOUS.version} ({PREVIOUS.commit[:12]}) -> this checkout ({this})"
          f" -> rollback to {PREVIOUS.version}; user-namespace pod: {node.userns}, "
          f"runsc pod: {node.runsc}")
    running = ["ticker", "sleeper-pause"]

    # ---- the release before makes pods in every state ----------------------------------
    with node.daemon(previous.python) as (d, pods):
        assert _versions(node, d, "before") == PREVIOUS.version
        d.client.pull(node.busybox)
        _run_pod(node, pods, "no-pause")
        _container(node, pods, "no-pause", "ticker", ["sh", "-c", TICKER])
        exited = _container(node, pods, "no-pause", "exits-3", ["sh", "-c", "exit 3"])
        _container(node, pods, "no-pause", "created", ["sh", "-c", "echo started; "
                                                        "exec sleep 3600"], start=False)
        _run_pod(node, pods, "pause", pause=True)
        _container(node, pods, "pause", "sleeper-pause", ["sleep", "3600"])
        if node.userns:
            _run_pod(node, pods, "userns", userns=True, handler="userns")
            _container(node, pods, "userns", "sleeper-userns", ["sleep", "3600"])
            running.append("sleeper-userns")
        if node.runsc:
            _run_pod(node, pods, "runsc", handler="runsc")
            _container(node, pods, "runsc", "sleeper-runsc", ["sleep", "3600"])
            running.append("sleeper-runsc")
        pods.wait_state(exited, pb.CONTAINER_EXITED)
        wait_for(lambda: "tick 3" in log_text(pods.status(node.ctrs["ticker"]).status.log_path),
                 20, "the ticker to log")
        made_before = _listed(pods)
        node.note("before", "made", _describe(node, made_before))
    known = _schemas(node, "before")

    # ---- upgrade: this checkout on the same root and config ----------------------------
    with node.daemon(sys.executable) as (d, pods):
        assert _versions(node, d, "upgrade") == this
        after = _listed(pods)
        assert after == made_before, (after, made_before)
        node.note("upgrade", "listed as before", _describe(node, after))
        assert after.ctrs[exited][:2] == (pb.CONTAINER_EXITED, 3)
        node.note("upgrade", "exit code of exits-3", "3, finished_at unchanged")
        _answers_exec(node, pods, "upgrade", running)
        _logs_flow(node, pods, "upgrade", "ticker")
        pods.start(node.ctrs["created"])
        pods.wait_state(node.ctrs["created"], pb.CONTAINER_RUNNING)
        wait_for(lambda: "started" in log_text(pods.status(node.ctrs["created"]).status
                                               .log_path), 20, "the started container to log")
        running.append("created")
        node.note("upgrade", "the created container", "started: RUNNING, logged 'started'")
        # The pause pod: stopped and removed by this release, nothing of it left.
        pause_ids = [node.pods["pause"][0], node.ctrs["sleeper-pause"]]
        pods.stop_pod(node.pods["pause"][0])
        pods.remove_pod(node.pods["pause"][0])
        assert _gone(node, pause_ids) == []
        del node.pods["pause"], node.ctrs["sleeper-pause"]
        running.remove("sleeper-pause")
        node.note("upgrade", "stop and remove the pause pod", "no process, cgroup, mount, "
                  "bundle or exit file of it left")
        # What this release writes, for the release before to read.
        _run_pod(node, pods, "made-by-new")
        _container(node, pods, "made-by-new", "sleeper-new", ["sleep", "3600"])
        exited_new = _container(node, pods, "made-by-new", "exits-5", ["sh", "-c", "exit 5"])
        _container(node, pods, "made-by-new", "created-new",
                   ["sh", "-c", "echo started-new; exec sleep 3600"], start=False)
        pods.wait_state(exited_new, pb.CONTAINER_EXITED)
        running.append("sleeper-new")
        made_after = _listed(pods)
        node.note("upgrade", "made", _describe(node, made_after))
    newer = {c: v for c, v in _schemas(node, "upgrade").items() if v > known.get(c, v)}
    if newer:
        _rollback_refused(node, previous, newer, known, running)
        return

    # ---- rollback: the release before on the state this checkout wrote -----------------
    with node.daemon(previous.python) as (d, pods):
        assert _versions(node, d, "rollback") == PREVIOUS.version
        back = _listed(pods)
        assert back == made_after, (back, made_after)
        node.note("rollback", "listed as this checkout left them", _describe(node, back))
        assert back.ctrs[exited][:2] == (pb.CONTAINER_EXITED, 3)
        assert back.ctrs[exited_new][:2] == (pb.CONTAINER_EXITED, 5)
        node.note("rollback", "exit codes", "exits-3: 3, exits-5 (made by this checkout): 5")
        _answers_exec(node, pods, "rollback", running)
        _logs_flow(node, pods, "rollback", "ticker")
        pods.start(node.ctrs["created-new"])
        pods.wait_state(node.ctrs["created-new"], pb.CONTAINER_RUNNING)
        wait_for(lambda: "started-new" in log_text(
            pods.status(node.ctrs["created-new"]).status.log_path), 20, "started-new's log")
        node.note("rollback", "the container this checkout created", "started: RUNNING, "
                  "logged 'started-new'")
        assert "could not be read" not in d.log(), d.log()[-3000:]
        for sid, _, _ in list(node.pods.values()):
            pods.stop_pod(sid)
            pods.remove_pod(sid)
        assert leftovers(d.root, d.state) == []
        node.note("rollback", "stop and remove every pod", "leftovers(): none (mounts, "
                  "processes, cgroups, netns, bundles, exit files, runc state, snapshots, "
                  "CNI results, pod IPs, records)")
    _schemas(node, "rollback")


def _rollback_refused(node: Node, previous: Built, newer: dict[str, int],
                      known: dict[str, int], running: list[str]) -> None:
    """The release before on state whose schema it does not know: it refuses to start,
    naming the schema, and leaves every running container alone; this checkout then
    removes everything, leaving nothing."""
    config = node.base / "config.toml"  # written by running_daemon, as both releases read it
    root, state = node.base / "root", Path(node.state)
    refused = subprocess.run(serve_command(str(config), str(root), str(state),
                                           str(state / "pycrid.sock"), python=previous.python),
                             capture_output=True, text=True, timeout=120)
    assert refused.returncode != 0, refused.stderr[-3000:]
    named = [c for c, v in newer.items()
             if f"schema of {c!r} is version {v}, newer than this pycrid knows ({known[c]})"
             in refused.stderr]
    assert named, refused.stderr[-3000:]
    for name in running:  # untouched: their conmons (which end with them) still there
        assert processes_mentioning(f"--cid {node.ctrs[name]}"), name
    node.note("rollback", "refused by schema version", f"exit {refused.returncode}: "
              f"{refused.stderr.strip().splitlines()[-1][-200:]}")
    with node.daemon(sys.executable) as (d, pods):
        for sid, _, _ in list(node.pods.values()):
            pods.stop_pod(sid)
            pods.remove_pod(sid)
        assert leftovers(d.root, d.state) == []
    node.note("rollback", "this checkout removes every pod", "leftovers(): none")


# ---- what the release before does with state it cannot read -------------------------------


def _start(python: str, node_base: Path, config: str) -> subprocess.CompletedProcess[str]:
    """One start that is expected to fail: its output."""
    cfg = node_base / "config.toml"
    cfg.write_text(config)
    root, state = node_base / "root", node_base / "state"
    return subprocess.run(serve_command(str(cfg), str(root), str(state),
                                        str(state / "pycrid.sock"), python=python),
                          capture_output=True, text=True, timeout=120)


def _set_schema(base: Path, component: str, version: int, oldest: int) -> None:
    db = sqlite3.connect(base / "root" / "metadata" / "pycrid.db")
    try:
        with db:
            db.execute("UPDATE schema_versions SET version = ? WHERE component = ?",
                       (version, component))
            db.execute("INSERT INTO schema_readers(component, oldest) VALUES (?, ?) ON "
                       "CONFLICT(component) DO UPDATE SET oldest = excluded.oldest",
                       (component, oldest))
    finally:
        db.close()


def test_state_a_release_cannot_read_is_refused_by_schema_version(
        previous: Built, tmp_path: Path) -> None:
    """The guard for the next release: a record field it adds is an additive schema bump.
    This checkout reads such state (keeping the field); the release before, which would
    drop records with a field it does not know, refuses it by version. An incompatible
    bump is refused by both, naming it."""
    with running_daemon(str(tmp_path)) as d:
        config = Path(tmp_path / "config.toml").read_text()
        assert d.client.runtime.Version(pb.VersionRequest(), timeout=10).runtime_version == (
            release.runtime_version())
    _set_schema(tmp_path, "pods", 2, 1)  # a next release's additive change
    old = _start(previous.python, tmp_path, config)
    assert old.returncode != 0
    assert "schema of 'pods' is version 2, newer than this pycrid knows (1)" in old.stderr
    print(f"\n{PREVIOUS.version} on additive pods v2: exit {old.returncode}, "
          f"{old.stderr.strip().splitlines()[-1][-160:]}")
    with running_daemon(str(tmp_path), config) as d:
        assert "its changes since are additive, read as they are" in d.log()
    _set_schema(tmp_path, "pods", 2, 2)  # an incompatible one
    new = _start(sys.executable, tmp_path, config)
    assert new.returncode == 1
    assert ("the state of 'pods' is schema version 2; pycrid "
            f"{release.VERSION}") in new.stderr
    assert "a reader of version 2 or newer is needed" in new.stderr
    print(f"this checkout on incompatible pods v2: exit {new.returncode}, "
          f"{new.stderr.strip().splitlines()[-1][-300:]}")
    old = _start(previous.python, tmp_path, config)
    assert old.returncode != 0 and "newer than this pycrid knows (1)" in old.stderr
