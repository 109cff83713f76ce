"""How long ``pycrid serve`` takes to come back with N running containers, against an empty one.

Run from the repository root as root::

    .venv/bin/python -m bench.recovery [--containers 100] [--per-pod 1] [--rounds 5]
                                       [--json results.json]

Uses the environment of ``python -m bench`` (a local registry with the standard test images,
``pycrid serve`` subprocesses configured as the e2e tests configure them). Two daemons
with the same config and the same pulled images (busybox and the pause image) live in
their own base dirs: "full", which gets N/K pods on the CNI test network with K running
``sleep 3600`` containers each, and "empty", which gets none. Both are stopped with SIGTERM
(their containers keep running under conmon). Every round then restarts each of them once,
in alternating order, and times spawn to ready: from just before ``Popen`` of
``pycrid serve`` to the first CRI Version call that succeeds (the daemon answers
UNAVAILABLE until its recovery is done), polled every 5 ms. After the "full" daemon is
ready, ListContainers must show exactly N containers, all CONTAINER_RUNNING, and
ListPodSandbox exactly N/K pods, all SANDBOX_READY; each daemon is stopped with SIGTERM
again before the next start. The daemon's own ``recovered P pods and C containers in X ms``
log line, if this version writes it, is read from the log text of that start. At the end
all pods are removed through one more start of "full", and everything (pods, daemons,
registry, the test bridges, ``ip_forward``, the temp dir) is cleaned up, Ctrl-C included.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import math
import os
import re
import secrets
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
from cri_api.v1 import api_pb2 as pb
from cri_api.v1 import api_pb2_grpc as pb_grpc
from tests.support.daemon import CRIClient, Daemon, running_daemon, serve_command
from tests.support.images import TestImages
from tests.support.pods import Pods, container_config, daemon_config, leftovers, pod_config
from tests.support.registry import LocalRegistry

from bench.common import (
    arm_signals,
    check_host,
    is_worker,
    p90,
    registry_env,
    remove_all_pods,
    supervise,
)
from pycrid.bench.scratch import interruptible, run_dir, said_left_behind

PROG = "bench.recovery"
FULL, EMPTY = "full", "empty"
POLL = 0.005  # seconds between readiness probes
READY_TIMEOUT = 300.0
RECOVERED = re.compile(r"recovered (\d+) pods and (\d+) containers in ([\d.]+) ms")
# Warnings and errors of a start, but not the UNAVAILABLE answers to our own probes.
PROBLEM = re.compile(r"^\S+ (?:WARNING|ERROR|CRITICAL)\s.*$", re.MULTILINE)
PROBE_NOISE = "server is not initialized yet"


def phase_names(containers: int) -> tuple[str, str, str]:
    """Row names of the table and keys of the JSON: ready (empty), ready (full), log."""
    return ("ready (empty)", f"ready ({containers} containers)",
            f"recovery (log, {containers} containers)")


# ---------------------------------------------------------------------------
# Environment: one registry, two daemon base dirs started and stopped again and again


@dataclass
class Node:
    """One daemon base dir. The first start goes through ``running_daemon`` (which writes
    its config); restarts run the same ``pycrid serve`` command on that config file."""

    base: Path
    config_text: str
    daemon: Daemon | None = None
    offset: int = 0  # size of the log before the current (or last) start

    @property
    def log_path(self) -> Path:
        return self.base / "pycrid.log"

    @property
    def configured(self) -> bool:
        return (self.base / "config.toml").exists()

    @contextlib.contextmanager
    def first_start(self) -> Iterator[Daemon]:
        self.offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        with running_daemon(str(self.base), self.config_text) as daemon:
            self.daemon = daemon
            try:
                yield daemon
            finally:
                self.daemon = None

    def start(self) -> float:
        """Spawn ``pycrid serve``; milliseconds from spawn to its first successful Version."""
        assert self.daemon is None, f"{self.base.name} is already running"
        root, state = self.base / "root", self.base / "state"
        address = str(state / "pycrid.sock")
        cmd = serve_command(str(self.base / "config.toml"), str(root), str(state), address)
        self.offset = self.log_path.stat().st_size
        with open(self.log_path, "ab") as logf:
            t0 = time.perf_counter()
            proc = subprocess.Popen(cmd, stdout=logf, stderr=logf, stdin=subprocess.DEVNULL)
        self.daemon = Daemon(root=str(root), state=str(state), address=address,
                             log_path=str(self.log_path), proc=proc, client=CRIClient(address))
        try:
            return wait_ready_fast(self.daemon, t0)
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        """SIGTERM (containers keep running under conmon) and wait."""
        if self.daemon is not None:
            daemon, self.daemon = self.daemon, None
            daemon.stop()

    def log_of_start(self) -> str:
        """What the daemon logged since its last start."""
        with open(self.log_path, errors="replace") as f:
            f.seek(self.offset)
            return f.read()


def wait_ready_fast(daemon: Daemon, t0: float, timeout: float = READY_TIMEOUT) -> float:
    """``wait_ready`` at a 5 ms poll, on a channel of its own that reconnects within 5 ms
    (gRPC's default backoff would wait a second after a refused connection)."""
    backoff = int(POLL * 1000)
    channel = grpc.insecure_channel(f"unix://{daemon.address}", options=[
        ("grpc.initial_reconnect_backoff_ms", backoff),
        ("grpc.min_reconnect_backoff_ms", backoff),
        ("grpc.max_reconnect_backoff_ms", backoff)])
    stub = pb_grpc.RuntimeServiceStub(channel)  # type: ignore[no-untyped-call]
    deadline = t0 + timeout
    last: Exception | None = None
    try:
        while True:
            if daemon.proc.poll() is not None:
                raise RuntimeError(f"pycrid exited with {daemon.proc.returncode}:\n"
                                   f"{daemon.log()[-4000:]}")
            if os.path.exists(daemon.address):
                try:
                    stub.Version(pb.VersionRequest(), timeout=2)
                    return (time.perf_counter() - t0) * 1000.0
                except grpc.RpcError as e:
                    last = e
            if time.perf_counter() > deadline:
                raise RuntimeError(f"pycrid not ready after {timeout}s ({last}):\n"
                                   f"{daemon.log()[-4000:]}")
            time.sleep(POLL)
    finally:
        channel.close()


def pull_images(daemon: Daemon, reg: LocalRegistry, images: TestImages) -> str:
    busybox = images.busybox.ref(reg)
    daemon.client.pull(busybox)
    daemon.client.pull(images.pause.ref(reg))
    return busybox


def populate(daemon: Daemon, busybox: str, pods: int, per_pod: int) -> None:
    """``pods`` CNI pods with ``per_pod`` running ``sleep 3600`` containers each."""
    made = Pods(daemon.client)
    tag = secrets.token_hex(3)
    for i in range(pods):
        pod = pod_config(f"bench-recovery-{tag}-{i:04d}")
        sid = made.run(pod)
        for j in range(per_pod):
            made.run_container(sid, container_config(busybox, f"sleeper{j}",
                                                     command=["sleep", "3600"]), pod)
        print(f"\rpopulating: pod {i + 1}/{pods}", end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)


def remove_pods(node: Node) -> None:
    """Stop and remove every pod of ``node``, starting it for that if it is not running."""
    if node.daemon is None:
        if not node.configured:
            return
        node.start()
    assert node.daemon is not None
    try:
        remove_all_pods(Pods(node.daemon.client), limit=600)
    finally:
        node.stop()


# ---------------------------------------------------------------------------
# Measuring


def check_full(daemon: Daemon, containers: int, pods: int) -> None:
    """Exactly ``containers`` containers, all running, in exactly ``pods`` ready pods."""
    rt = daemon.client.runtime
    listed = rt.ListContainers(pb.ListContainersRequest(), timeout=60).containers
    states = collections.Counter(pb.ContainerState.Name(c.state) for c in listed)
    if len(listed) != containers or states["CONTAINER_RUNNING"] != containers:
        raise RuntimeError(f"after restart: {len(listed)} containers {dict(states)}, "
                           f"expected {containers} CONTAINER_RUNNING")
    items = rt.ListPodSandbox(pb.ListPodSandboxRequest(), timeout=60).items
    pstates = collections.Counter(pb.PodSandboxState.Name(p.state) for p in items)
    if len(items) != pods or pstates["SANDBOX_READY"] != pods:
        raise RuntimeError(f"after restart: {len(items)} pods {dict(pstates)}, "
                           f"expected {pods} SANDBOX_READY")


@dataclass
class Bench:
    full: Node
    empty: Node
    containers: int
    pods: int
    samples: dict[str, list[float | None]] = field(default_factory=dict)
    logged: list[dict[str, Any]] = field(default_factory=list)  # the log line, per round
    problems: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.samples = {name: [] for name in phase_names(self.containers)}

    def restart_empty(self) -> None:
        ms = self.empty.start()
        try:
            self.samples[phase_names(self.containers)[0]].append(ms)
        finally:
            self.empty.stop()
        self.note_problems(EMPTY, self.empty.log_of_start())

    def restart_full(self) -> None:
        _, ready, recovery = phase_names(self.containers)
        ms = self.full.start()
        try:
            self.samples[ready].append(ms)
            assert self.full.daemon is not None
            check_full(self.full.daemon, self.containers, self.pods)
        finally:
            self.full.stop()
        text = self.full.log_of_start()
        self.note_problems(FULL, text)
        m = RECOVERED.search(text)
        if m is None:
            self.samples[recovery].append(None)
            self.logged.append({})
            return
        got_pods, got_containers, log_ms = int(m[1]), int(m[2]), float(m[3])
        self.samples[recovery].append(log_ms)
        self.logged.append({"pods": got_pods, "containers": got_containers, "ms": log_ms})
        if (got_pods, got_containers) != (self.pods, self.containers):
            self.problems.append(f"{FULL}: daemon logged {m[0]!r}, expected {self.pods} pods "
                                 f"and {self.containers} containers")

    def note_problems(self, name: str, text: str) -> None:
        for line in PROBLEM.findall(text):
            if PROBE_NOISE not in line:
                self.problems.append(f"{name}: {line[:300]}")

    def round(self, i: int) -> None:
        order = [self.restart_empty, self.restart_full]
        if i % 2:
            order.reverse()
        for restart in order:
            restart()


def stats(vals: list[float]) -> dict[str, Any]:
    if not vals:
        return {"median_ms": None, "p90_ms": None, "min_ms": None, "max_ms": None, "n": 0}
    return {"median_ms": statistics.median(vals), "p90_ms": p90(vals), "min_ms": min(vals),
            "max_ms": max(vals), "n": len(vals)}


def summarize(samples: dict[str, list[float | None]],
              containers: int) -> tuple[dict[str, dict[str, Any]], float, float]:
    """Per-phase statistics (a missing log line is left out), the ratio of the ready
    medians full/empty and the per-container cost (median full - median empty) / N."""
    phases = {name: stats([v for v in vals if v is not None]) for name, vals in samples.items()}
    empty, full, _ = phase_names(containers)
    e, f = phases[empty]["median_ms"], phases[full]["median_ms"]
    return phases, (f / e if e > 0 else float("nan")), (f - e) / containers


def fmt(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.1f}"


def print_report(phases: dict[str, dict[str, Any]], ratio: float, per_container: float,
                 containers: int, pods: int, rounds: int) -> None:
    empty, full, _ = phase_names(containers)
    width = max(len(n) for n in phases) + 2
    print(f"\nrestart to ready, {containers} containers in {pods} pods, {rounds} rounds"
          " (milliseconds)\n")
    print(f"{'phase':<{width}}{'median':>10}{'p90':>10}{'min':>10}{'max':>10}")
    print("-" * (width + 40))
    for name, s in phases.items():
        print(f"{name:<{width}}{fmt(s['median_ms']):>10}{fmt(s['p90_ms']):>10}"
              f"{fmt(s['min_ms']):>10}{fmt(s['max_ms']):>10}")
    print()
    print(f"{full} / {empty} = {ratio:.2f}x  (medians)")
    print(f"per container = ({full} - {empty}) / {containers} = {per_container:.2f} ms"
          "  (medians)")


# ---------------------------------------------------------------------------


@interruptible
def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not is_worker():
        return supervise(argv, PROG)
    ap = argparse.ArgumentParser(prog=f"python -m {PROG}", description=__doc__.split("\n")[0])
    ap.add_argument("--containers", type=int, default=100,
                    help="running containers in the full daemon (default 100)")
    ap.add_argument("--per-pod", type=int, default=1,
                    help="containers per pod (default 1: as many pods as containers)")
    ap.add_argument("--rounds", type=int, default=5,
                    help="measured rounds, each one restart of either daemon (default 5)")
    ap.add_argument("--json", metavar="PATH", help="also write the results as JSON here")
    ap.add_argument("--keep", action="store_true", help="keep the temp dir (logs) on exit")
    args = ap.parse_args(argv)
    if args.containers < 1 or args.per_pod < 1 or args.rounds < 1:
        ap.error("--containers, --per-pod and --rounds must be at least 1")
    if args.containers % args.per_pod:
        ap.error("--containers must be a multiple of --per-pod")
    n_pods = args.containers // args.per_pod
    check_host(PROG)
    arm_signals()

    t_start = time.monotonic()
    populate_s = 0.0
    left: list[str] = []
    with run_dir("pycrid-bench-rec-", args.keep) as base:
        print("starting registry ...", file=sys.stderr)
        with registry_env(base) as (reg, images):
            config = daemon_config(reg, images, base)
            full, empty = Node(base / FULL, config), Node(base / EMPTY, config)
            bench = Bench(full, empty, args.containers, n_pods)
            try:
                with empty.first_start() as daemon:
                    pull_images(daemon, reg, images)
                with full.first_start() as daemon:
                    busybox = pull_images(daemon, reg, images)
                    t0 = time.monotonic()
                    populate(daemon, busybox, n_pods, args.per_pod)
                    populate_s = time.monotonic() - t0
                for i in range(args.rounds):
                    bench.round(i)
                    print(f"\rround {i + 1}/{args.rounds}", end="", file=sys.stderr,
                          flush=True)
                print(file=sys.stderr)
            finally:
                # A second Ctrl-C must not cut the removal of N pods short.
                signal.signal(signal.SIGINT, signal.SIG_IGN)
                signal.signal(signal.SIGTERM, signal.SIG_IGN)
                print("removing pods ...", file=sys.stderr)
                try:
                    remove_pods(full)
                finally:
                    empty.stop()
                    for node in (full, empty):
                        if node.configured:
                            left += leftovers(str(node.base / "root"),
                                              str(node.base / "state"))
    for problem in bench.problems:
        print(f"daemon log: {problem}", file=sys.stderr)
    if said_left_behind(left):
        return 1

    phases, ratio, per_container = summarize(bench.samples, args.containers)
    print_report(phases, ratio, per_container, args.containers, n_pods, args.rounds)
    if args.json:
        result = {
            "containers": args.containers,
            "pods": n_pods,
            "per_pod": args.per_pod,
            "rounds": args.rounds,
            "populate_seconds": round(populate_s, 2),
            "wall_seconds": round(time.monotonic() - t_start, 2),
            "host": {"cpus": os.cpu_count(), "kernel": os.uname().release},
            "phases": phases,
            "ratio_full_to_empty": ratio if math.isfinite(ratio) else None,
            "per_container_ms": per_container,
            "samples_ms": bench.samples,
            "recovery_log": bench.logged,
            "daemon_log_problems": bench.problems,
        }
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
        print(f"\nwrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
