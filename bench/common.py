"""What the repository's benchmarks share beyond the installed ``pycrid.bench``: the host
check, the supervisor that keeps Ctrl-C away from the daemon, the registry + daemon
environment and the leak check.

All of it reuses ``tests.support`` (registry, standard images, ``pycrid serve`` on a
temporary base dir, the CNI test network), so the benchmarks run what the e2e tests run.
The timing, statistics, report, /proc readers, the runc floor and the sections themselves
live in ``pycrid.bench`` (``pycrid bench`` runs them on any node) and are re-exported here.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cri_api.v1 import api_pb2 as pb
from tests.support.daemon import Daemon, mounts_under, running_daemon
from tests.support.images import TestImages, load_standard_set
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
from tests.support.pods import Pods as SupportPods
from tests.support.pods import container_cgroups, daemon_config
from tests.support.registry import LocalRegistry

from pycrid.bench import procs
from pycrid.bench.cri import Pods
from pycrid.bench.floor import Runc, runc_binary
from pycrid.bench.procs import arm_signals, comm_of, monitor_pids, runc_pids, wait_gone
from pycrid.bench.target import Target as BaseTarget
from pycrid.bench.timing import p90, timed

# Re-exported for the benchmark modules that import them from here.
__all__ = ["Pods", "arm_signals", "p90", "timed", "wait_gone"]

RUNC = runc_binary() or "/usr/sbin/runc"
CONMON = "/usr/bin/conmon"
REGISTRY = "/usr/bin/docker-registry"
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


def host_info() -> dict[str, Any]:
    return procs.host_info(RUNC, CONMON)


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
            remove_all_pods(Pods(daemon.client.runtime))


@dataclass
class Env:
    base: Path
    registry: LocalRegistry
    images: TestImages
    daemon: Daemon
    pods: SupportPods
    busybox: str


@contextlib.contextmanager
def cri_env(base: Path) -> Iterator[Env]:
    """Registry loaded with the standard set, a running daemon that has pulled busybox
    and the pause image; on exit every pod is removed, the daemon and registry stopped."""
    with registry_env(base) as (reg, images), pycrid_daemon(base, reg, images) as daemon:
        busybox = images.busybox.ref(reg)
        daemon.client.pull(busybox)
        daemon.client.pull(images.pause.ref(reg))
        yield Env(base, reg, images, daemon, SupportPods(daemon.client), busybox)


@dataclass
class Target(BaseTarget):
    """The runtime under test as the sections see it, plus the run's own registry and
    images (the pull section's) and the pycrid daemon this run started, if it did.
    ``client`` is the test suite's ``CRIClient``."""

    registry: LocalRegistry
    images: TestImages
    daemon: Daemon | None = None


def remove_all_pods(pods: Pods, settle: float = 1.0,
                    limit: float = 30.0) -> None:
    """Stop and remove every pod the runtime lists, until it has listed none for
    ``settle`` seconds: a RunPodSandbox cut short by Ctrl-C may still be finishing.
    ``pods`` is either kind of ``Pods`` (the test suite's, or ``pycrid.bench``'s)."""
    remover = Pods(pods.rt)
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
            remover.discard(sid)
            if sid in pods.pods:
                pods.pods.remove(sid)


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
        return found + Runc.of_run(base, RUNC).leftovers()
