"""The issue-10 benchmark of a CRI runtime: lifecycle, NRI, pull, memory and list latency,
and partial pulls, each figure beside a floor measured in the same run. The sections but
pull and partial are ``pycrid.bench``'s (also installed as ``pycrid bench``); this adds
the test registry, a pycrid of its own and the pull and partial sections.

Run from the repository root as root::

    .venv/bin/python -m bench [--json PATH] [--sections lifecycle,nri,pull,rss,list,partial]
                              [--endpoint unix:///run/containerd/containerd.sock]

Without ``--endpoint`` a ``pycrid serve`` from this checkout is started on a temporary
base dir; with it, the runtime at that socket is measured and nothing is started but the
local registry the images come from. See bench/README.md for every option and the JSON.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from cri_api.v1 import api_pb2 as pb
from tests.support.daemon import CRIClient, nri_paths
from tests.support.pods import leftovers
from tests.support.registry import LocalRegistry

from bench import partial, pull
from bench.common import (
    RUNC,
    HostSnapshot,
    Pods,
    Target,
    arm_signals,
    check_host,
    host_info,
    is_worker,
    pycrid_daemon,
    registry_env,
    supervise,
    wait_gone,
)
from bench.pull_kinds import KIND_NAMES, kind_list
from bench.report import SECTIONS, Section, table
from pycrid.bench import rss
from pycrid.bench.command import int_list, section_list
from pycrid.bench.listing import CALLS
from pycrid.bench.procs import socket_owner
from pycrid.bench.scratch import interruptible, run_dir, said_left_behind
from pycrid.bench.sections import Plan, run_sections

PROG = "bench"


def parse(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog=f"python -m {PROG}", description=__doc__.split("\n")[0])
    ap.add_argument("--json", metavar="PATH", help="also write every result as JSON here")
    ap.add_argument("--sections", type=section_list(SECTIONS), default=list(SECTIONS),
                    help=f"comma-separated subset of {','.join(SECTIONS)} (default all)")
    ap.add_argument("--iterations", type=int, default=30,
                    help="lifecycle rounds and NRI rounds (default 30)")
    ap.add_argument("--runtime-handler", metavar="NAME", default="",
                    help="also time this handler's pod start (e.g. runsc) beside the "
                         "default handler's, in the lifecycle section")
    ap.add_argument("--nri-plugins", type=int_list, default=[0, 1, 5],
                    help="plugin counts to compare; 0 is always added (default 0,1,5)")
    ap.add_argument("--pull-mb", type=int, default=50, help="image size, MiB (default 50)")
    ap.add_argument("--pull-layers", type=int, default=5, help="image layers (default 5)")
    ap.add_argument("--pull-rounds", type=int, default=5, help="pulls timed (default 5)")
    ap.add_argument("--pull-kinds", type=kind_list, default=list(KIND_NAMES),
                    help=f"layer kinds pulled, a comma-separated subset of "
                         f"{','.join(KIND_NAMES)} (default all)")
    ap.add_argument("--pull-against", metavar="unix:///PATH", default="",
                    help="another CRI runtime (containerd) that pulls the same images in the "
                         "same rounds (pull and partial sections); each PullImage is shown "
                         "against its pull")
    ap.add_argument("--partial-mb", type=int, default=100,
                    help="partial: size of v1 and v2, MiB uncompressed (default 100)")
    ap.add_argument("--partial-layers", type=int, default=5,
                    help="partial: their layers (default 5)")
    ap.add_argument("--partial-files", type=int, default=1000,
                    help="partial: files per layer (default 1000)")
    ap.add_argument("--partial-rounds", type=int, default=3,
                    help="partial: rounds (default 3)")
    ap.add_argument("--partial-link-mbit", type=float, default=0,
                    help="partial: pull through a link of this many Mbit/s (a throttling "
                         "proxy in front of the registry; default 0: loopback, unlimited)")
    ap.add_argument("--rss-pods", type=int, default=100,
                    help="running pods for the rss and list sections (default 100)")
    ap.add_argument("--list-sizes", type=int_list, default=[100, 500, 1000],
                    help="container counts the list calls are timed at (default 100,500,1000)")
    ap.add_argument("--list-calls", type=int, default=CALLS,
                    help=f"calls timed per list size and kind (default {CALLS})")
    ap.add_argument("--endpoint", metavar="unix:///PATH",
                    help="measure the CRI runtime at this socket instead of starting pycrid")
    ap.add_argument("--pycrid-src", metavar="DIR", default="",
                    help="run the pycrid package under DIR (another checkout's src/, e.g. a "
                         "`git worktree` of an earlier commit) instead of this one's")
    ap.add_argument("--daemon-pid", type=int,
                    help="pid of the runtime for rss (default: the socket's owner)")
    ap.add_argument("--nri-socket", metavar="PATH",
                    help="the runtime's NRI socket (with --endpoint; else nri is skipped)")
    ap.add_argument("--registry-config-dir", metavar="DIR",
                    help="with --endpoint or --pull-against: that runtime's registry "
                         "config_path (containerd's hosts.toml tree); the run adds "
                         "DIR/<registry>/hosts.toml saying plain HTTP for its registry, and "
                         "removes it at the end")
    ap.add_argument("--seed", type=int, default=0, help="NRI phase-order seed (default 0)")
    ap.add_argument("--keep", action="store_true", help="keep the temp dir (logs) on exit")
    args = ap.parse_args(argv)
    if min(args.iterations, args.pull_rounds, args.list_calls, args.partial_rounds,
           args.partial_layers, args.partial_files) < 1:
        ap.error("--iterations, --pull-rounds, --list-calls and the --partial-* counts must "
                 "be at least 1")
    if not 1 <= args.pull_layers <= args.pull_mb:
        ap.error("need 1 <= --pull-layers <= --pull-mb (layers are whole MiB)")
    if args.rss_pods < 1:
        ap.error("--rss-pods must be at least 1")
    if args.endpoint and not args.endpoint.startswith("unix://"):
        ap.error("--endpoint must be unix:///path/to/socket")
    if args.nri_socket and not args.endpoint:
        ap.error("--nri-socket goes with --endpoint (pycrid's own socket is known)")
    if args.registry_config_dir and not (args.endpoint or args.pull_against):
        ap.error("--registry-config-dir goes with --endpoint or --pull-against (pycrid's "
                 "own is written)")
    if args.pull_against and not args.pull_against.startswith("unix://"):
        ap.error("--pull-against must be unix:///path/to/socket")
    return args


# ---------------------------------------------------------------------------


@contextlib.contextmanager
def target_env(base: Path, args: argparse.Namespace,
               report: dict[str, Any]) -> Iterator[tuple[Target, rss.Idle | None]]:
    """The runtime under test, its idle memory taken before any pull or pod; on exit every
    pod this run made is removed (all pods, for a pycrid of our own) and images pulled
    into an outside runtime are removed."""
    with registry_env(base) as (reg, images), contextlib.ExitStack() as stack:
        if args.registry_config_dir:
            stack.enter_context(hosts_entry(reg, Path(args.registry_config_dir)))
        busybox = images.busybox.ref(reg)
        if args.endpoint is None:
            # info, not the e2e tests' debug: a debug line per call is not what is measured.
            with pycrid_daemon(base, reg, images, "--log-level", "info",
                               src=args.pycrid_src) as daemon:
                dpid: int = daemon.proc.pid
                idle = rss.Idle.take(dpid)
                report["runtime"] = runtime_info(daemon.client, f"unix://{daemon.address}",
                                                 dpid, started=True)
                report["runtime"]["pycrid_src"] = os.path.abspath(args.pycrid_src or "src")
                daemon.client.pull(busybox)
                daemon.client.pull(images.pause.ref(reg))
                yield Target(base, daemon.client, Pods(daemon.client.runtime), busybox,
                             f"unix://{daemon.address}", dpid,
                             nri_paths(str(base / "daemon"))["socket_path"], reg, images,
                             daemon), idle
            return
        path = args.endpoint.removeprefix("unix://")
        client = CRIClient(path)
        pods = Pods(client.runtime)
        try:
            pid: int | None = args.daemon_pid or socket_owner(path)
            idle = rss.Idle.take(pid)
            report["runtime"] = runtime_info(client, args.endpoint, pid, started=False)
            try:
                client.pull(busybox)
                yield Target(base, client, pods, busybox, args.endpoint, pid,
                             args.nri_socket, reg, images), idle
            finally:
                for sid in list(pods.pods):
                    pods.discard(sid)
                with contextlib.suppress(Exception):
                    client.remove(busybox)
        finally:
            client.close()


@contextlib.contextmanager
def hosts_entry(reg: LocalRegistry, config_dir: Path) -> Iterator[None]:
    """``config_dir/<host:port>/hosts.toml`` for the run's registry, over plain HTTP: without
    one, containerd tries HTTPS first on a loopback registry and falls back to HTTP on
    every pull (its default for localhost), which the pull section would time."""
    entry = config_dir / reg.host
    if entry.exists():
        raise SystemExit(f"{entry} exists already: not overwriting another's registry config")
    reg.hosts_dir(config_dir)
    try:
        yield
    finally:
        shutil.rmtree(entry, ignore_errors=True)


def runtime_info(client: CRIClient, endpoint: str, pid: int | None,
                 started: bool) -> dict[str, Any]:
    v = client.runtime.Version(pb.VersionRequest(), timeout=30)
    return {"endpoint": endpoint, "name": v.runtime_name, "version": v.runtime_version,
            "api_version": v.runtime_api_version, "daemon_pid": pid,
            "started_by_bench": started}


def sections_of(target: Target, idle: rss.Idle | None, args: argparse.Namespace,
                errors: list[str]) -> dict[str, Section]:
    """The installed sections, then pull on a runtime with no pod left."""
    plan = Plan(args.sections, args.iterations, args.nri_plugins, args.seed, args.rss_pods,
                args.list_sizes, args.list_calls, args.runtime_handler)
    opts = pull.Options(args.pull_mb, args.pull_layers, args.pull_rounds,
                        tuple(args.pull_kinds), args.pull_against)
    return run_sections(target, idle, plan, RUNC, errors, after={
        "pull": lambda: pull.run(target, opts),
        "partial": lambda: partial.run(target, args.partial_mb, args.partial_layers,
                                       args.partial_files, args.partial_rounds,
                                       args.pull_against or None,
                                       args.registry_config_dir,
                                       args.partial_link_mbit)})


@interruptible
def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not is_worker():
        return supervise(argv, PROG)
    args = parse(argv)
    check_host(PROG, runtime=args.endpoint is None)
    arm_signals()

    t_start = time.monotonic()
    report: dict[str, Any] = {"schema": "pycrid-bench/1", "runtime": None,
                              "environment": host_info(),
                              "options": {k: v for k, v in vars(args).items()
                                          if k not in ("json", "keep")}}
    errors: list[str] = []
    sections: dict[str, Section] = {}
    left: list[str] = []
    with run_dir("pycrid-bench-", args.keep) as base:
        before = HostSnapshot.take(base)
        try:
            with target_env(base, args, report) as (target, idle):
                sections = sections_of(target, idle, args, errors)
        finally:
            dbase = base / "daemon"
            if (dbase / "config.toml").exists():
                left += [x for x in leftovers(str(dbase / "root"), str(dbase / "state"))
                         if not (x.startswith("cgroup ") and x[7:] in before.cgroups)]
            after = HostSnapshot.take(base)
            wait_gone(after.monitors - before.monitors)
            left += [x for x in HostSnapshot.take(base).new_since(before, base)
                     if x not in left]

    ordered = [sections[n] for n in SECTIONS if n in sections]
    rt = report["runtime"] or {}
    print(f"\n{rt.get('name')} {rt.get('version')} at {rt.get('endpoint')} "
          f"(pid {rt.get('daemon_pid')}), {report['environment']['cpus']} cpus, "
          f"kernel {report['environment']['kernel']}\n")
    print(table(ordered))
    report.update(sections={s.name: s.as_json() for s in ordered}, errors=errors,
                  leftovers=left, wall_seconds=round(time.monotonic() - t_start, 2),
                  ok=not errors and not left)
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
        print(f"\nwrote {args.json}")
    for e in errors:
        print(f"error: {e}", file=sys.stderr)
    said_left_behind(left)
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
