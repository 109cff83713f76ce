"""CreateContainer latency with 0, 1, 5... NRI plugins subscribed to CreateContainer.

The plugins are small SDK plugins run as external processes that dial the runtime's NRI
socket (``python -m pycrid.bench.nri_load plugin --idx NN --socket PATH --ready FILE --pod-uid
UID``); each adds ``BENCH_NRI_<idx>=1`` to the containers of the benchmark's own pod (no
other container on the node is changed) and touches FILE once synchronized, so the
benchmark needs nothing from the runtime's log and works against any NRI runtime.
"""

from __future__ import annotations

import argparse
import contextlib
import random
import re
import secrets
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pycrid.bench.cri import container_config, pod_config
from pycrid.bench.procs import accepted_connections
from pycrid.bench.report import Section
from pycrid.bench.target import Target
from pycrid.bench.timing import timed
from pycrid.nri import Adjustment, Plugin, api
from pycrid.nri import run as run_plugin

PROG = "pycrid.bench.nri_load"
FIRST_IDX = 10
PLUGIN_NAME = "bench"
ENV_PREFIX = "BENCH_NRI_"
WARMUP_TRIES = 50


# ---------------------------------------------------------------------------
# The plugin


class EnvAdder(Plugin):
    """Subscribes to CreateContainer only (the one handler overridden) and adds
    ``BENCH_NRI_<idx>=1`` to every container of the pod whose uid is ``pod_uid``."""

    def __init__(self, idx: str, ready: str, pod_uid: str) -> None:
        self.var = f"{ENV_PREFIX}{idx}"
        self.ready = ready
        self.pod_uid = pod_uid

    def synchronize(self, pods: list[api.PodSandbox], containers: list[api.Container]) -> None:
        Path(self.ready).touch()

    def create_container(self, pod: api.PodSandbox, container: api.Container) -> Adjustment:
        if pod.uid != self.pod_uid:
            return Adjustment()
        return Adjustment().add_env(self.var, "1")


def plugin_main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog=f"python -m {PROG} plugin")
    ap.add_argument("--idx", required=True, help="plugin index, two digits")
    ap.add_argument("--socket", required=True, help="the runtime's NRI socket")
    ap.add_argument("--ready", required=True, help="file touched once synchronized")
    ap.add_argument("--pod-uid", required=True, help="only this pod's containers are adjusted")
    args = ap.parse_args(argv)
    return run_plugin(EnvAdder(args.idx, args.ready, args.pod_uid), name=PLUGIN_NAME,
                      idx=args.idx, socket_path=args.socket)


# ---------------------------------------------------------------------------
# Bringing the runtime to N connected plugins


@dataclass
class Plugins:
    """The run's plugin processes; ``baseline`` is the connections the runtime held on its
    NRI socket before (other plugins of the node's)."""

    socket: str
    dir: Path
    pod_uid: str
    baseline: int = 0
    running: dict[int, subprocess.Popen[bytes]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.baseline = accepted_connections(self.socket)

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
        for idx in indices:
            ready = self.dir / f"plugin-{idx}.ready"
            ready.unlink(missing_ok=True)
            with open(self.dir / f"plugin-{idx}.log", "ab") as err:
                self.running[idx] = subprocess.Popen(
                    [sys.executable, "-m", PROG, "plugin", "--idx", str(idx),
                     "--socket", self.socket, "--ready", str(ready),
                     "--pod-uid", self.pod_uid],
                    stdin=subprocess.DEVNULL, stdout=err, stderr=err)
        deadline = time.monotonic() + timeout
        pending = set(indices)
        while pending:
            pending = {i for i in pending if not (self.dir / f"plugin-{i}.ready").exists()}
            for idx in pending:
                if self.running[idx].poll() is not None:
                    raise RuntimeError(f"NRI plugin {idx} exited with "
                                       f"{self.running[idx].returncode}:\n{self.tail(idx)}")
            if pending and time.monotonic() > deadline:
                raise RuntimeError(f"NRI plugins {sorted(pending)} not synchronized after "
                                   f"{timeout}s")
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
        want = self.baseline + len(self.running)
        deadline = time.monotonic() + timeout
        while (held := accepted_connections(self.socket)) > want:
            if time.monotonic() > deadline:
                raise RuntimeError(f"runtime still holds {held} NRI connections, expected "
                                   f"{want}")
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
        path = self.dir / f"plugin-{idx}.log"
        return path.read_text(errors="replace")[-2000:] if path.exists() else ""


# ---------------------------------------------------------------------------
# Measuring


@dataclass
class Bench:
    target: Target
    plugins: Plugins
    sid: str
    pod: Any
    n: int = 0

    def create_remove(self) -> tuple[float, str]:
        """CreateContainer (timed) then RemoveContainer (untimed): milliseconds and the
        BENCH_NRI_ indices the container got."""
        self.n += 1
        cfg = container_config(self.target.image, f"c{self.n}", ["sleep", "3600"])
        pods = self.target.pods
        ms, cid = timed(lambda: pods.create(self.sid, cfg, self.pod))
        try:
            info = pods.status(cid, verbose=True).info.get("info", "")
        finally:
            pods.remove(cid)
        return ms, ",".join(sorted(set(re.findall(rf"{ENV_PREFIX}(\d+)=1", info))))

    def warm(self, phase: int) -> None:
        """Untimed creates until a container carries exactly this phase's variables: the
        plugins' adjustments really apply (and a fresh connection's first call is done)."""
        want = ",".join(str(i) for i in range(FIRST_IDX, FIRST_IDX + phase))
        got = ""
        for _ in range(WARMUP_TRIES):
            _, got = self.create_remove()
            if got == want:
                return
            time.sleep(0.05)
        raise RuntimeError(f"{phase} plugin(s): container env has {ENV_PREFIX}[{got}], "
                           f"expected [{want}]")

    def round(self, phases: list[int], rng: random.Random,
              samples: dict[int, list[float]] | None) -> None:
        order = list(phases)
        rng.shuffle(order)
        for phase in order:
            self.plugins.set(phase)
            self.warm(phase)
            ms, _ = self.create_remove()
            if samples is not None:
                samples[phase].append(ms)


def phase_name(n: int) -> str:
    return f"CreateContainer, {n} NRI plugin" + ("" if n == 1 else "s")


def run(target: Target, phases: list[int], rounds: int, seed: int = 0,
        warmup: int = 1) -> Section:
    """Each round measures every phase once, in a shuffled order, so drift cancels out."""
    sec = Section("nri")
    phases = sorted({0, *phases})
    if target.nri_socket is None:
        sec.skipped = "no NRI socket for this runtime (give --nri-socket PATH)"
        return sec
    if len(phases) < 2:
        sec.skipped = "no plugin count but 0 asked (--nri-plugins)"
        return sec
    samples: dict[int, list[float]] = {n: [] for n in phases}
    rng = random.Random(seed)
    pod = pod_config("bench-nri-" + secrets.token_hex(4))
    plugins = Plugins(target.nri_socket, target.base, pod.metadata.uid)
    sid = target.pods.run(pod)
    try:
        bench = Bench(target, plugins, sid, pod)
        for _ in range(warmup):
            bench.round(phases, rng, None)
        for i in range(rounds):
            bench.round(phases, rng, samples)
            print(f"\rnri {i + 1}/{rounds}", end="", file=sys.stderr, flush=True)
        print(file=sys.stderr)
    finally:
        plugins.stop_all()
        target.pods.discard(sid)
    sec.floor(phase_name(0), samples[0])
    for n in phases[1:]:
        sec.figure(phase_name(n), samples[n], floor=phase_name(0))
    sec.extra.update(rounds=rounds, seed=seed, plugins=phases, socket=target.nri_socket)
    sec.notes.append("the plugins are pycrid.nri SDK processes subscribed to CreateContainer, "
                     "each adding one variable to the containers of the benchmark's pod only")
    return sec


if __name__ == "__main__":
    if sys.argv[1:2] != ["plugin"]:
        sys.exit("usage: python -m pycrid.bench.nri_load plugin --idx NN --socket PATH "
                 "--ready FILE --pod-uid UID (the benchmark itself is `pycrid bench`)")
    sys.exit(plugin_main(sys.argv[2:]))
