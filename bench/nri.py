"""CRI CreateContainer latency with 0, 1 and 5 NRI plugins subscribed to CreateContainer.

Run from the repository root as root::

    .venv/bin/python -m bench.nri [--runs 30] [--json results.json]

Uses the environment of ``bench.pods`` (a local registry with the standard test images and
one ``pycrid serve`` subprocess, whose private NRI socket is ``<base>/daemon/nri/nri.sock``)
and one pod. The plugins are small SDK plugins (``python -m bench.nri plugin --idx NN``,
indices 10..14), external processes dialling that socket; each subscribes to
CreateContainer only and adds one environment variable. Every round measures each phase
once, in a shuffled order, against the same daemon and pod: first the set of connected
plugins is brought to the phase's (plugins started and waited for until the daemon logs
them synchronized; surplus ones stopped and waited for until the daemon has closed their
connection), then one untimed CreateContainer + RemoveContainer warms the path up, then one
timed CreateContainer and an untimed RemoveContainer. Everything is cleaned up on exit,
including on Ctrl-C.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import re
import secrets
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.support.daemon import nri_paths
from tests.support.pods import container_config, pod_config

from bench.pods import (
    WORKER_ENV,
    Env,
    _sigterm,
    check_host,
    cri_env,
    supervise,
    timed,
)
from pycrid.nri import Adjustment, Plugin, api, run

PROG = "bench.nri"
PHASES = (0, 1, 5)
FIRST_IDX = 10
PLUGIN_NAME = "bench"
ENV_PREFIX = "BENCH_NRI_"


# ---------------------------------------------------------------------------
# The plugin (run as ``python -m bench.nri plugin --idx NN --socket PATH``)


class EnvAdder(Plugin):
    """Subscribes to CreateContainer only (the one handler overridden) and adds
    ``BENCH_NRI_<idx>=1`` to every container."""

    def __init__(self, idx: str) -> None:
        self.var = f"{ENV_PREFIX}{idx}"

    def create_container(self, pod: api.PodSandbox, container: api.Container) -> Adjustment:
        return Adjustment().add_env(self.var, "1")


def plugin_main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog=f"python -m {PROG} plugin")
    ap.add_argument("--idx", required=True, help="plugin index, two digits")
    ap.add_argument("--name", default=PLUGIN_NAME, help=f"plugin name (default {PLUGIN_NAME})")
    ap.add_argument("--socket", required=True, help="the runtime's NRI socket")
    args = ap.parse_args(argv)
    return run(EnvAdder(args.idx), name=args.name, idx=args.idx, socket_path=args.socket)


# ---------------------------------------------------------------------------
# Bringing the daemon to 0, 1 or 5 connected plugins


def daemon_side_connections(socket_path: str) -> int:
    """Open connections the daemon has accepted on its NRI socket: on Linux an accepted
    unix socket carries its listener's path in /proc/net/unix (the dialling end has none),
    and the entry goes away only once the daemon has closed its end."""
    n = 0
    with open("/proc/net/unix") as f:
        next(f)
        for line in f:
            parts = line.split()
            if len(parts) >= 8 and parts[7] == socket_path:
                n += 1
    return max(n - 1, 0)  # minus the listener


@dataclass
class Plugins:
    env: Env
    socket: str
    logs: Path
    running: dict[int, subprocess.Popen[bytes]] = field(default_factory=dict)

    def name(self, idx: int) -> str:
        return f"{idx}-{PLUGIN_NAME}"

    def set(self, n: int, timeout: float = 30) -> None:
        """Exactly plugins FIRST_IDX .. FIRST_IDX+n-1 connected and synchronized."""
        want = set(range(FIRST_IDX, FIRST_IDX + n))
        extra = [i for i in self.running if i not in want]
        if extra:
            self.stop(extra, timeout)
        missing = sorted(want - set(self.running))
        if missing:
            self.start(missing, timeout)

    def start(self, indices: list[int], timeout: float) -> None:
        log_path = self.env.daemon.log_path
        offset = os.path.getsize(log_path)
        for idx in indices:
            with open(self.logs / f"plugin-{idx}.log", "ab") as err:
                self.running[idx] = subprocess.Popen(
                    [sys.executable, "-m", PROG, "plugin", "--idx", str(idx),
                     "--socket", self.socket],
                    stdin=subprocess.DEVNULL, stdout=err, stderr=err)
        pending = {idx: re.compile(rf"NRI plugin {re.escape(self.name(idx))} synchronized")
                   for idx in indices}
        deadline = time.monotonic() + timeout
        while pending:
            with open(log_path, errors="replace") as f:
                f.seek(offset)
                text = f.read()
            for idx in [i for i, rx in pending.items() if rx.search(text)]:
                del pending[idx]
            for idx in pending:
                if self.running[idx].poll() is not None:
                    raise RuntimeError(f"plugin {self.name(idx)} exited with "
                                       f"{self.running[idx].returncode}:\n{self.tail(idx)}")
            if pending and time.monotonic() > deadline:
                raise RuntimeError(f"plugins {sorted(pending)} not synchronized after "
                                   f"{timeout}s:\n{self.env.daemon.log()[-3000:]}")
            if pending:
                time.sleep(0.01)

    def stop(self, indices: list[int], timeout: float = 30) -> None:
        for idx in indices:
            with contextlib.suppress(ProcessLookupError):
                self.running[idx].send_signal(signal.SIGTERM)
        for idx in indices:
            proc = self.running.pop(idx)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        want = len(self.running)
        deadline = time.monotonic() + timeout
        while daemon_side_connections(self.socket) > want:
            if time.monotonic() > deadline:
                raise RuntimeError(f"daemon still holds {daemon_side_connections(self.socket)}"
                                   f" NRI connections, expected {want}")
            time.sleep(0.005)

    def stop_all(self) -> None:
        with contextlib.suppress(Exception):
            self.stop(list(self.running), timeout=10)
        for proc in self.running.values():  # only if stop() failed half-way
            with contextlib.suppress(Exception):
                proc.kill()
                proc.wait()
        self.running.clear()

    def tail(self, idx: int) -> str:
        path = self.logs / f"plugin-{idx}.log"
        return path.read_text(errors="replace")[-2000:] if path.exists() else ""


# ---------------------------------------------------------------------------
# Measuring


@dataclass
class Bench:
    env: Env
    plugins: Plugins
    sid: str
    pod: Any
    n: int = 0
    checked: set[int] = field(default_factory=set)

    def create_remove(self, phase: int) -> float:
        """CreateContainer (timed) then RemoveContainer (untimed); milliseconds."""
        self.n += 1
        cfg = container_config(self.env.busybox, f"c{self.n}", command=["sleep", "3600"])
        ms, cid = timed(lambda: self.env.pods.create(self.sid, cfg, self.pod))
        try:
            if phase not in self.checked:
                self.check_env(cid, phase)
                self.checked.add(phase)
        finally:
            self.env.pods.remove(cid)
        return ms

    def check_env(self, cid: str, phase: int) -> None:
        """The plugins really adjusted the container: exactly the phase's variables."""
        info = self.env.pods.status(cid, verbose=True).info.get("info", "")
        found = sorted(set(re.findall(rf"{ENV_PREFIX}(\d+)=1", info)))
        want = [str(i) for i in range(FIRST_IDX, FIRST_IDX + phase)]
        if found != want:
            raise RuntimeError(f"{phase} plugin(s): container env has {ENV_PREFIX}{found}, "
                               f"expected {want}")

    def round(self, rng: random.Random, samples: dict[int, list[float]] | None) -> None:
        order = list(PHASES)
        rng.shuffle(order)
        for phase in order:
            self.plugins.set(phase)
            self.create_remove(phase)  # warm-up: a fresh plugin connection's first call
            ms = self.create_remove(phase)
            if samples is not None:
                samples[phase].append(ms)


def p90(vals: list[float]) -> float:
    if len(vals) < 2:
        return vals[0]
    return statistics.quantiles(vals, n=10, method="inclusive")[8]


def phase_key(n: int) -> str:
    return f"{n} plugin" + ("" if n == 1 else "s")


def summarize(samples: dict[int, list[float]]) -> dict[str, dict[str, float]]:
    base = statistics.median(samples[0])
    out = {}
    for n in PHASES:
        vals = samples[n]
        med = statistics.median(vals)
        out[phase_key(n)] = {"plugins": n, "median_ms": med, "p90_ms": p90(vals),
                             "min_ms": min(vals), "max_ms": max(vals), "n": len(vals),
                             "ratio_to_0": med / base if base > 0 else float("nan")}
    return out


def print_report(summary: dict[str, dict[str, float]], runs: int) -> None:
    print(f"\nCreateContainer, {runs} runs per phase (milliseconds)\n")
    print(f"{'phase':<12}{'median':>10}{'p90':>10}{'ratio':>10}")
    print("-" * 42)
    for name, s in summary.items():
        print(f"{name:<12}{s['median_ms']:>10.1f}{s['p90_ms']:>10.1f}"
              f"{s['ratio_to_0']:>9.2f}x")
    print("(ratio: median over the 0-plugin median)")


# ---------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["plugin"]:
        return plugin_main(argv[1:])
    if os.environ.get(WORKER_ENV) != "1":
        return supervise(argv, PROG)
    ap = argparse.ArgumentParser(prog=f"python -m {PROG}", description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=30, help="measured rounds (default 30)")
    ap.add_argument("--warmup", type=int, default=1, help="unmeasured rounds first (default 1)")
    ap.add_argument("--seed", type=int, default=0, help="phase-order shuffle seed (default 0)")
    ap.add_argument("--json", metavar="PATH", help="also write the results as JSON here")
    ap.add_argument("--keep", action="store_true", help="keep the temp dir (logs) on exit")
    args = ap.parse_args(argv)
    if args.runs < 1:
        ap.error("--runs must be at least 1")
    check_host(PROG)
    signal.signal(signal.SIGTERM, _sigterm)
    signal.signal(signal.SIGINT, signal.default_int_handler)  # even if started ignoring it

    base = Path(tempfile.mkdtemp(prefix="pycrid-bench-nri-"))
    samples: dict[int, list[float]] = {n: [] for n in PHASES}
    rng = random.Random(args.seed)
    t_start = time.monotonic()
    try:
        print("starting registry and pycrid ...", file=sys.stderr)
        with cri_env(base) as env:
            socket_path = nri_paths(str(base / "daemon"))["socket_path"]
            plugins = Plugins(env, socket_path, base)
            try:
                pod = pod_config("bench-nri-" + secrets.token_hex(4))
                bench = Bench(env, plugins, env.pods.run(pod), pod)
                for _ in range(args.warmup):
                    bench.round(rng, None)
                for i in range(args.runs):
                    bench.round(rng, samples)
                    print(f"\rround {i + 1}/{args.runs}", end="", file=sys.stderr, flush=True)
                print(file=sys.stderr)
            finally:
                plugins.stop_all()
    except KeyboardInterrupt:
        print("\ninterrupted; cleaned up", file=sys.stderr)
        return 130
    finally:
        if args.keep:
            print(f"kept {base}", file=sys.stderr)
        else:
            shutil.rmtree(base, ignore_errors=True)

    summary = summarize(samples)
    print_report(summary, args.runs)
    if args.json:
        result = {
            "runs": args.runs,
            "warmup": args.warmup,
            "seed": args.seed,
            "wall_seconds": round(time.monotonic() - t_start, 2),
            "host": {"cpus": os.cpu_count(), "kernel": os.uname().release},
            "phases": summary,
            "samples_ms": {phase_key(n): samples[n] for n in PHASES},
        }
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
        print(f"\nwrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
