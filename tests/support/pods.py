"""Helpers for driving pods and containers over CRI in tests."""

from __future__ import annotations

import contextlib
import os
import secrets
import time
from collections.abc import Callable, Collection, Iterator
from typing import Any

from cri_api.v1 import api_pb2 as pb

from pycrid.bench.cri import Pods as BenchPods
from tests.support.daemon import CRIClient, Daemon, running_daemon
from tests.support.images import TestImages
from tests.support.registry import LocalRegistry


def daemon_config(registry: LocalRegistry, images: TestImages, base: str | os.PathLike[str]) -> str:
    """A daemon config whose sandbox image and registry access point at a local registry."""
    return (
        "version = 2\n"
        '[plugins."pycrid.cri.v1.images"]\n'
        f'sandbox_image = "{images.pause.ref(registry)}"\n'
        '[plugins."pycrid.cri.v1.images".registry]\n'
        f'config_path = "{registry.hosts_dir(os.path.join(base, "certs.d"))}"\n'
    )


@contextlib.contextmanager
def busybox_daemon(base: str | os.PathLike[str], registry: LocalRegistry, images: TestImages,
                   config_text: str | None = None) -> Iterator[Daemon]:
    """The e2e modules' daemon: configured for the test registry and network (or with
    ``config_text``), busybox pulled; ``extra`` has ``base`` and ``busybox``."""
    with running_daemon(str(base), config_text or daemon_config(registry, images, base)) as d:
        d.extra["base"] = str(base)
        d.extra["busybox"] = images.busybox.ref(registry)
        d.client.pull(d.extra["busybox"])
        yield d


def pod_config(name: str = "", namespace: str = "default", *, log_dir: str = "",
               **kw: Any) -> Any:
    name = name or "pod-" + secrets.token_hex(4)
    cfg = pb.PodSandboxConfig(
        metadata=pb.PodSandboxMetadata(name=name, namespace=namespace,
                                       uid="uid-" + name, attempt=0),
        log_directory=log_dir, **kw)
    return cfg


def container_config(image: str, name: str = "c", *, command: list[str] | None = None,
                     args: list[str] | None = None, log_path: str = "", **kw: Any) -> Any:
    return pb.ContainerConfig(metadata=pb.ContainerMetadata(name=name),
                              image=pb.ImageSpec(image=image), command=command or [],
                              args=args or [], log_path=log_path, **kw)


class Pods(BenchPods):
    """The benchmarks' CRI wrappers (they remember what they made, so a test cleans up in
    one call, and the leak checks know this process's ids), plus what tests ask besides."""

    def __init__(self, client: CRIClient) -> None:
        super().__init__(client.runtime)

    def pod_status(self, sid: str, verbose: bool = False) -> Any:
        return self.rt.PodSandboxStatus(pb.PodSandboxStatusRequest(pod_sandbox_id=sid,
                                                                   verbose=verbose), timeout=30)

    def exec(self, cid: str, cmd: list[str], timeout: int = 0) -> Any:
        return self.rt.ExecSync(pb.ExecSyncRequest(container_id=cid, cmd=cmd, timeout=timeout),
                                timeout=timeout + 60)

    def cleanup(self) -> None:
        for sid in list(self.pods):
            self.remove_pod(sid)

    def wait_state(self, cid: str, state: int, timeout: float = 30) -> Any:
        """The status once the container is in ``state`` (an AssertionError after
        ``timeout``)."""
        return wait_for(lambda: (s := self.status(cid).status).state == state and s,
                        timeout, f"container {cid} to reach {pb.ContainerState.Name(state)}")


def wait_for(cond: Callable[[], Any], timeout: float = 30, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while True:
        got = cond()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def read_cri_log(path: str) -> list[tuple[str, str, str]]:
    """(stream, tag, text) of each CRI log line; partial lines are kept as they are."""
    out = []
    if not os.path.exists(path):
        return out
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            _ts, stream, tag, text = line.rstrip("\n").split(" ", 3) + [""] * (
                4 - len(line.rstrip("\n").split(" ", 3)))
            out.append((stream, tag, text))
    return out


def log_text(path: str, stream: str | None = None) -> str:
    """The log's content as the container wrote it (partial lines joined)."""
    parts = []
    for s, tag, text in read_cri_log(path):
        if stream is None or s == stream:
            parts.append(text + ("\n" if tag == "F" else ""))
    return "".join(parts)


CGROUP_ROOT = "/sys/fs/cgroup"


def container_cgroups(ids: Collection[str] | None = None) -> list[str]:
    """Cgroup directories of containers (``k8s.io/<64 hex>``) in any hierarchy; with
    ``ids``, only those of these objects (another runtime on the node uses the same
    parent)."""
    found: list[str] = []
    if not os.path.isdir(CGROUP_ROOT):
        return found
    for hierarchy in os.listdir(CGROUP_ROOT):
        parent = os.path.join(CGROUP_ROOT, hierarchy, "k8s.io")
        if os.path.isdir(parent):
            found += [os.path.join(parent, d) for d in os.listdir(parent)
                      if len(d) == 64 and os.path.isdir(os.path.join(parent, d))
                      and (ids is None or d in ids)]
    return found


def command_lines() -> list[tuple[int, str]]:
    """(pid, command line) of every process but this one."""
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            continue
        found.append((int(pid), cmd))
    return found


def processes_mentioning(text: str) -> list[str]:
    """Processes (other than pycrid itself) whose command line contains ``text``."""
    return [f"{pid}: {cmd[:300]}" for pid, cmd in command_lines()
            if text in cmd and "pycrid serve" not in cmd]


def leftovers(root: str, state: str) -> list[str]:
    """Everything a daemon with this root and state left behind for pods and containers:
    mounts, monitor/runtime processes, container cgroups, netns, bundles, exit files,
    runc (and runsc) state, writable snapshots, CNI cache entries and pod IPs still
    allocated."""
    import sqlite3

    from tests.support.daemon import daemon_ids, mounts_under
    from tests.support.network import allocated_ips

    found = [f"mount {m}" for m in mounts_under(root) + mounts_under(state)]
    found += [f"process {p}" for p in processes_mentioning(state)]
    found += [f"cgroup {c}" for c in container_cgroups(daemon_ids(root))]
    for d in (os.path.join(state, "netns"), os.path.join(state, "containers"),
              os.path.join(state, "sandboxes"), os.path.join(root, "containers"),
              os.path.join(root, "sandboxes"), os.path.join(state, "exits"),
              os.path.join(state, "runc"), os.path.join(state, "runsc"),
              os.path.join(root, "cni", "results")):
        if os.path.isdir(d):
            found += [f"file {os.path.join(d, n)}" for n in os.listdir(d)]
    found += [f"pod IP {ip}" for ip in allocated_ips(os.path.dirname(root))]
    db = os.path.join(root, "metadata", "pycrid.db")
    if os.path.exists(db):
        conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
        try:
            found += [f"snapshot {k}" for (k,) in conn.execute(
                "SELECT key FROM overlay_snapshots WHERE kind != 'committed'")]
            for table in ("sandboxes", "containers"):
                try:
                    found += [f"{table} record {i}" for (i,) in conn.execute(
                        f"SELECT id FROM {table}")]
                except sqlite3.OperationalError:
                    pass
        finally:
            conn.close()
    return found
