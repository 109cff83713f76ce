"""ListContainers and ListPodSandbox latency with 100, 500, 1000... containers present,
beside a Version call (a CRI round trip that does no work) timed in the same loop.

The counts are reached with containers that ran ``true`` and exited, spread over the
pods of the rss section, so a thousand containers need no thousand live monitors."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from itertools import cycle
from typing import Any

from cri_api.v1 import api_pb2 as pb

from pycrid.bench.cri import container_config
from pycrid.bench.report import Section
from pycrid.bench.rss import WORKERS, Fleet
from pycrid.bench.target import Target
from pycrid.bench.timing import timed

CALLS = 20


def add_exited(target: Target, fleet: Fleet, n: int, serial: int) -> None:
    """``n`` more containers running ``true``, round-robin over the fleet's pods, each
    waited for until EXITED."""
    def one(job: tuple[int, tuple[str, Any]]) -> None:
        i, (sid, pod) = job
        cfg = container_config(target.image, f"true-{i:05d}", ["true"])
        cid = target.pods.run_container(sid, cfg, pod)
        target.pods.wait_state(cid, pb.CONTAINER_EXITED, timeout=60)

    jobs = list(zip(range(serial, serial + n), cycle(fleet.pods), strict=False))
    with ThreadPoolExecutor(WORKERS) as pool:
        for done, _ in enumerate(pool.map(one, jobs), 1):
            if done % 10 == 0 or done == n:
                print(f"\rexited containers {done}/{n}", end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)


def run(target: Target, fleet: Fleet, sizes: list[int], calls: int = CALLS) -> Section:
    """The container counts are the runtime's: on a node with pods of its own, a size below
    what it already has is skipped (with a note)."""
    sec = Section("list")
    rt = target.rt
    present = len(rt.ListContainers(pb.ListContainersRequest(), timeout=60).containers)
    made = 0
    buildup: dict[str, float] = {}
    for size in sorted(sizes):
        if size < present:
            sec.notes.append(f"{size} containers asked, {present} already present: skipped")
            continue
        t0 = time.monotonic()
        add_exited(target, fleet, size - present, made)
        buildup[str(size)] = round(time.monotonic() - t0, 2)
        made += size - present
        listed = rt.ListContainers(pb.ListContainersRequest(), timeout=60).containers
        if len(listed) != size:
            raise RuntimeError(f"ListContainers shows {len(listed)} containers, expected {size}")
        present = size
        n_pods = len(rt.ListPodSandbox(pb.ListPodSandboxRequest(), timeout=60).items)
        samples: dict[str, list[float]] = {"c": [], "p": [], "v": []}
        calls_of: dict[str, Callable[[], object]] = {
            "c": lambda: rt.ListContainers(pb.ListContainersRequest(), timeout=60),
            "p": lambda: rt.ListPodSandbox(pb.ListPodSandboxRequest(), timeout=60),
            "v": lambda: rt.Version(pb.VersionRequest(), timeout=60),
        }
        for fn in calls_of.values():  # warm-up
            fn()
        for i in range(calls):
            keys = ["c", "p", "v"]
            for k in keys[i % 3:] + keys[:i % 3]:  # rotating order
                ms, _ = timed(calls_of[k])
                samples[k].append(ms)
        floor = f"Version ({size} containers)"
        sec.floor(floor, samples["v"])
        sec.figure(f"ListContainers ({size} containers)", samples["c"], floor=floor)
        sec.figure(f"ListPodSandbox ({n_pods} pods, {size} containers)", samples["p"],
                   floor=floor)
    if not sec.figures:
        sec.skipped = (f"every size in {sorted(sizes)} is below the {present} containers "
                       f"already present")
    sec.extra.update(calls=calls, buildup_seconds=buildup, exited_containers=made,
                     pods=len(fleet.pods))
    sec.notes.append(f"containers beyond the {len(fleet.pods)} sleepers ran `true` and exited "
                     f"({made} of them, {WORKERS} creates in flight); build-up seconds per "
                     f"size: {buildup}")
    return sec
