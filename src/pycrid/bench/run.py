"""One ``pycrid bench`` run against a runtime it did not start: find it, pull what is
missing, measure, then remove what it made and check that nothing of its own is left."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cri_api.v1 import api_pb2 as pb

from pycrid.bench.cri import Client, Pods
from pycrid.bench.floor import Runc, runc_binary
from pycrid.bench.procs import (
    arm_signals,
    host_info,
    monitor_pids,
    mounts_under,
    processes_mentioning,
    socket_owner,
    wait_gone,
)
from pycrid.bench.report import Section, describe, table
from pycrid.bench.rss import Idle
from pycrid.bench.scratch import INTERRUPTED, run_dir, said_left_behind
from pycrid.bench.sections import SECTIONS, Plan, run_sections
from pycrid.bench.target import Target

SCHEMA = "pycrid-bench/1"


def default_endpoint(config: str | None) -> str:
    """The CRI socket of the config ``pycrid serve`` would read (as ``pycrid status``)."""
    from pycrid.builtins import registry
    from pycrid.config.loader import default_config_path, load

    return load(default_config_path(config), registry().registrations()).config.grpc.address


def sandbox_image_of(info: dict[str, Any]) -> str | None:
    """The pause image a runtime reports in its verbose Status info: pycrid's ``images``,
    containerd 1.x's ``config.sandboxImage``, containerd 2.x's ``config.PinnedImages``."""
    images = info.get("images")
    if isinstance(images, dict) and images.get("sandbox_image"):
        return str(images["sandbox_image"])
    config = info.get("config")
    if isinstance(config, dict):
        if config.get("sandboxImage"):
            return str(config["sandboxImage"])
        for key in ("PinnedImages", "pinnedImages"):
            pinned = config.get(key)
            if isinstance(pinned, dict) and pinned.get("sandbox"):
                return str(pinned["sandbox"])
    return None


@dataclass
class Images:
    """The images the run needs: pulled through CRI when missing, and then removed; those
    that were there before are never touched."""

    client: Client
    pulled: list[str] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)

    def ensure(self, ref: str) -> None:
        if ref in self.pulled or ref in self.kept:
            return
        if self.client.has_image(ref):
            self.kept.append(ref)
            return
        print(f"pulling {ref} ...", file=sys.stderr)
        self.pulled.append(ref)  # before the call: a pull cut short by Ctrl-C may land
        try:
            self.client.pull(ref)
        except Exception:
            with contextlib.suppress(Exception):
                if not self.client.has_image(ref):
                    self.pulled.remove(ref)
            raise

    def remove_pulled(self) -> list[str]:
        """Remove what this run pulled; the images still there, with why."""
        left = []
        for ref in self.pulled:
            try:
                if self.client.has_image(ref):
                    self.client.remove_image(ref)
                    self.removed.append(ref)
            except Exception as e:
                left.append(f"image {ref} (pulled by this run): {describe(e)}")
        return left


def our_objects_listed(client: Client) -> list[str]:
    """Pods and containers of this run's that the runtime still lists."""
    rt = client.runtime
    pods = rt.ListPodSandbox(pb.ListPodSandboxRequest(), timeout=60).items
    ctrs = rt.ListContainers(pb.ListContainersRequest(), timeout=60).containers
    return ([f"pod {p.id} ({p.metadata.name})" for p in pods if Pods.ours(p)]
            + [f"container {c.id} ({c.metadata.name})" for c in ctrs
               if c.id in Pods.container_ids])


def remove_ours(client: Client, settle: float = 1.0, limit: float = 30.0) -> None:
    """Remove the run's pods that are still listed (a section cut short by an error or
    Ctrl-C). When a RunPodSandbox never answered, its pod may still be on its way: then
    list until none of ours has been seen for ``settle`` seconds."""
    pods = Pods(client.runtime)
    waiting = bool(Pods.asked - Pods.answered)
    deadline = time.monotonic() + limit
    quiet_since = time.monotonic()
    while True:
        try:
            listed = client.runtime.ListPodSandbox(pb.ListPodSandboxRequest(),
                                                   timeout=60).items
        except Exception as e:
            print(f"warning: cannot list pods to remove this run's: {describe(e)}",
                  file=sys.stderr)
            return
        mine = [p for p in listed if Pods.ours(p)]
        for p in mine:
            Pods.told.add(p.id)
            Pods.pod_ids.add(p.id)
            pods.discard(p.id)
        if mine:
            quiet_since = time.monotonic()
        if not waiting or time.monotonic() - quiet_since >= settle \
                or time.monotonic() > deadline:
            return
        time.sleep(0.2)


def leftovers(client: Client, images: Images, base: Path, runc: str | None) -> list[str]:
    """What of the run's own making is still there: pods, containers, pulled images, monitor
    processes naming its ids, the runc floor's containers and cgroups, NRI plugin
    processes and mounts under its directory."""
    left: list[str] = []
    try:
        left += our_objects_listed(client)
    except Exception as e:
        left.append(f"cannot list pods and containers to check: {e}")
    for ref in images.pulled:
        try:
            if client.has_image(ref):
                left.append(f"image {ref} (pulled by this run)")
        except Exception as e:
            left.append(f"cannot check image {ref}: {e}")
    mons = monitor_pids(Pods.told) if Pods.told else set()
    wait_gone(mons)
    left += [f"monitor process {p}" for p in sorted(mons) if os.path.exists(f"/proc/{p}")]
    if runc:
        left += Runc.of_run(base, runc).leftovers()
    left += [f"process {p} (names {base})" for p in processes_mentioning(str(base))]
    left += [f"mount {m}" for m in mounts_under(str(base))]
    return left


def _summary(images: Images, left: list[str]) -> str:
    pods, ctrs = len(Pods.pod_ids), len(Pods.container_ids)
    lines = [f"cleanup: removed the {pods} pods and {ctrs} containers this run created"
             + (" (see leftovers)" if left else "")]
    if images.removed:
        lines.append(f"cleanup: removed the images this run pulled: {', '.join(images.removed)}")
    if images.kept:
        lines.append(f"cleanup: left alone the images that were there before: "
                     f"{', '.join(images.kept)}")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    if os.geteuid() != 0:
        print("pycrid bench: needs root (it runs runc for its floor and reads the runtime's "
              "/proc entries)", file=sys.stderr)
        return 1
    runc = runc_binary()
    if runc is None and "lifecycle" in args.sections:
        print("pycrid bench: runc not found (the lifecycle floor runs it); install runc or "
              "leave lifecycle out of --sections", file=sys.stderr)
        return 1
    endpoint = args.endpoint
    if not endpoint:
        from pycrid.config.decode import ConfigError

        try:
            endpoint = default_endpoint(args.config)
        except ConfigError as e:
            print(f"pycrid bench: invalid configuration: {e}", file=sys.stderr)
            return 1
    path = endpoint.removeprefix("unix://")
    endpoint = f"unix://{path}"

    from pycrid import status_command as status

    try:
        asked = status.ask(path)
    except status.Unreachable as e:
        print(f"pycrid bench: {e}", file=sys.stderr)
        return 1
    sandbox = args.sandbox_image or sandbox_image_of(asked.info)
    if not sandbox:
        print(f"pycrid bench: {asked.version['name']} at {path} does not report its sandbox "
              f"image; give --sandbox-image REF", file=sys.stderr)
        return 1
    pid = args.daemon_pid or socket_owner(path)

    arm_signals()
    t_start = time.monotonic()
    plan = Plan(args.sections, args.iterations, args.nri_plugins, args.seed, args.rss_pods,
                args.list_sizes, args.list_calls, args.runtime_handler,
                partial_images=args.partial_images, partial_rounds=args.partial_rounds)
    report: dict[str, Any] = {
        "schema": SCHEMA,
        "runtime": {"endpoint": endpoint, **asked.version, "daemon_pid": pid,
                    "started_by_bench": False},
        "environment": host_info(runc or "runc"),
        "options": {k: v for k, v in vars(args).items()
                    if k not in ("json", "keep", "command", "config")},
    }
    client = Client(endpoint)
    images = Images(client)
    errors: list[str] = []
    sections: dict[str, Section] = {}
    left: list[str] = []
    try:
        with run_dir("pycrid-bench-", args.keep) as base:
            try:
                idle = Idle.take(pid)
                images.ensure(sandbox)
                images.ensure(args.image)
                target = Target(base, client, Pods(client.runtime), args.image, endpoint, pid,
                                args.nri_socket)
                sections = run_sections(target, idle, plan, runc or "runc", errors)
            except KeyboardInterrupt:
                raise
            except Exception as e:
                errors.append(f"setup: {describe(e)}")
            finally:
                remove_ours(client)
                left += images.remove_pulled()
                left += [x for x in leftovers(client, images, base, runc) if x not in left]
                client.close()
    except KeyboardInterrupt:
        print("\ninterrupted; cleaned up", file=sys.stderr)
        print(_summary(images, left), file=sys.stderr)
        said_left_behind(left)
        return INTERRUPTED

    ordered = [sections[n] for n in SECTIONS if n in sections]
    report.update(
        images={"sandbox": sandbox, "container": args.image, "pulled": images.pulled,
                "kept": images.kept},
        sections={s.name: s.as_json() for s in ordered}, errors=errors, leftovers=left,
        cleanup={"pods": len(Pods.pod_ids), "containers": len(Pods.container_ids),
                 "images_removed": images.removed},
        wall_seconds=round(time.monotonic() - t_start, 2), ok=not errors and not left)
    doc = json.dumps(report, indent=2) + "\n"
    if args.json == "-":
        sys.stdout.write(doc)
        print(_summary(images, left), file=sys.stderr)
    else:
        rt, env = report["runtime"], report["environment"]
        print(f"{rt['name']} {rt['version']} at {endpoint} (pid {pid}), {env['cpus']} cpus, "
              f"kernel {env['kernel']}; image {args.image}, sandbox image {sandbox}\n")
        print(table(ordered))
        print()
        print(_summary(images, left))
        if args.json:
            Path(args.json).write_text(doc)
            print(f"wrote {args.json}")
    for err in errors:
        print(f"error: {err}", file=sys.stderr)
    said_left_behind(left)
    return 0 if report["ok"] else 1
