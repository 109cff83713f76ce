"""CheckpointContainer and a restore of a small container, each beside a floor timed in the
same round.

Run from the repository root as root::

    .venv/bin/python -m bench.checkpoint [--rounds 10] [--criu PATH] [--json results.json]

Uses the environment of ``python -m bench`` (a local registry with the standard test
images, ``pycrid serve`` configured as the e2e tests configure it), with ``criu_path`` set
to ``--criu`` (default: ``../shared/interop/bin/criu``, else ``criu`` on the PATH; it must
pass ``criu check``). Every round, in a fresh pod of the kubelet's kind, a busybox
``sh`` that counts in memory and writes one file is checkpointed twice, in alternating
order:

- ``CheckpointContainer`` to an archive (what a client waits for: freeze, CRIU's dump,
  the writable layer's diff and the log, thaw, metadata, the tar written and renamed);
- the floor: what runc and CRIU do of that, straight on the daemon's runc root: ``runc
  pause``, ``runc checkpoint --leave-running --file-locks`` into a scratch directory,
  ``runc resume`` (so the ratio is what pycrid adds: the diff, the metadata, the tar, the
  call). CRIU is quicker with the cgroup frozen beforehand than when it freezes the
  container itself, so the floor includes the pause.

Then the archive is restored in a new pod (``CreateContainer`` from it plus
``StartContainer``: unpack, rootfs changes, log, ``runc restore`` under conmon), beside
the floor: ``CreateContainer`` + ``StartContainer`` of the same image and command in
another new pod (a plain start). The archive's size and CRIU's own freeze time (from its
``stats-dump``, read by checkpointctl) are reported too. Pods are removed untimed.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tarfile
import time
from pathlib import Path
from typing import Any

from cri_api.v1 import api_pb2 as pb
from tests.support import interop
from tests.support.daemon import Daemon, running_daemon
from tests.support.pods import daemon_config, leftovers

from bench.common import (
    RUNC,
    Pods,
    arm_signals,
    check_host,
    is_worker,
    p90,
    registry_env,
    remove_all_pods,
    supervise,
    timed,
)
from pycrid.bench.cri import container_config, pod_config
from pycrid.bench.scratch import interruptible, run_dir, said_left_behind

PROG = "bench.checkpoint"
COUNTER = ["sh", "-c", "echo data > /written; i=0; "
           "while true; do i=$((i+1)); echo $i > /tmp/count; sleep 0.2; done"]
#: figure -> its floor; the table's order.
RAW = "runc pause+checkpoint+resume"
FIGURES = {
    "CheckpointContainer": RAW,
    "restore: CreateContainer+StartContainer": "CreateContainer+StartContainer",
    "restore: CreateContainer": None,
    "restore: StartContainer": None,
}
FLOORS = (RAW, "CreateContainer+StartContainer")


def default_criu() -> str:
    found = interop.binary("criu")
    return str(found) if found else (shutil.which("criu") or "")


class Bench:
    def __init__(self, daemon: Daemon, busybox: str, base: Path, criu: str) -> None:
        self.daemon, self.busybox, self.base = daemon, busybox, base
        self.pods = Pods(daemon.client.runtime)
        self.samples: dict[str, list[float]] = {}
        self.sizes: list[int] = []
        self.frozen_us: list[float] = []
        self.criu_dir = base / "criu-bin"
        self.criu_dir.mkdir(exist_ok=True)
        (self.criu_dir / "criu").symlink_to(criu)

    def add(self, name: str, ms: float) -> None:
        self.samples.setdefault(name, []).append(ms)

    def _pod(self, tag: str) -> tuple[str, Any]:
        pod = pod_config(f"ckpt-{tag}")
        return self.pods.run(pod), pod

    def _running_counter(self, tag: str) -> str:
        sid, pod = self._pod(tag)
        cid = self.pods.run_container(sid, container_config(self.busybox, "counter", COUNTER),
                                      pod)
        deadline = time.monotonic() + 30
        while self.pods.rt.ExecSync(pb.ExecSyncRequest(
                container_id=cid, cmd=["test", "-s", "/tmp/count"], timeout=10),
                timeout=30).exit_code != 0:
            if time.monotonic() > deadline:
                raise RuntimeError("the counter did not start counting")
            time.sleep(0.05)
        return cid

    def _checkpoint(self, cid: str, archive: Path) -> None:
        self.pods.rt.CheckpointContainer(pb.CheckpointContainerRequest(
            container_id=cid, location=str(archive)), timeout=120)

    def _raw_checkpoint(self, cid: str, out: Path) -> None:
        env = {"PATH": f"{self.criu_dir}:/usr/sbin:/usr/bin:/sbin:/bin"}
        runc = [RUNC, f"--root={self.daemon.state}/runc"]

        def run(*args: str) -> None:
            subprocess.run([*runc, *args], env=env, check=True, capture_output=True,
                           timeout=120)

        run("pause", cid)
        try:
            run("checkpoint", "--leave-running", "--file-locks", "--image-path",
                str(out / "images"), "--work-path", str(out / "work"), cid)
        finally:
            run("resume", cid)

    def round(self, i: int, record: bool) -> None:
        add = self.add if record else (lambda name, ms: None)
        cid = self._running_counter(f"src-{i}")
        archive = self.base / f"round-{i}.tar"
        raw = self.base / f"raw-{i}"
        steps = [("CheckpointContainer", lambda: self._checkpoint(cid, archive)),
                 (RAW, lambda: self._raw_checkpoint(cid, raw))]
        for name, fn in (steps if i % 2 == 0 else steps[::-1]):
            add(name, timed(fn)[0])
        if record:
            self.sizes.append(archive.stat().st_size)
            with tarfile.open(archive) as tf:
                f = tf.extractfile("stats-dump")
                self.frozen_us.append(float(_frozen_time(f.read() if f else b"")))

        def restore() -> tuple[float, float]:
            sid, pod = self._pod(f"dst-{i}")
            cfg = pb.ContainerConfig(metadata=pb.ContainerMetadata(name="counter"),
                                     image=pb.ImageSpec(image=str(archive)))
            cfg.linux.security_context.namespace_options.pid = pb.CONTAINER
            create, rid = timed(lambda: self.pods.create(sid, cfg, pod))
            start, _ = timed(lambda: self.pods.start(rid))
            return create, start

        def plain() -> float:
            sid, pod = self._pod(f"plain-{i}")
            cfg = container_config(self.busybox, "counter", COUNTER)
            return timed(lambda: self.pods.run_container(sid, cfg, pod))[0]

        if i % 2 == 0:
            create, start = restore()
            plain_ms = plain()
        else:
            plain_ms = plain()
            create, start = restore()
        add("restore: CreateContainer", create)
        add("restore: StartContainer", start)
        add("restore: CreateContainer+StartContainer", create + start)
        add("CreateContainer+StartContainer", plain_ms)
        remove_all_pods(self.pods, settle=0.0)
        archive.unlink()
        shutil.rmtree(raw, ignore_errors=True)


def _frozen_time(stats_dump: bytes) -> int:
    """CRIU's ``frozen_time`` (microseconds the processes were frozen for the dump) from
    its ``stats-dump`` image: a protobuf whose ``dump`` message has it as field 2."""
    # stats-dump: magics (2 x u32), then a u32 size and the StatsEntry message.
    size = int.from_bytes(stats_dump[8:12], "little")
    fields = _proto_fields(stats_dump[12:12 + size])
    dump = fields.get(1)
    return _proto_fields(dump).get(2, 0) if isinstance(dump, bytes) else 0


def _proto_fields(data: bytes) -> dict[int, Any]:
    out: dict[int, Any] = {}
    i = 0
    while i < len(data):
        key, i = _varint(data, i)
        number, kind = key >> 3, key & 7
        if kind == 0:
            out[number], i = _varint(data, i)
        elif kind == 2:
            size, i = _varint(data, i)
            out[number], i = data[i:i + size], i + size
        elif kind == 1:
            i += 8
        elif kind == 5:
            i += 4
        else:
            break
    return out


def _varint(data: bytes, i: int) -> tuple[int, int]:
    shift = value = 0
    while i < len(data):
        b = data[i]
        i += 1
        value |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            break
    return value, i


def summary(vals: list[float]) -> dict[str, Any]:
    return {"median_ms": statistics.median(vals), "p90_ms": p90(vals), "min_ms": min(vals),
            "max_ms": max(vals), "n": len(vals)}


@interruptible
def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not is_worker():
        return supervise(argv, PROG)
    ap = argparse.ArgumentParser(prog=f"python -m {PROG}", description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=10, help="measured rounds (default 10)")
    ap.add_argument("--criu", default=default_criu(),
                    help="the CRIU to use (default: ../shared/interop/bin/criu, else criu)")
    ap.add_argument("--json", metavar="PATH", help="also write the results as JSON here")
    ap.add_argument("--keep", action="store_true", help="keep the temp dir (logs) on exit")
    args = ap.parse_args(argv)
    if args.rounds < 1:
        ap.error("--rounds must be at least 1")
    if not args.criu or not os.access(args.criu, os.X_OK):
        ap.error("no CRIU: pass --criu PATH (one that passes `criu check`)")
    check_host(PROG)
    arm_signals()
    left: list[str] = []
    with run_dir("pycrid-bench-ckpt-", args.keep) as base:
        with registry_env(base) as (reg, images):
            config = daemon_config(reg, images, base) + (
                f'[plugins."pycrid.cri.v1.runtime"]\ncriu_path = "{args.criu}"\n')
            with running_daemon(str(base / "daemon"), config, "--log-level", "info") as d:
                try:
                    busybox = images.busybox.ref(reg)
                    d.client.pull(busybox)
                    info = json.loads(d.client.runtime.Status(
                        pb.StatusRequest(verbose=True), timeout=30).info["checkpoint"])
                    if info["criu_error"]:
                        print(f"{PROG}: {info['criu_error']}", file=sys.stderr)
                        return 1
                    bench = Bench(d, busybox, base, args.criu)
                    bench.round(-1, record=False)  # warm-up
                    for i in range(args.rounds):
                        bench.round(i, record=True)
                        print(f"\rround {i + 1}/{args.rounds}", end="", file=sys.stderr,
                              flush=True)
                    print(file=sys.stderr)
                finally:
                    remove_all_pods(Pods(d.client.runtime))
            left = leftovers(str(base / "daemon" / "root"), str(base / "daemon" / "state"))
    if said_left_behind(left):
        return 1
    floors = {name: summary(bench.samples[name]) for name in FLOORS}
    figures = {}
    for name, floor in FIGURES.items():
        fig = summary(bench.samples[name])
        fig["floor"] = floor
        fig["ratio"] = (fig["median_ms"] / floors[floor]["median_ms"]) if floor else None
        figures[name] = fig
    size = statistics.median(bench.sizes)
    frozen = statistics.median(bench.frozen_us) / 1000
    width = max(map(len, [*FIGURES, *FLOORS])) + 2
    print(f"\ncheckpoint and restore of a busybox sh, {args.rounds} rounds, CRIU "
          f"{info['criu_version']}\n")
    print(f"{'figure':<{width}}{'median':>10}{'p90':>10}{'floor':>10}{'ratio':>8}")
    for name, fig in figures.items():
        fl = floors[fig["floor"]]["median_ms"] if fig["floor"] else None
        floor_text = "" if fl is None else f"{fl:.1f}"
        ratio_text = "" if fig["ratio"] is None else f"{fig['ratio']:.2f}x"
        print(f"{name:<{width}}{fig['median_ms']:>10.1f}{fig['p90_ms']:>10.1f}"
              f"{floor_text:>10}{ratio_text:>8}")
    for name, fl in floors.items():
        print(f"{'floor: ' + name:<{width}}{fl['median_ms']:>10.1f}{fl['p90_ms']:>10.1f}")
    print(f"\narchive size (median): {size / 1024:.1f} KiB; "
          f"CRIU's frozen time (median): {frozen:.1f} ms")
    if args.json:
        Path(args.json).write_text(json.dumps({
            "schema": "pycrid-bench-checkpoint/1", "rounds": args.rounds,
            "criu": {"path": args.criu, "version": info["criu_version"]},
            "figures": figures, "floors": floors, "samples_ms": bench.samples,
            "archive_bytes": bench.sizes, "criu_frozen_ms": [f / 1000 for f in
                                                             bench.frozen_us],
        }, indent=2) + "\n")
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
