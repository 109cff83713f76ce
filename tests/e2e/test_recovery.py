"""Restart recovery and the CRI event stream, end to end.

A daemon is stopped with containers running; while it is down one container
is killed and another exits on its own; after the restart the running ones
are still running and logging, the dead ones are reported with their real
exit codes, and both the NRI plugin (StopContainer) and an event subscriber
(CONTAINER_STOPPED_EVENT) hear of those exits as if they had just happened.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sqlite3
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import grpc
import pytest
from cri_api.v1 import api_pb2 as pb

from tests.support.daemon import (
    NRI_SECTION,
    CRIClient,
    Daemon,
    nri_paths,
    running_daemon,
    serve_command,
)
from tests.support.images import TestImages
from tests.support.nri_plugins import has_event, install_preinstalled, read_events, wait_events
from tests.support.pods import (
    Pods,
    container_config,
    daemon_config,
    leftovers,
    log_text,
    pod_config,
    processes_mentioning,
    wait_for,
)
from tests.support.registry import LocalRegistry

pytestmark = pytest.mark.e2e

CREATED, STARTED = pb.CONTAINER_CREATED_EVENT, pb.CONTAINER_STARTED_EVENT
STOPPED, DELETED = pb.CONTAINER_STOPPED_EVENT, pb.CONTAINER_DELETED_EVENT


class Subscriber:
    """A GetContainerEvents stream read by a thread into a list."""

    def __init__(self, client: CRIClient) -> None:
        self.events: list[Any] = []
        self._call = client.runtime.GetContainerEvents(pb.GetEventsRequest())
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        try:
            for event in self._call:
                self.events.append(event)
        except grpc.RpcError:
            pass  # cancelled, or the daemon went away

    def seen(self) -> list[tuple[str, int]]:
        return [(e.container_id, e.container_event_type) for e in self.events]

    def wait(self, item: tuple[str, int], timeout: float = 20) -> Any:
        wait_for(lambda: item in self.seen(), timeout,
                 f"event {pb.ContainerEventType.Name(item[1])} for {item[0][:12]}")
        return next(e for e in self.events
                    if (e.container_id, e.container_event_type) == item)

    def close(self) -> None:
        self._call.cancel()
        self._thread.join(10)


def _config(registry: LocalRegistry, images: TestImages, base: Path) -> str:
    paths = nri_paths(str(base))
    nri = "\n".join([NRI_SECTION] + [f'{k} = "{v}"' for k, v in paths.items()])
    return daemon_config(registry, images, base) + nri + "\n"


def test_container_events_follow_the_lifecycle(tmp_path: Path, registry: LocalRegistry,
                                               test_images: TestImages) -> None:
    busybox = test_images.busybox.ref(registry)
    with running_daemon(str(tmp_path), daemon_config(registry, test_images, tmp_path)) as d:
        d.client.pull(busybox)
        pods = Pods(d.client)
        first, second = Subscriber(d.client), Subscriber(d.client)
        try:
            pod = pod_config()
            sid = pods.run(pod)
            cid = pods.create(sid, container_config(busybox, "c", command=["sleep", "3600"]),
                              pod)
            pods.start(cid)
            quick = pods.run_container(sid, container_config(
                busybox, "quick", command=["sh", "-c", "exit 5"]), pod)
            stopped = first.wait((quick, STOPPED))  # exits on its own
            mine = {c.id: c for c in stopped.containers_statuses}
            assert (mine[quick].state, mine[quick].exit_code) == (pb.CONTAINER_EXITED, 5)
            assert mine[cid].state == pb.CONTAINER_RUNNING
            assert stopped.pod_sandbox_status.id == sid
            pods.stop(cid)
            pods.remove(cid)
            pods.remove(quick)
            pods.stop_pod(sid)
            pods.remove_pod(sid)
            expected = [(sid, CREATED), (sid, STARTED), (cid, CREATED), (cid, STARTED),
                        (quick, CREATED), (quick, STARTED), (quick, STOPPED), (cid, STOPPED),
                        (cid, DELETED), (quick, DELETED), (sid, STOPPED), (sid, DELETED)]
            for sub in (first, second):
                sub.wait((sid, DELETED))
                assert sub.seen() == expected
            by_kind = {(e.container_id, e.container_event_type): e for e in first.events}
            started = by_kind[(cid, STARTED)]
            assert started.pod_sandbox_status.state == pb.SANDBOX_READY
            assert {c.id: c.state for c in started.containers_statuses} == {
                cid: pb.CONTAINER_RUNNING}
            assert by_kind[(cid, STOPPED)].created_at >= started.created_at > 0
            assert by_kind[(sid, STOPPED)].pod_sandbox_status.state == pb.SANDBOX_NOTREADY
            assert not by_kind[(sid, DELETED)].containers_statuses
        finally:
            first.close()
            second.close()
        assert leftovers(d.root, d.state) == []


def test_restart_keeps_containers_and_reports_exits_from_downtime(
        tmp_path: Path, registry: LocalRegistry, test_images: TestImages) -> None:
    busybox = test_images.busybox.ref(registry)
    plugins = Path(nri_paths(str(tmp_path))["plugin_path"])
    record = tmp_path / "rec.jsonl"
    install_preinstalled(plugins, "10-rec", "recorder", record=record)
    config = _config(registry, test_images, tmp_path)
    logs = tmp_path / "logs"
    with running_daemon(str(tmp_path), config) as d:
        d.client.pull(busybox)
        pods = Pods(d.client)
        pod = pod_config(log_dir=str(logs))
        sid = pods.run(pod)
        ticker = pods.run_container(sid, container_config(
            busybox, "ticker", log_path="ticker.log",
            command=["sh", "-c", "i=0; while true; do echo tick $i; i=$((i+1)); sleep 0.1; done"]),
            pod)
        doomed = pods.run_container(sid, container_config(
            busybox, "doomed", command=["sleep", "3600"]), pod)
        # Exits on its own once the daemon is down (the wait below makes sure of it).
        later = pods.run_container(sid, container_config(
            busybox, "later", command=["sh", "-c", "sleep 3; exit 7"]), pod)
        doomed_pid = _pid(pods, doomed)
        wait_events(record, has_event("PostStartContainer", container_id=later), 20,
                    "the plugin to see the containers start")
    # The daemon is down; its containers are not.
    log_path = logs / "ticker.log"
    ticks = log_text(str(log_path)).count("tick")
    exits = Path(d.state) / "exits"
    assert not (exits / later).exists(), "'later' exited before the daemon was down"
    os.kill(doomed_pid, signal.SIGKILL)
    wait_for(lambda: (exits / doomed).exists() and (exits / later).exists(), 10,
             "conmon to record the exits")
    time.sleep(0.5)
    assert log_text(str(log_path)).count("tick") > ticks, "logging stopped with the daemon"

    with running_daemon(str(tmp_path), config) as d:
        pods = Pods(d.client)
        sub = Subscriber(d.client)  # connects after start-up: gets the held events
        try:
            states = {c.id: (c.state) for c in pods.rt.ListContainers(
                pb.ListContainersRequest(), timeout=10).containers}
            assert states == {ticker: pb.CONTAINER_RUNNING, doomed: pb.CONTAINER_EXITED,
                              later: pb.CONTAINER_EXITED}
            assert pods.status(doomed).status.exit_code == 137
            assert pods.status(later).status.exit_code == 7
            assert pods.pod_status(sid).status.state == pb.SANDBOX_READY
            for cid in (doomed, later):
                event = sub.wait((cid, STOPPED))
                statuses = {c.id: c for c in event.containers_statuses}
                assert statuses[cid].state == pb.CONTAINER_EXITED
            events = wait_events(record, lambda ev: all(
                has_event("StopContainer", container_id=c)(ev) for c in (doomed, later)),
                20, "StopContainer for the exits that happened while the daemon was down")
            sync = [e for e in events if e["event"] == "Synchronize"][-1]
            # Plugins were synchronised with the containers still running, then told of
            # the exits as fresh ones.
            assert sync["container_states"][doomed] == "CONTAINER_RUNNING"
            stop = next(e for e in events if e["event"] == "StopContainer"
                        and e["container_id"] == doomed)
            assert (stop["exit_code"], stop["state"]) == (137, "CONTAINER_STOPPED")
            # The ticker kept its log across the restart and keeps writing to it.
            ticks = log_text(str(log_path)).count("tick")
            wait_for(lambda: log_text(str(log_path)).count("tick") > ticks + 3, 10,
                     "the ticker to keep logging after the restart")
            pods.stop(ticker)
            assert pods.status(ticker).status.state == pb.CONTAINER_EXITED
            sub.wait((ticker, STOPPED))
            pods.remove_pod(sid)
        finally:
            sub.close()
        assert leftovers(d.root, d.state) == []
    assert len([e for e in read_events(record) if e["event"] == "StopContainer"
                and e["container_id"] == doomed]) == 1


def _pid(pods: Pods, cid: str) -> int:
    return int(json.loads(pods.status(cid, verbose=True).info["info"])["pid"])


def test_container_gone_without_a_trace_is_exited_unknown(
        tmp_path: Path, registry: LocalRegistry, test_images: TestImages) -> None:
    """runc forgot the container and conmon left no exit file (state dir wiped under it):
    exited, code 255, reason Unknown, as containerd reports it."""
    busybox = test_images.busybox.ref(registry)
    config = daemon_config(registry, test_images, tmp_path)
    with running_daemon(str(tmp_path), config) as d:
        d.client.pull(busybox)
        pods = Pods(d.client)
        pod = pod_config()
        sid = pods.run(pod)
        cid = pods.run_container(sid, container_config(busybox, "c", command=["sleep", "3600"]),
                                 pod)
    _forget_in_runc(d, cid)
    with running_daemon(str(tmp_path), config) as d:
        pods = Pods(d.client)
        st = pods.status(cid).status
        assert (st.state, st.exit_code, st.reason) == (pb.CONTAINER_EXITED, 255, "Unknown")
        pods.remove_pod(sid)
        assert leftovers(d.root, d.state) == []


def _forget_in_runc(d: Daemon, cid: str) -> None:
    """Kill the container's processes and remove every record of it but pycrid's own."""
    subprocess.run(["runc", f"--root={d.state}/runc", "kill", cid, "KILL"], check=True)
    wait_for(lambda: (Path(d.state) / "exits" / cid).exists(), 10, "the exit file")
    subprocess.run(["runc", f"--root={d.state}/runc", "delete", "--force", cid], check=False)
    os.unlink(Path(d.state) / "exits" / cid)
    shutil.rmtree(Path(d.state) / "runc" / cid, ignore_errors=True)


def test_orphans_without_records_are_swept_and_an_unreadable_row_stops_start_up(
        tmp_path: Path, registry: LocalRegistry, test_images: TestImages) -> None:
    """One container's record is deleted behind the daemon's back (its conmon, runc
    container, bundle, snapshot and exit dir entry are orphans now) and another's row is
    corrupted: the restart stops, naming the unreadable record, and touches nothing (both
    containers still run: a runtime that skipped the row would have the kubelet start a
    second copy beside it). Once the operator drops the row (docs/upgrades.md), the next
    start removes every trace of both."""
    busybox = test_images.busybox.ref(registry)
    config = daemon_config(registry, test_images, tmp_path)
    with running_daemon(str(tmp_path), config) as d:
        d.client.pull(busybox)
        pods = Pods(d.client)
        pod = pod_config()
        sid = pods.run(pod)
        orphan = pods.run_container(sid, container_config(busybox, "orphan",
                                                          command=["sleep", "3600"]), pod)
        broken = pods.run_container(sid, container_config(busybox, "broken",
                                                          command=["sleep", "3600"]), pod)
    _sql(d, "DELETE FROM containers WHERE id = ?", orphan)
    _sql(d, "UPDATE containers SET record = '{not json' WHERE id = ?", broken)
    try:
        refused = subprocess.run(
            serve_command(str(tmp_path / "config.toml"), d.root, d.state, d.address),
            capture_output=True, text=True, timeout=120)
        assert refused.returncode == 1, refused.stderr[-3000:]
        assert (f"1 record(s) of table containers cannot be read: container {broken}: "
                "JSONDecodeError") in refused.stderr
        assert "Start-up stops" in refused.stderr and "docs/upgrades.md" in refused.stderr
        assert not os.path.exists(d.address)
        for cid in (orphan, broken):  # left alone, still running
            assert cid in _runc_list(d), cid
            assert processes_mentioning(cid), cid
    finally:
        # The operator drops the unreadable row: the next start sweeps its traces too.
        _sql(d, "DELETE FROM containers WHERE id = ?", broken)
    with running_daemon(str(tmp_path), config) as d:
        pods = Pods(d.client)
        ids = {c.id for c in pods.rt.ListContainers(pb.ListContainersRequest(),
                                                    timeout=10).containers}
        assert ids == set()
        for cid in (orphan, broken):
            assert "removed orphaned container " + cid in d.log()
            for where in ("containers", "runc", "exits"):
                assert cid not in os.listdir(os.path.join(d.state, where)), where
            assert not processes_mentioning(cid), f"{cid}'s conmon lives"
        pods.remove_pod(sid)
        assert leftovers(d.root, d.state) == []


def _runc_list(d: Daemon) -> list[str]:
    out = subprocess.run(["runc", "--root", os.path.join(d.state, "runc"), "list", "-q"],
                         capture_output=True, text=True, check=True).stdout
    return out.split()


def _sql(d: Daemon, statement: str, *args: str) -> None:
    """Change the daemon's metadata database behind its back (the daemon is stopped)."""
    db = sqlite3.connect(os.path.join(d.root, "metadata", "pycrid.db"))
    try:
        with db:
            db.execute(statement, args)
    finally:
        db.close()


def test_pod_whose_network_broke_while_down_goes_not_ready_after_restart(
        tmp_path: Path, registry: LocalRegistry, test_images: TestImages) -> None:
    """The CNI CHECK of surviving pods runs once the daemon serves again; a pod whose eth0
    vanished fails it and stops being ready, with a STOPPED event, as if its pause died."""
    config = daemon_config(registry, test_images, tmp_path)
    with running_daemon(str(tmp_path), config) as d:
        pods = Pods(d.client)
        broken, fine = pods.run(pod_config()), pods.run(pod_config())
        netns = {sid: json_info(pods, sid)["netns"] for sid in (broken, fine)}
    subprocess.run(["nsenter", f"--net={netns[broken]}", "ip", "link", "del", "eth0"],
                   check=True)
    with running_daemon(str(tmp_path), config) as d:
        pods = Pods(d.client)
        sub = Subscriber(d.client)
        try:
            sub.wait((broken, STOPPED))
            assert pods.pod_status(broken).status.state == pb.SANDBOX_NOTREADY
            wait_for(lambda: "checked the networks of 2 pods" in d.log(), 20, "the CHECKs")
            assert pods.pod_status(fine).status.state == pb.SANDBOX_READY
            assert (fine, STOPPED) not in sub.seen()
            assert "network CHECK failed" in d.log()
        finally:
            sub.close()
        pods.remove_pod(broken)
        pods.remove_pod(fine)
        assert leftovers(d.root, d.state) == []


def test_pod_keeps_ready_when_the_bridge_mac_changed_while_down(
        tmp_path: Path, registry: LocalRegistry, test_images: TestImages) -> None:
    """A Linux bridge without a MAC of its own takes its lowest port's, so other pods
    coming and going change it after this pod's ADD (the crash storm saw it). The CNI
    CHECK after a restart gets the host side's MACs as they are now, so the bridge
    plugin does not fail a healthy pod for it."""
    config = daemon_config(registry, test_images, tmp_path)
    with running_daemon(str(tmp_path), config) as d:
        pods = Pods(d.client)
        sid = pods.run(pod_config())
        result = json_info(pods, sid)["cniResult"]["eth0"]
    bridge = next(i["name"] for i in result["interfaces"] if not i.get("sandbox")
                  and not i["name"].startswith("veth"))
    old = Path(f"/sys/class/net/{bridge}/address").read_text().strip()
    new = "02:00:5e:00:53:01" if old != "02:00:5e:00:53:01" else "02:00:5e:00:53:02"
    subprocess.run(["ip", "link", "set", "dev", bridge, "address", new], check=True)
    with running_daemon(str(tmp_path), config) as d:
        pods = Pods(d.client)
        wait_for(lambda: "checked the networks of 1 pods" in d.log(), 20, "the CHECK")
        assert "network CHECK failed" not in d.log()
        assert pods.pod_status(sid).status.state == pb.SANDBOX_READY
        pods.remove_pod(sid)
        assert leftovers(d.root, d.state) == []


def json_info(pods: Pods, sid: str) -> dict[str, Any]:
    return dict(json.loads(pods.pod_status(sid, verbose=True).info["info"]))


def test_oom_kill_is_reported_from_the_cgroup_event(
        tmp_path: Path, registry: LocalRegistry, test_images: TestImages) -> None:
    """A container over its memory limit is killed by the kernel; conmon sees the cgroup's
    OOM event and the exit is recorded as OOMKilled (137), with a STOPPED event."""
    busybox = test_images.busybox.ref(registry)
    with running_daemon(str(tmp_path), daemon_config(registry, test_images, tmp_path)) as d:
        d.client.pull(busybox)
        pods = Pods(d.client)
        sub = Subscriber(d.client)
        try:
            pod = pod_config()
            sid = pods.run(pod)
            hog = pods.run_container(sid, container_config(busybox, "hog", command=[
                "sh", "-c", "while [ ! -e /tmp/go ]; do sleep 0.1; done; "
                "x=$(head -c 268435456 /dev/zero | tr '\\0' a); sleep 3600"]), pod)
            pods.rt.UpdateContainerResources(pb.UpdateContainerResourcesRequest(
                container_id=hog, linux=pb.LinuxContainerResources(
                    memory_limit_in_bytes=32 * 1024 * 1024)), timeout=30)
            assert pods.exec(hog, ["touch", "/tmp/go"]).exit_code == 0
            st = pods.wait_state(hog, pb.CONTAINER_EXITED)
            assert (st.exit_code, st.reason) == (137, "OOMKilled")
            sub.wait((hog, STOPPED))
            pods.remove_pod(sid)
        finally:
            sub.close()
        assert leftovers(d.root, d.state) == []


def test_failing_exit_handler_is_retried_with_backoff_not_dropped(
        tmp_path: Path, registry: LocalRegistry, test_images: TestImages) -> None:
    """The exit handler fails twice (fail point ``exit.handle#2``): the exit is retried
    after 1 s and 2 s and then recorded; nothing is lost and no later exit is held up."""
    busybox = test_images.busybox.ref(registry)
    with running_daemon(str(tmp_path), daemon_config(registry, test_images, tmp_path),
                        env={"PYCRID_FAILPOINTS": "exit.handle#2"}) as d:
        d.client.pull(busybox)
        pods = Pods(d.client)
        pod = pod_config()
        sid = pods.run(pod)
        first = pods.run_container(sid, container_config(
            busybox, "first", command=["sh", "-c", "exit 4"]), pod)
        wait_for(lambda: d.log().count("will retry") == 1, 10, "the first failure")
        assert pods.status(first).status.state == pb.CONTAINER_RUNNING  # not recorded yet
        st = pods.wait_state(first, pb.CONTAINER_EXITED, timeout=15)
        assert (st.exit_code, st.reason) == (4, "Error")
        assert d.log().count("will retry") == 2
        second = pods.run_container(sid, container_config(
            busybox, "second", command=["sh", "-c", "exit 5"]), pod)
        assert pods.wait_state(second, pb.CONTAINER_EXITED, timeout=5).exit_code == 5
        pods.remove_pod(sid)
        assert leftovers(d.root, d.state) == []
