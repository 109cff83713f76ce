"""What every benchmark shares: the host check, the supervisor that keeps Ctrl-C away from
the daemon, the registry + daemon environment, statistics, the plain-runc floor, process
memory and the leak check.

All of it reuses ``tests.support`` (registry, standard images, ``pycrid serve`` on a
temporary base dir, the CNI test network), so the benchmarks run what the e2e tests run.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tarfile
import time
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cri_api.v1 import api_pb2 as pb
from tests.support.daemon import CRIClient, Daemon, mounts_under, running_daemon
from tests.support.images import TestImages, busybox_rootfs_tar, load_standard_set
from tests.support.network import (
    ip_forward,
    nat_rules,
    our_bridges,
    pod_nat_rules,
    remove_bridges,
    remove_portmap_scaffolding,
    set_ip_forward,
    veths,
)
from tests.support.pods import Pods, container_cgroups, daemon_config
from tests.support.registry import LocalRegistry

from pycrid.oci.defaults import DEFAULT_PATH, default_spec

RUNC = shutil.which("runc") or "/usr/sbin/runc"
CONMON = "/usr/bin/conmon"
REGISTRY = "/usr/bin/docker-registry"
CGROUP_PARENT = "pycrid-bench"
WORKER_ENV = "PYCRID_BENCH_WORKER"


# ---------------------------------------------------------------------------
# Process plumbing


def check_host(prog: str, *, runtime: bool = True) -> None:
    """Root and the binaries the run needs (runc and conmon only when it starts pycrid)."""
    if os.geteuid() != 0:
        sys.exit(f"{prog} needs root (it runs real containers)")
    tools = [REGISTRY, RUNC] + ([CONMON] if runtime else [])
    for tool in tools:
        if not os.path.exists(tool):
            sys.exit(f"{prog} needs {tool}")


def sigterm_to_interrupt(_signum: int, _frame: Any) -> None:
    raise KeyboardInterrupt


def arm_signals() -> None:
    """SIGTERM and SIGINT both unwind through the cleanup, even if started ignoring them."""
    signal.signal(signal.SIGTERM, sigterm_to_interrupt)
    signal.signal(signal.SIGINT, signal.default_int_handler)


def supervise(argv: list[str], module: str) -> int:
    """Run the benchmark in its own session and forward SIGINT/SIGTERM to it alone.

    A terminal Ctrl-C signals the whole foreground process group; pycrid would stop on it
    before the benchmark had removed its pods, leaving conmon and containers behind.
    """
    child = subprocess.Popen([sys.executable, "-m", module, *argv],
                             env={**os.environ, WORKER_ENV: "1"}, start_new_session=True)

    def forward(signum: int, _frame: Any) -> None:
        with contextlib.suppress(ProcessLookupError):
            child.send_signal(signum)

    signal.signal(signal.SIGINT, forward)
    signal.signal(signal.SIGTERM, forward)
    return child.wait()


def is_worker() -> bool:
    return os.environ.get(WORKER_ENV) == "1"


def first_line(cmd: list[str]) -> str:
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=10)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"unknown ({e})"
    return (out.stdout or out.stderr).strip().split("\n")[0]


def host_info() -> dict[str, Any]:
    return {"kernel": os.uname().release, "cpus": os.cpu_count(),
            "python": sys.version.split()[0], "runc": first_line([RUNC, "--version"]),
            "conmon": first_line([CONMON, "--version"])}


# ---------------------------------------------------------------------------
# Registry + pycrid daemon, as tests/conftest.py and tests/e2e/test_pods.py set them up


@contextlib.contextmanager
def registry_env(base: Path) -> Iterator[tuple[LocalRegistry, TestImages]]:
    """A registry loaded with the standard set; on exit it is stopped, the test bridges
    removed, ``ip_forward`` put back (the bridge plugin turns it on) and the portmap
    plugin's shared nat chains dropped if they were not there before."""
    reg = LocalRegistry(base / "registry")
    forward = ip_forward()
    portmap_before = any("CNI-HOSTPORT" in r for r in nat_rules())
    try:
        reg.start()
        yield reg, load_standard_set(reg)
    finally:
        reg.stop()
        remove_bridges()
        set_ip_forward(forward)
        if not portmap_before:
            remove_portmap_scaffolding()


@contextlib.contextmanager
def pycrid_daemon(base: Path, reg: LocalRegistry, images: TestImages,
                  *extra: str, src: str = "") -> Iterator[Daemon]:
    """``pycrid serve`` on ``base/daemon``, configured as the e2e tests configure it; on
    exit every pod it knows is removed before it is stopped. ``src``: run the ``pycrid``
    package of another checkout's ``src`` directory (an earlier commit, say) instead."""
    env = {"PYTHONPATH": os.path.abspath(src)} if src else None
    with running_daemon(str(base / "daemon"), daemon_config(reg, images, base),
                        *extra, env=env) as daemon:
        try:
            yield daemon
        finally:
            remove_all_pods(Pods(daemon.client))


@dataclass
class Env:
    base: Path
    registry: LocalRegistry
    images: TestImages
    daemon: Daemon
    pods: Pods
    busybox: str


@contextlib.contextmanager
def cri_env(base: Path) -> Iterator[Env]:
    """Registry loaded with the standard set, a running daemon that has pulled busybox
    and the pause image; on exit every pod is removed, the daemon and registry stopped."""
    with registry_env(base) as (reg, images), pycrid_daemon(base, reg, images) as daemon:
        busybox = images.busybox.ref(reg)
        daemon.client.pull(busybox)
        daemon.client.pull(images.pause.ref(reg))
        yield Env(base, reg, images, daemon, Pods(daemon.client), busybox)


@dataclass
class Target:
    """The CRI runtime under test: a pycrid daemon this run started (``daemon``) or any
    runtime at ``endpoint``; images come from the run's own registry either way."""

    base: Path
    registry: LocalRegistry
    images: TestImages
    client: CRIClient
    pods: Pods
    busybox: str
    endpoint: str
    daemon_pid: int | None
    nri_socket: str | None
    daemon: Daemon | None = None

    @property
    def rt(self) -> Any:
        return self.client.runtime


def remove_all_pods(pods: Pods, settle: float = 1.0, limit: float = 30.0) -> None:
    """Stop and remove every pod the runtime lists, until it has listed none for
    ``settle`` seconds: a RunPodSandbox cut short by Ctrl-C may still be finishing."""
    deadline = time.monotonic() + limit
    quiet_since: float | None = None
    while time.monotonic() < deadline:
        try:
            listed = [i.id for i in
                      pods.rt.ListPodSandbox(pb.ListPodSandboxRequest(), timeout=30).items]
        except Exception as e:
            print(f"warning: cannot list pods: {e}", file=sys.stderr)
            listed = []
        todo = list(dict.fromkeys([*pods.pods, *listed]))
        if not todo:
            quiet_since = quiet_since or time.monotonic()
            if time.monotonic() - quiet_since >= settle:
                return
            time.sleep(0.2)
            continue
        quiet_since = None
        for sid in todo:
            remove_pod(pods, sid)


def remove_pod(pods: Pods, sid: str) -> None:
    with contextlib.suppress(Exception):
        pods.stop_pod(sid)
    try:
        pods.remove_pod(sid)
    except Exception as e:
        print(f"warning: could not remove pod {sid}: {e}", file=sys.stderr)
    if sid in pods.pods:
        pods.pods.remove(sid)


# ---------------------------------------------------------------------------
# Statistics


def p90(vals: list[float]) -> float:
    if len(vals) < 2:
        return vals[0]
    return statistics.quantiles(vals, n=10, method="inclusive")[8]


def stats(vals: list[float]) -> dict[str, Any]:
    """median, p90, min, max and n of a non-empty list."""
    return {"median": statistics.median(vals), "p90": p90(vals), "min": min(vals),
            "max": max(vals), "n": len(vals)}


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    """Milliseconds ``fn`` took, and what it returned."""
    t0 = time.perf_counter()
    out = fn()
    return (time.perf_counter() - t0) * 1000.0, out


# ---------------------------------------------------------------------------
# Plain runc, the floor of container start


def make_bundle(bundle: Path) -> None:
    """A busybox rootfs and a config.json from pycrid's own base spec running sleep 3600."""
    rootfs = bundle / "rootfs"
    rootfs.mkdir(parents=True)
    with tarfile.open(fileobj=io.BytesIO(busybox_rootfs_tar())) as tf:
        tf.extractall(rootfs, filter="fully_trusted")
    spec = default_spec()
    spec["root"] = {"path": str(rootfs), "readonly": False}
    proc = spec["process"]
    proc["args"] = ["sleep", "3600"]
    proc["env"] = [DEFAULT_PATH]
    proc["terminal"] = False
    if proc.get("oomScoreAdj", 0) < 0:  # no CAP_SYS_RESOURCE here: runc would fail
        proc["oomScoreAdj"] = 0
    linux = spec["linux"]
    linux["namespaces"] = [{"type": ns["type"]} for ns in linux.get("namespaces", [])]
    spec["hostname"] = "bench"
    (bundle / "config.json").write_text(json.dumps(spec, indent=1))


@dataclass
class Runc:
    """``runc`` on a private root; remembers what it created so cleanup can delete it."""

    root: Path
    bundle: Path
    made: list[str] = field(default_factory=list)

    def _run(self, *args: str) -> None:
        # No pipes: a detached non-terminal container inherits runc's stdio, so a pipe would
        # stay open as long as the container lives. Errors go to runc's --log instead.
        log = self.root.parent / "runc.log"
        r = subprocess.run([RUNC, "--root", str(self.root), "--log", str(log), *args],
                           stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL, check=False)
        if r.returncode != 0:
            tail = log.read_text(errors="replace").strip().splitlines()[-3:]
            raise RuntimeError(f"runc {args[0]} failed ({r.returncode}): {' | '.join(tail)}")

    def config_for(self, cid: str) -> None:
        cfg = json.loads((self.bundle / "config.json").read_text())
        cfg["linux"]["cgroupsPath"] = f"/{CGROUP_PARENT}/{cid}"
        (self.bundle / "config.json").write_text(json.dumps(cfg, indent=1))

    def create(self, cid: str) -> None:
        self.made.append(cid)
        self._run("create", "--bundle", str(self.bundle), "--pid-file",
                  str(self.bundle / "pid"), cid)

    def start(self, cid: str) -> None:
        self._run("start", cid)

    def delete(self, cid: str) -> None:
        self._run("delete", "--force", cid)
        self.made.remove(cid)

    def cleanup(self) -> None:
        for cid in list(self.made):
            with contextlib.suppress(Exception):
                self.delete(cid)
        # Anything else under our private root (e.g. a create interrupted half-way).
        if self.root.is_dir():
            for entry in self.root.iterdir():
                with contextlib.suppress(Exception):
                    self._run("delete", "--force", entry.name)
        remove_cgroup_dirs()


def remove_cgroup_dirs() -> None:
    """rmdir /sys/fs/cgroup/*/pycrid-bench (and the empty leaves below it)."""
    base = Path("/sys/fs/cgroup")
    candidates = [base / CGROUP_PARENT] + [p / CGROUP_PARENT for p in base.iterdir()
                                           if p.is_dir()]
    for top in candidates:
        if not top.is_dir():
            continue
        for child in sorted(top.iterdir(), reverse=True):
            if child.is_dir():
                with contextlib.suppress(OSError):
                    child.rmdir()
        with contextlib.suppress(OSError):
            top.rmdir()


# ---------------------------------------------------------------------------
# Process memory


def memory_kib(pid: int) -> tuple[int, int]:
    """(RSS, PSS) of a process in KiB, from /proc/PID/status and /proc/PID/smaps_rollup."""
    rss = pss = 0
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1])
    with open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            if line.startswith("Pss:"):
                pss = int(line.split()[1])
    return rss, pss


def comm_of(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return ""


def _mentions(pid: int, words: Collection[str]) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmd = f.read().decode(errors="replace")
    except OSError:
        return False
    return any(w in cmd for w in words)


def monitor_pids(ours: Collection[str] | None = None) -> set[int]:
    """Per-container monitor processes: ``conmon`` (pycrid, CRI-O) or ``containerd-shim*``;
    with ``ours`` (ids and directories), only those whose command line names one of them
    (conmon takes ``--cid``, a shim ``-id``: another runtime's monitors are not ours)."""
    found = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            comm = comm_of(int(entry))
            if (comm == "conmon" or comm.startswith("containerd-shim")) and (
                    ours is None or _mentions(int(entry), ours)):
                found.add(int(entry))
    return found


def runc_pids(ours: Collection[str] | None = None) -> set[int]:
    return {int(e) for e in os.listdir("/proc") if e.isdigit() and comm_of(int(e)) == "runc"
            and (ours is None or _mentions(int(e), ours))}


def socket_owner(path: str) -> int | None:
    """The pid holding the listening unix socket bound at ``path``: its inode from
    /proc/net/unix, then the process with an fd on ``socket:[inode]``."""
    inodes = set()
    path = os.path.normpath(path)  # a server may bind "///run/x.sock"
    with open("/proc/net/unix") as f:
        next(f)
        for line in f:
            parts = line.split()
            if (len(parts) >= 8 and os.path.normpath(parts[7]) == path
                    and int(parts[3], 16) & 0x10000):
                inodes.add(parts[6])
    targets = {f"socket:[{i}]" for i in inodes}
    for entry in sorted(os.listdir("/proc"), key=lambda e: (not e.isdigit(), len(e), e)):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        with contextlib.suppress(OSError):
            for fd in os.listdir(f"/proc/{entry}/fd"):
                with contextlib.suppress(OSError):
                    if os.readlink(f"/proc/{entry}/fd/{fd}") in targets:
                        return int(entry)
    return None


# ---------------------------------------------------------------------------
# What the host looks like, for the leak check


@dataclass
class HostSnapshot:
    """What this run's pods left on the host: only objects naming the ids the run was told
    (``Pods.told``) or its directory count, so other runtimes on the node are not leaks."""

    monitors: set[int]
    runc: set[int]
    cgroups: set[str]
    veths: set[str]
    nat: set[str]

    @classmethod
    def take(cls, base: Path | None = None) -> HostSnapshot:
        ours = None if base is None else {*Pods.told, str(base)}
        ids = None if base is None else Pods.told
        return cls(monitor_pids(ours), runc_pids(ours), set(container_cgroups(ids)),
                   veths(our_bridges() if base is not None else None),
                   set(pod_nat_rules(ids)))

    def new_since(self, before: HostSnapshot, base: Path) -> list[str]:
        """What exists now and did not before the run, plus any mount under ``base``.
        A netns appearing in /run/netns cannot be told apart from another runtime's
        (pycrid keeps its own under its state directory, checked by ``leftovers``)."""
        found = [f"mount {m}" for m in mounts_under(str(base))]
        found += [f"monitor process {p} ({comm_of(p)})"
                  for p in sorted(self.monitors - before.monitors)]
        found += [f"runc process {p}" for p in sorted(self.runc - before.runc)]
        found += [f"cgroup {c}" for c in sorted(self.cgroups - before.cgroups)]
        found += [f"veth {n}" for n in sorted(self.veths - before.veths)]
        found += [f"nat rule {r}" for r in sorted(self.nat - before.nat)]
        bench_cg = [str(p / CGROUP_PARENT) for p in Path("/sys/fs/cgroup").iterdir()
                    if (p / CGROUP_PARENT).is_dir()]
        return found + [f"cgroup {c}" for c in bench_cg]


def wait_gone(pids: set[int], timeout: float = 10.0) -> None:
    """Give exiting monitors a moment: conmon outlives its container by a few ms."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(os.path.exists(f"/proc/{p}") for p in pids):
        time.sleep(0.05)

