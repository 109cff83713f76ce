"""Memory of the runtime: its RSS and PSS before the run's pods and with N running pods,
and the total of the per-container monitor processes (conmon, or containerd-shim*) those
pods brought."""

from __future__ import annotations

import contextlib
import secrets
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from pycrid.bench.cri import Pods, container_config, pod_config
from pycrid.bench.procs import memory_kib, monitor_pids
from pycrid.bench.report import Section
from pycrid.bench.target import Target

WORKERS = 4  # CRI calls in flight while building up pods and containers


@dataclass
class Idle:
    """The runtime's memory before this run pulled an image or ran a pod, and the monitor
    processes that already existed then (not ours)."""

    rss_kib: int
    pss_kib: int
    monitors: set[int]

    @classmethod
    def take(cls, pid: int | None) -> Idle | None:
        if pid is None:
            return None
        rss, pss = memory_kib(pid)
        return cls(rss, pss, monitor_pids())


@dataclass
class Fleet:
    """Pods with one running ``sleep 3600`` container each, made ``WORKERS`` at a time."""

    target: Target
    pods: list[tuple[str, Any]] = field(default_factory=list)

    def build(self, n: int) -> float:
        """Seconds to run ``n`` pods, each with its sleeper started."""
        tag = secrets.token_hex(3)
        cfg = container_config(self.target.image, "sleeper", ["sleep", "3600"])

        def one(i: int) -> None:
            pod = pod_config(f"bench-rss-{tag}-{i:04d}")
            sid = self.target.pods.run(pod)
            self.pods.append((sid, pod))
            self.target.pods.run_container(sid, cfg, pod)

        t0 = time.monotonic()
        with ThreadPoolExecutor(WORKERS) as pool:
            for done, _ in enumerate(pool.map(one, range(n)), 1):
                print(f"\rpods {done}/{n}", end="", file=sys.stderr, flush=True)
        print(file=sys.stderr)
        return time.monotonic() - t0

    def remove(self) -> None:
        with ThreadPoolExecutor(WORKERS) as pool:
            list(pool.map(lambda p: self.target.pods.discard(p[0]), list(self.pods)))
        self.pods.clear()


def run(target: Target, idle: Idle | None, fleet: Fleet, n_pods: int,
        buildup_s: float) -> Section:
    sec = Section("rss")
    pid = target.daemon_pid
    if idle is None or pid is None:
        sec.skipped = ("no daemon pid: nobody in this pid namespace listens on the socket "
                       "(give --daemon-pid PID)")
        return sec
    time.sleep(1.0)  # let the runtime's allocator settle after the build-up
    rss, pss = memory_kib(pid)
    mons = sorted(monitor_pids(Pods.told) - idle.monitors)
    mon_rss = mon_pss = 0
    for m in mons:
        with contextlib.suppress(OSError):
            r, p = memory_kib(m)
            mon_rss, mon_pss = mon_rss + r, mon_pss + p
    sec.floor("daemon RSS idle", [idle.rss_kib], unit="KiB")
    sec.floor("daemon PSS idle", [idle.pss_kib], unit="KiB")
    sec.figure(f"daemon RSS, {n_pods} pods", [rss], unit="KiB", floor="daemon RSS idle")
    sec.figure(f"daemon PSS, {n_pods} pods", [pss], unit="KiB", floor="daemon PSS idle")
    sec.figure("daemon RSS per pod", [(rss - idle.rss_kib) / n_pods], unit="KiB")
    sec.figure("daemon PSS per pod", [(pss - idle.pss_kib) / n_pods], unit="KiB")
    sec.figure("monitor processes", [len(mons)], unit="count")
    if mons:
        sec.figure("monitor RSS total", [mon_rss], unit="KiB")
        sec.figure("monitor PSS total", [mon_pss], unit="KiB")
        sec.figure("monitor RSS per pod", [mon_rss / n_pods], unit="KiB")
        sec.figure("monitor PSS per pod", [mon_pss / n_pods], unit="KiB")
    sec.notes.append(f"daemon pid {pid}; idle = before this run pulled an image or ran a pod "
                     f"(the node's own pods, if any, included); each pod runs one "
                     f"`sleep 3600` container; monitors = conmon/containerd-shim* processes "
                     f"naming this run's pods or containers; {n_pods} pods built in "
                     f"{buildup_s:.1f} s")
    sec.extra.update(pods=n_pods, daemon_pid=pid, buildup_seconds=round(buildup_s, 2),
                     monitor_pids=mons)
    return sec
