"""CRI pod/container latency against plain runc, on this machine.

Run from the repository root as root::

    .venv/bin/python -m bench.pods [--runs 20] [--json results.json]

Starts the same local registry and ``pycrid serve`` subprocess the e2e tests use
(``tests.support``), then for each run times, in one loop so both see the same machine
state: RunPodSandbox, CreateContainer, StartContainer, StopContainer (timeout 0, a
``sleep 3600`` container) and RemoveContainer over CRI, and ``runc create`` +
``runc start`` of an equivalent busybox bundle. RunPodSandbox is timed twice per run:
a pod on the CNI test network (bridge + host-local + portmap, tests/support/network.py)
and a hostNetwork pod (no netns, no CNI), for the cost of pod networking. Everything
is cleaned up on exit, including on Ctrl-C.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import io
import json
import os
import secrets
import shutil
import signal
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cri_api.v1 import api_pb2 as pb
from tests.support.daemon import Daemon, running_daemon
from tests.support.images import TestImages, busybox_rootfs_tar, load_standard_set
from tests.support.network import ip_forward, remove_bridges, set_ip_forward
from tests.support.pods import Pods, container_config, daemon_config, pod_config
from tests.support.registry import LocalRegistry

from pycrid.oci.defaults import DEFAULT_PATH, default_spec

RUNC = shutil.which("runc") or "/usr/sbin/runc"
CGROUP_PARENT = "pycrid-bench"
CRI_OPS = ("RunPodSandbox", "RunPodSandbox hostNetwork", "CreateContainer", "StartContainer",
           "StopContainer", "RemoveContainer")
RUNC_OPS = ("runc create", "runc start", "runc create+start")


# ---------------------------------------------------------------------------
# Environment: registry + daemon, as tests/conftest.py and tests/e2e/test_pods.py set them up




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
    reg = LocalRegistry(base / "registry")
    forward = ip_forward()  # the bridge plugin turns forwarding on; put it back after
    try:
        reg.start()
        images = load_standard_set(reg)
        dbase = base / "daemon"
        with running_daemon(str(dbase), daemon_config(reg, images, base)) as daemon:
            pods = Pods(daemon.client)
            try:
                busybox = images.busybox.ref(reg)
                daemon.client.pull(busybox)
                daemon.client.pull(images.pause.ref(reg))
                yield Env(base, reg, images, daemon, pods, busybox)
            finally:
                remove_all_pods(pods)
    finally:
        reg.stop()
        remove_bridges()
        set_ip_forward(forward)


def remove_all_pods(pods: Pods, settle: float = 1.0, limit: float = 30.0) -> None:
    """Stop and remove every pod the daemon knows, until it has listed none for ``settle``
    seconds: a RunPodSandbox cut short by Ctrl-C may still be finishing in the daemon."""
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
            with contextlib.suppress(Exception):
                pods.stop_pod(sid)
            try:
                pods.remove_pod(sid)
            except Exception as e:
                print(f"warning: could not remove pod {sid}: {e}", file=sys.stderr)
            if sid in pods.pods:
                pods.pods.remove(sid)


# ---------------------------------------------------------------------------
# Plain runc baseline


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


def remove_cgroup_dirs() -> None:
    """rmdir /sys/fs/cgroup/*/pycrid-bench (and an empty leaf below it) if empty."""
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
# Measuring


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    t0 = time.perf_counter()
    out = fn()
    return (time.perf_counter() - t0) * 1000.0, out


def one_round(env: Env, runc: Runc, samples: dict[str, list[float]] | None) -> None:
    """One CRI lifecycle and one runc create/start/delete; ``samples=None`` is a warm-up."""
    def record(name: str, ms: float) -> None:
        if samples is not None:
            samples.setdefault(name, []).append(ms)

    pods = env.pods
    pod = pod_config("bench-" + secrets.token_hex(4))
    ms, sid = timed(lambda: pods.run(pod))
    record("RunPodSandbox", ms)
    cfg = container_config(env.busybox, "sleeper", command=["sleep", "3600"])
    ms, cid = timed(lambda: pods.create(sid, cfg, pod))
    record("CreateContainer", ms)
    ms, _ = timed(lambda: pods.start(cid))
    record("StartContainer", ms)
    ms, _ = timed(lambda: pods.stop(cid, timeout=0))
    record("StopContainer", ms)
    ms, _ = timed(lambda: pods.remove(cid))
    record("RemoveContainer", ms)
    ms, _ = timed(lambda: pods.stop_pod(sid))
    record("StopPodSandbox", ms)
    ms, _ = timed(lambda: pods.remove_pod(sid))
    record("RemovePodSandbox", ms)

    host_pod = pod_config("bench-host-" + secrets.token_hex(4), linux=pb.LinuxPodSandboxConfig(
        security_context=pb.LinuxSandboxSecurityContext(
            namespace_options=pb.NamespaceOption(network=pb.NODE))))
    ms, sid = timed(lambda: pods.run(host_pod))
    record("RunPodSandbox hostNetwork", ms)
    pods.stop_pod(sid)
    pods.remove_pod(sid)

    rid = "bench-" + secrets.token_hex(6)
    runc.config_for(rid)  # untimed, like writing a bundle is outside runc's clock
    ms_create, _ = timed(lambda: runc.create(rid))
    ms_start, _ = timed(lambda: runc.start(rid))
    record("runc create", ms_create)
    record("runc start", ms_start)
    record("runc create+start", ms_create + ms_start)
    ms, _ = timed(lambda: runc.delete(rid))
    record("runc delete --force", ms)


def summarize(samples: dict[str, list[float]]) -> dict[str, dict[str, float]]:
    out = {}
    for name, vals in samples.items():
        out[name] = {"median_ms": statistics.median(vals), "min_ms": min(vals),
                     "max_ms": max(vals), "n": len(vals)}
    # Per-run sums, so the ratio's numerator is a median of sums rather than a sum of medians.
    if "CreateContainer" in samples and "StartContainer" in samples:
        sums = [a + b for a, b in zip(samples["CreateContainer"], samples["StartContainer"],
                                      strict=True)]
        out["CreateContainer+StartContainer"] = {
            "median_ms": statistics.median(sums), "min_ms": min(sums), "max_ms": max(sums),
            "n": len(sums)}
    return out


def ratios(summary: dict[str, dict[str, float]]) -> list[tuple[str, str, float]]:
    def med(name: str) -> float:
        return summary[name]["median_ms"]

    pairs = [
        ("CreateContainer+StartContainer", "runc create+start"),
        ("CreateContainer", "runc create"),
        ("StartContainer", "runc start"),
        ("RunPodSandbox", "runc create+start"),
        ("RunPodSandbox", "RunPodSandbox hostNetwork"),
    ]
    return [(a, b, med(a) / med(b)) for a, b in pairs
            if a in summary and b in summary and med(b) > 0]


def print_report(summary: dict[str, dict[str, float]], runs: int) -> None:
    order = [*CRI_OPS, "CreateContainer+StartContainer", "StopPodSandbox", "RemovePodSandbox",
             *RUNC_OPS, "runc delete --force"]
    width = max(len(n) for n in order) + 2
    print(f"\n{runs} runs each (milliseconds)\n")
    print(f"{'operation':<{width}}{'median':>10}{'min':>10}{'max':>10}")
    print("-" * (width + 30))
    for name in order:
        if name not in summary:
            continue
        s = summary[name]
        print(f"{name:<{width}}{s['median_ms']:>10.1f}{s['min_ms']:>10.1f}{s['max_ms']:>10.1f}")
    print()
    for a, b, r in ratios(summary):
        print(f"{a} = {r:.1f}x {b}  (medians)")
    if "runc delete --force" in summary:
        print("(runc 1.1 delete --force polls the killed init every 100 ms, hence its ~100 ms;"
              " it is shown for reference, not compared)")


# ---------------------------------------------------------------------------


def check_host(prog: str = "bench.pods") -> None:
    if os.geteuid() != 0:
        sys.exit(f"{prog} needs root (it runs real containers)")
    for tool in (RUNC, "/usr/bin/conmon", "/usr/bin/docker-registry"):
        if not os.path.exists(tool):
            sys.exit(f"{prog} needs {tool}")


def _sigterm(_signum: int, _frame: Any) -> None:
    raise KeyboardInterrupt


WORKER_ENV = "PYCRID_BENCH_WORKER"


def supervise(argv: list[str], module: str = "bench.pods") -> int:
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


def main(argv: list[str] | None = None) -> int:
    if os.environ.get(WORKER_ENV) != "1":
        return supervise(sys.argv[1:] if argv is None else argv)
    ap = argparse.ArgumentParser(prog="python -m bench.pods", description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=20, help="measured runs (default 20)")
    ap.add_argument("--warmup", type=int, default=1, help="unmeasured runs first (default 1)")
    ap.add_argument("--json", metavar="PATH", help="also write the results as JSON here")
    ap.add_argument("--keep", action="store_true", help="keep the temp dir (logs) on exit")
    args = ap.parse_args(argv)
    check_host()
    signal.signal(signal.SIGTERM, _sigterm)
    signal.signal(signal.SIGINT, signal.default_int_handler)  # even if started ignoring it

    base = Path(tempfile.mkdtemp(prefix="pycrid-bench-"))
    samples: dict[str, list[float]] = {}
    runc = Runc(root=base / "runc", bundle=base / "bundle")
    t_start = time.monotonic()
    try:
        make_bundle(runc.bundle)
        runc.root.mkdir()
        print("starting registry and pycrid ...", file=sys.stderr)
        with cri_env(base) as env:
            try:
                for _ in range(args.warmup):
                    one_round(env, runc, None)
                for i in range(args.runs):
                    one_round(env, runc, samples)
                    print(f"\rrun {i + 1}/{args.runs}", end="", file=sys.stderr, flush=True)
                print(file=sys.stderr)
            finally:
                runc.cleanup()
    except KeyboardInterrupt:
        print("\ninterrupted; cleaned up", file=sys.stderr)
        return 130
    finally:
        runc.cleanup()
        remove_cgroup_dirs()
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
            "wall_seconds": round(time.monotonic() - t_start, 2),
            "host": {"cpus": os.cpu_count(), "kernel": os.uname().release,
                     "runc": subprocess.run([RUNC, "--version"], capture_output=True,
                                            text=True, check=False).stdout.split("\n")[0]},
            "summary": summary,
            "ratios": {f"{a} / {b}": r for a, b, r in ratios(summary)},
            "samples_ms": copy.deepcopy(samples),
        }
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
        print(f"\nwrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
