"""The real kubelet (``../shared/interop/bin/kubelet``) run standalone against a test daemon.

Static pods from a directory, no API server, its HTTPS port on 127.0.0.1 with anonymous
access (``/stats/summary``, ``/metrics/cadvisor``). The kubelet changes the host as it
starts (sysctls, its cgroups, a few directories, a bind mount of its root dir):
``running_kubelet`` notes the host's state first and puts it back afterwards, and reports
what it could not.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from tests.support.daemon import mounts_under
from tests.support.registry import dying_with_parent, free_port

#: What the kubelet sets at start unless protectKernelDefaults (its setupKernelTunables).
SYSCTLS = ("vm/overcommit_memory", "vm/panic_on_oom", "kernel/panic", "kernel/panic_on_oops",
           "kernel/keys/root_maxkeys", "kernel/keys/root_maxbytes")
#: Host directories it makes whatever its --root-dir (device plugins, log links).
HOST_DIRS = ("/var/lib/kubelet", "/var/log/containers", "/var/log/pods")
CGROUP_ROOT = "/sys/fs/cgroup"
#: The cgroup it makes for pods (cgroupsPerQOS with the cgroupfs driver).
KUBEPODS = "kubepods"
#: One kubelet per host at a time: each owns the node's ``kubepods`` cgroups (and removes
#: pod cgroups it does not know) and puts back the sysctls it changed, so two test
#: processes running kubelets at once would undo each other.
HOST_LOCK = "/run/pycrid-test-kubelet.lock"


@contextlib.contextmanager
def host_lock() -> Iterator[None]:
    """Wait for, then hold, the host-wide kubelet lock (released when the test ends)."""
    with open(HOST_LOCK, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


@dataclass(frozen=True)
class HostState:
    """The parts of the host the kubelet changes, as they were before it ran."""

    sysctls: dict[str, str]
    dirs: frozenset[str]
    kubepods: frozenset[str]


def _kubepods_dirs() -> set[str]:
    found = set()
    with contextlib.suppress(OSError):
        for h in os.listdir(CGROUP_ROOT):
            path = os.path.join(CGROUP_ROOT, h, KUBEPODS)
            if os.path.isdir(path):
                found.add(path)
    return found


def host_state() -> HostState:
    values = {}
    for key in SYSCTLS:
        with contextlib.suppress(OSError), open(f"/proc/sys/{key}") as f:
            values[key] = f.read().strip()
    return HostState(sysctls=values, dirs=frozenset(d for d in HOST_DIRS if os.path.exists(d)),
                     kubepods=frozenset(_kubepods_dirs()))


def _rmdir_tree(path: str) -> list[str]:
    """Remove a cgroup and its children bottom-up; the ones that stay (busy), by path."""
    left = []
    for dirpath, dirs, _files in os.walk(path, topdown=False):
        for d in dirs:
            with contextlib.suppress(FileNotFoundError):
                try:
                    os.rmdir(os.path.join(dirpath, d))
                except OSError:
                    left.append(os.path.join(dirpath, d))
    try:
        os.rmdir(path)
    except FileNotFoundError:
        pass
    except OSError:
        left.append(path)
    return left


def restore_host(before: HostState) -> list[str]:
    """Put back what the kubelet changed; what could not be restored, for a test to report.

    Only what was not there before is removed: another kubelet on the node keeps its own."""
    problems = []
    for key, value in before.sysctls.items():
        try:
            with open(f"/proc/sys/{key}") as f:
                if f.read().strip() == value:
                    continue
            with open(f"/proc/sys/{key}", "w") as f:
                f.write(value)
        except OSError as e:
            problems.append(f"sysctl {key}={value}: {e}")
    for path in sorted(_kubepods_dirs() - before.kubepods):
        problems += [f"cgroup {p} (busy)" for p in _rmdir_tree(path)]
    for d in HOST_DIRS:
        if d not in before.dirs and os.path.exists(d):
            problems += _remove_dir(d)
    return problems


def _remove_dir(path: str) -> list[str]:
    """Remove a directory the kubelet made; refuse one that holds a mount."""
    if mounts_under(path):
        return [f"directory {path} still holds mounts {mounts_under(path)}"]
    for dirpath, dirs, files in os.walk(path, topdown=False):
        for name in files:
            os.unlink(os.path.join(dirpath, name))
        for name in dirs:
            p = os.path.join(dirpath, name)
            if os.path.islink(p):
                os.unlink(p)
            else:
                os.rmdir(p)
    os.rmdir(path)
    return []


def unmount_under(path: str) -> None:
    """The kubelet bind-mounts its root dir (and pods' volumes under it): deepest first."""
    for mp in sorted(mounts_under(path), key=len, reverse=True):
        subprocess.run(["umount", "-l", mp], check=False, capture_output=True)


def kubelet_config(*, runtime_socket: str, manifests: str, pod_logs: str, port: int,
                   healthz_port: int, feature_gates: Mapping[str, bool]) -> dict[str, Any]:
    """A KubeletConfiguration for a standalone kubelet on this kind of machine (see the
    interop README): cgroup v1 allowed, no oom_score_adj (no CAP_SYS_RESOURCE), no
    iptables, no node registration, its endpoints on loopback with anonymous access."""
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration",
        "containerRuntimeEndpoint": f"unix://{runtime_socket}",
        "staticPodPath": manifests, "podLogsDir": pod_logs,
        "cgroupDriver": "cgroupfs", "failCgroupV1": False, "oomScoreAdj": 0,
        "makeIPTablesUtilChains": False, "failSwapOn": False, "registerNode": False,
        "address": "127.0.0.1", "port": port, "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1", "healthzPort": healthz_port,
        "authentication": {"anonymous": {"enabled": True}, "webhook": {"enabled": False}},
        "authorization": {"mode": "AlwaysAllow"},
        "evictionHard": {"memory.available": "1Mi", "nodefs.available": "1%",
                         "nodefs.inodesFree": "1%", "imagefs.available": "1%"},
        "imageGCHighThresholdPercent": 100, "imageGCLowThresholdPercent": 99,
        "featureGates": dict(feature_gates),
    }


@dataclass
class Kubelet:
    base: str
    port: int
    proc: subprocess.Popen[bytes]
    log_path: str
    manifests: str

    def log(self) -> str:
        with open(self.log_path, errors="replace") as f:
            return f.read()

    def get(self, path: str, timeout: float = 30) -> bytes:
        """GET on the kubelet's HTTPS port (its self-signed certificate is not checked)."""
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        with urllib.request.urlopen(f"https://127.0.0.1:{self.port}{path}", context=ctx,
                                    timeout=timeout) as r:
            return bytes(r.read())

    def post(self, path: str, timeout: float = 120) -> bytes:
        """POST (no body) on the kubelet's HTTPS port, e.g. its checkpoint endpoint."""
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        req = urllib.request.Request(f"https://127.0.0.1:{self.port}{path}", method="POST")
        with urllib.request.urlopen(req, context=ctx, timeout=timeout) as r:
            return bytes(r.read())

    def summary(self) -> dict[str, Any]:
        doc: dict[str, Any] = json.loads(self.get("/stats/summary"))
        return doc

    def metrics_cadvisor(self) -> str:
        return self.get("/metrics/cadvisor").decode()

    def wait_serving(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        last: Exception | None = None
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"kubelet exited with {self.proc.returncode}:\n"
                                     f"{self.log()[-6000:]}")
            try:
                self.get("/healthz", timeout=2)
                return
            except (OSError, urllib.error.URLError) as e:
                last = e
            time.sleep(0.2)
        raise AssertionError(f"kubelet not serving after {timeout}s ({last}):\n"
                             f"{self.log()[-6000:]}")

    def stop(self, timeout: float = 30) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@contextlib.contextmanager
def running_kubelet(binary: str, base: str, *, runtime_socket: str,
                    manifests: Mapping[str, str], feature_gates: Mapping[str, bool] | None = None,
                    containerd_socket: str = "", housekeeping: str = "2s",
                    cleanup: Callable[[], None] | None = None) -> Iterator[Kubelet]:
    """Start the kubelet under ``base`` with ``manifests`` (file name -> YAML/JSON) as its
    static pods; it dies with the test process. ``containerd_socket`` is where its
    built-in cAdvisor asks containerd's API (the kubelet's ``--containerd`` flag);
    ``housekeeping`` its per-container interval (10 s by default: shorter here so stats
    show up sooner). ``cleanup`` runs after the kubelet stopped and before the host is
    restored (to remove the pods it left in the runtime). Whatever could not be restored
    is an AssertionError."""
    with host_lock():
        yield from _running_kubelet(binary, base, runtime_socket=runtime_socket,
                                    manifests=manifests, feature_gates=feature_gates,
                                    containerd_socket=containerd_socket,
                                    housekeeping=housekeeping, cleanup=cleanup)


def _running_kubelet(binary: str, base: str, *, runtime_socket: str,
                     manifests: Mapping[str, str], feature_gates: Mapping[str, bool] | None,
                     containerd_socket: str, housekeeping: str,
                     cleanup: Callable[[], None] | None) -> Iterator[Kubelet]:
    before = host_state()
    root = os.path.join(base, "root")
    static = os.path.join(base, "manifests")
    pod_logs = os.path.join(base, "pod-logs")
    for d in (root, static, pod_logs):
        os.makedirs(d, exist_ok=True)
    for name, text in manifests.items():
        with open(os.path.join(static, name), "w") as f:
            f.write(text)
    port = free_port()
    config = kubelet_config(runtime_socket=runtime_socket, manifests=static, pod_logs=pod_logs,
                            port=port, healthz_port=free_port(),
                            feature_gates=feature_gates or {})
    config_path = os.path.join(base, "kubelet.json")
    with open(config_path, "w") as f:
        json.dump(config, f, indent=1)
    cmd = [binary, "--config", config_path, "--hostname-override", "pycrid-test-node",
           "--root-dir", root, "--cert-dir", os.path.join(base, "pki"),
           f"--housekeeping-interval={housekeeping}", "--v=2"]
    if containerd_socket:
        cmd.append(f"--containerd={containerd_socket}")
    # Not *.log: the leak checks take every 64-hex id in those as one of the session's,
    # and the kubelet logs the ids of every cgroup on the node.
    log_path = os.path.join(base, "kubelet.stderr")
    problems: list[str] = []
    with open(log_path, "ab") as logf:
        proc = subprocess.Popen(dying_with_parent(cmd), stdout=logf, stderr=logf,
                                stdin=subprocess.DEVNULL)
    kubelet = Kubelet(base=base, port=port, proc=proc, log_path=log_path, manifests=static)
    try:
        kubelet.wait_serving()
        yield kubelet
    finally:
        kubelet.stop()
        try:
            if cleanup is not None:
                cleanup()
        finally:
            unmount_under(root)
            problems += [f"mount {m}" for m in mounts_under(base)]
            problems += restore_host(before)
    assert not problems, "the kubelet left the host changed:\n  " + "\n  ".join(problems)


__all__ = ["HostState", "Kubelet", "host_state", "kubelet_config", "restore_host",
           "running_kubelet"]
