"""kill -9 under concurrency, at length: the crash storm of tests/fault/test_crash_storm.py
run again and again, with a summary; exits 1 on any disagreement, error or leftover.

Run from the repository root as root::

    .venv/bin/python -m bench.crashes [--runs 10] [--kills 15] [--workers 8] [--seed 0]
                                      [--pycrid-src DIR] [--keep] [--json PATH]

Each run is a fresh daemon base dir (root, state, log) with ``--workers`` clients looping
pod and container lifecycles while the daemon is SIGKILLed ``--kills`` times at random
moments (0.5 to 3 s apart; half of the kills strike within 10 ms of a call of a randomly
chosen operation being under way; a quarter of the restarts are SIGKILLed once more while
they recover) and restarted on the same root; the first lists after every restart are
judged by the rules in the test's docstring. One local registry with the standard test
images serves every run. See bench/README.md for the table and the JSON.
"""

from __future__ import annotations

import argparse
import collections
import functools
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from tests.support.crashes import Report, Storm
from tests.support.pods import daemon_config

from bench.common import arm_signals, check_host, is_worker, registry_env, supervise
from pycrid.bench.scratch import interruptible, run_dir

PROG = "bench.crashes"


def progress(run: int, message: str) -> None:
    print(f"run {run}: {message}", file=sys.stderr)


def print_summary(reports: list[Report], wall: float) -> None:
    counts: collections.Counter[str] = collections.Counter()
    for r in reports:
        counts.update(r.counts)
    print(f"\n{len(reports)} runs, {sum(r.kills for r in reports)} kills (and "
          f"{sum(r.recovery_kills for r in reports)} more during recovery), "
          f"{wall:.0f} s wall\n")
    print(f"{'run':>4}{'kills':>7}{'ops':>7}{'in flight':>11}{'adopted':>9}"
          f"{'disagree':>10}{'errors':>8}{'left':>6}{'orphans':>9}{'seconds':>9}")
    for i, r in enumerate(reports, 1):
        print(f"{i:>4}{r.kills:>7}{r.operations:>7}{r.in_flight:>11}{r.adopted:>9}"
              f"{len(r.disagreements):>10}{len(r.errors):>8}{len(r.leftovers):>6}"
              f"{r.orphans:>9}{r.seconds:>9.1f}")
    print("\noperations (all runs)")
    ops = sorted({k.rsplit(" ", 1)[0].removesuffix(" in") for k in counts})
    print(f"  {'':<18}{'ok':>8}{'in flight':>11}{'failed':>8}")
    for op in ops:
        print(f"  {op:<18}{counts[f'{op} ok']:>8}{counts[f'{op} in flight']:>11}"
              f"{counts[f'{op} failed']:>8}")


def as_json(reports: list[Report], wall: float) -> dict[str, Any]:
    return {"wall_seconds": round(wall, 1), "runs": [
        {"kills": r.kills, "recovery_kills": r.recovery_kills, "operations": r.operations,
         "in_flight": r.in_flight, "adopted": r.adopted, "orphans": r.orphans,
         "seconds": round(r.seconds, 1),
         "counts": dict(r.counts),
         "disagreements": r.disagreements, "errors": r.errors, "leftovers": r.leftovers}
        for r in reports]}


@interruptible
def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not is_worker():
        return supervise(argv, PROG)
    ap = argparse.ArgumentParser(prog=f"python -m {PROG}", description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=10, help="storms, each on a fresh root")
    ap.add_argument("--kills", type=int, default=15, help="SIGKILLs of the daemon per run")
    ap.add_argument("--workers", type=int, default=8, help="concurrent clients")
    ap.add_argument("--seed", type=int, default=0, help="seed of run 1 (run i: seed + i - 1)")
    ap.add_argument("--pycrid-src", metavar="DIR", default="",
                    help="run the pycrid package of another checkout's src dir instead")
    ap.add_argument("--json", metavar="PATH", help="also write the results as JSON here")
    ap.add_argument("--keep", action="store_true", help="keep the temp dir (logs) on exit")
    args = ap.parse_args(argv)
    if min(args.runs, args.kills, args.workers) < 1:
        ap.error("--runs, --kills and --workers must be at least 1")
    check_host(PROG)
    arm_signals()
    env = {"PYTHONPATH": os.path.abspath(args.pycrid_src)} if args.pycrid_src else None
    started = time.monotonic()
    reports: list[Report] = []
    with run_dir("pycrid-bench-crashes-", args.keep) as base:
        with registry_env(base) as (reg, images):
            for i in range(args.runs):
                run_base = base / f"run{i + 1}"
                storm = Storm(str(run_base), daemon_config(reg, images, run_base),
                              (images.pause.ref(reg), images.busybox.ref(reg)),
                              workers=args.workers, kills=args.kills, seed=args.seed + i,
                              env=env,
                              log=functools.partial(progress, i + 1))
                report = storm.run()
                reports.append(report)
                for line in report.disagreements + report.errors + report.leftovers:
                    print(f"run {i + 1}: {line}", file=sys.stderr)
    wall = time.monotonic() - started
    print_summary(reports, wall)
    if args.json:
        Path(args.json).write_text(json.dumps(as_json(reports, wall), indent=2) + "\n")
    bad = sum(not r.clean for r in reports)
    print(f"\n{bad} of {len(reports)} runs with a disagreement, an error or a leftover"
          if bad else "\nevery run clean")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
