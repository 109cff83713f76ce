#!/usr/bin/env python3
"""NRI example plugin: set a container's rlimits from a pod annotation.

The annotation ``ulimits.noderesource.dev/container.<name>`` (or the older
``ulimits.nri.containerd.io/container.<name>``) holds a YAML list such as::

    - type: RLIMIT_NOFILE
      hard: 4096
      soft: 1024
    - type: nproc        # RLIMIT_ prefix and case are optional
      hard: 9000
      soft: 8000

Subscribes to CreateContainer only. An unknown type, or a hard limit below the
soft one, fails the container's creation with a message naming it. Behaves like
containerd/nri's Go ``ulimit-adjuster`` sample.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Sequence
from typing import Any

import yaml

from pycrid.nri import Adjustment, Plugin, api, run

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _cli

log = logging.getLogger("nri-ulimit-adjuster")

KEY = "ulimits.noderesource.dev"
OLD_KEY = "ulimits.nri.containerd.io"
PREFIX = "RLIMIT_"
VALID = {
    "AS", "CORE", "CPU", "DATA", "FSIZE", "LOCKS", "MEMLOCK", "MSGQUEUE", "NICE",
    "NOFILE", "NPROC", "RSS", "RTPRIO", "RTTIME", "SIGPENDING", "STACK",
}


def parse_ulimits(container: str, annotations: Any) -> list[tuple[str, int, int]]:
    """(type, hard, soft) triples for ``container``; [] when not annotated."""
    raw = None
    for key in (f"{KEY}/container.{container}", f"{OLD_KEY}/container.{container}"):
        if key in annotations:
            raw = annotations[key]
            break
    if not raw:
        return []
    items = yaml.safe_load(raw) or []
    if not isinstance(items, list):
        raise ValueError(f"ulimit annotation is not a YAML list: {raw!r}")
    out = []
    for item in items:
        if not isinstance(item, dict):
            raise ValueError(f"ulimit entry is not a mapping: {item!r}")
        typ = str(item.get("type", ""))
        bare = typ.upper().removeprefix(PREFIX)
        if bare not in VALID:
            raise ValueError(f"failed to parse type: {typ!r}")
        hard, soft = int(item.get("hard", 0)), int(item.get("soft", 0))
        if hard < soft:
            raise ValueError(f"ulimit {PREFIX + bare!r} must have hard limit >= soft limit")
        out.append((PREFIX + bare, hard, soft))
    return out


class UlimitAdjuster(Plugin):
    def create_container(self, pod: api.PodSandbox, container: api.Container) -> Adjustment:
        adjust = Adjustment()
        for typ, hard, soft in parse_ulimits(container.name, pod.annotations):
            log.info("%s/%s: %s hard=%d soft=%d", pod.name, container.name, typ, hard, soft)
            adjust.add_rlimit(typ, hard, soft)
        return adjust


def main(args: Sequence[str] | None = None) -> int:
    ns = _cli.parser("NRI plugin that sets rlimits from pod annotations").parse_args(
        _cli.argv(args)
    )
    return run(UlimitAdjuster(), **_cli.stub_options(ns))


if __name__ == "__main__":
    sys.exit(main())
