#!/usr/bin/env python3
"""NRI example plugin: log every event, optionally mark each new container.

Subscribes to every event unless told otherwise (``--events`` or the
``events`` list in its runtime-provided YAML config). With ``--add-annotation
KEY`` / ``--add-env NAME`` it adds that annotation / environment variable to
every container it sees created, valued ``logger-pid-<pid>``; the ``--set-*``
variants first remove any existing value. Behaves like containerd/nri's Go
``logger`` sample, so the two are interchangeable.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Sequence
from typing import Any

import yaml
from google.protobuf import text_format

from pycrid.nri import Adjustment, Plugin, api, run

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _cli

log = logging.getLogger("nri-logger")


class Logger(Plugin):
    """Logs every event; ``value`` is what the added annotation/env var carry."""

    def __init__(
        self,
        *,
        events: str = "",
        add_annotation: str = "",
        set_annotation: str = "",
        add_env: str = "",
        set_env: str = "",
        log_file: str = "",
        value: str | None = None,
    ) -> None:
        self.mask = api.parse_event_mask(events) if events else 0
        self.add_annotation = add_annotation
        self.set_annotation = set_annotation
        self.add_env = add_env
        self.set_env = set_env
        self.log_file = ""
        self.value = value or f"logger-pid-{os.getpid()}"
        if log_file:
            self._log_to(log_file)

    def _log_to(self, path: str) -> None:
        if path == self.log_file:
            return
        handler = logging.FileHandler(path)
        handler.setFormatter(logging.Formatter("%(asctime)s %(message)s"))
        log.addHandler(handler)
        log.propagate = False
        self.log_file = path

    def dump(self, event: str, **objects: Any) -> None:
        if not log.isEnabledFor(logging.INFO):
            return
        lines = [event]
        for name, obj in objects.items():
            body = text_format.MessageToString(obj) if hasattr(obj, "ListFields") else repr(obj)
            lines.append(f"  {name}:")
            lines.extend(f"    {line}" for line in body.splitlines())
        log.info("\n".join(lines))

    # -- configuration
    def configure(self, config: str, runtime_name: str, runtime_version: str) -> int:
        log.info("configuration %r from runtime %s %s", config, runtime_name, runtime_version)
        if not config:
            return self.mask
        cfg = yaml.safe_load(config) or {}
        if not isinstance(cfg, dict):
            raise ValueError("configuration is not a YAML mapping")
        self.mask = api.parse_event_mask(",".join(cfg.get("events") or []))
        self.add_annotation = cfg.get("addAnnotation", self.add_annotation) or ""
        self.set_annotation = cfg.get("setAnnotation", self.set_annotation) or ""
        self.add_env = cfg.get("addEnv", self.add_env) or ""
        self.set_env = cfg.get("setEnv", self.set_env) or ""
        if cfg.get("logFile"):
            self._log_to(cfg["logFile"])
        return self.mask

    def synchronize(
        self, pods: list[api.PodSandbox], containers: list[api.Container]
    ) -> None:
        self.dump("Synchronize", pods=pods, containers=containers)

    def shutdown(self) -> None:
        self.dump("Shutdown")

    # -- pods
    def run_pod_sandbox(self, pod: api.PodSandbox) -> None:
        self.dump("RunPodSandbox", pod=pod)

    def update_pod_sandbox(
        self, pod: api.PodSandbox, overhead: api.LinuxResources, resources: api.LinuxResources
    ) -> None:
        self.dump("UpdatePodSandbox", pod=pod, overhead=overhead, resources=resources)

    def post_update_pod_sandbox(self, pod: api.PodSandbox) -> None:
        self.dump("PostUpdatePodSandbox", pod=pod)

    def stop_pod_sandbox(self, pod: api.PodSandbox) -> None:
        self.dump("StopPodSandbox", pod=pod)

    def remove_pod_sandbox(self, pod: api.PodSandbox) -> None:
        self.dump("RemovePodSandbox", pod=pod)

    # -- containers
    def create_container(self, pod: api.PodSandbox, container: api.Container) -> Adjustment:
        self.dump("CreateContainer", pod=pod, container=container)
        adjust = Adjustment()
        if self.add_annotation:
            adjust.add_annotation(self.add_annotation, self.value)
        if self.set_annotation:
            adjust.remove_annotation(self.set_annotation)
            adjust.add_annotation(self.set_annotation, self.value)
        if self.add_env:
            adjust.add_env(self.add_env, self.value)
        if self.set_env:
            adjust.remove_env(self.set_env)
            adjust.add_env(self.set_env, self.value)
        return adjust

    def post_create_container(self, pod: api.PodSandbox, container: api.Container) -> None:
        self.dump("PostCreateContainer", pod=pod, container=container)

    def start_container(self, pod: api.PodSandbox, container: api.Container) -> None:
        self.dump("StartContainer", pod=pod, container=container)

    def post_start_container(self, pod: api.PodSandbox, container: api.Container) -> None:
        self.dump("PostStartContainer", pod=pod, container=container)

    def update_container(
        self, pod: api.PodSandbox, container: api.Container, resources: api.LinuxResources
    ) -> None:
        self.dump("UpdateContainer", pod=pod, container=container, resources=resources)

    def post_update_container(self, pod: api.PodSandbox, container: api.Container) -> None:
        self.dump("PostUpdateContainer", pod=pod, container=container)

    def stop_container(self, pod: api.PodSandbox, container: api.Container) -> None:
        self.dump("StopContainer", pod=pod, container=container)

    def remove_container(self, pod: api.PodSandbox, container: api.Container) -> None:
        self.dump("RemoveContainer", pod=pod, container=container)

    def validate_container_adjustment(
        self, request: api.ValidateContainerAdjustmentRequest
    ) -> None:
        self.dump("ValidateContainerAdjustment", request=request)


def main(args: Sequence[str] | None = None) -> int:
    p = _cli.parser("NRI plugin that logs every event")
    p.add_argument("--events", default="", help="comma-separated events to subscribe to")
    p.add_argument("--log-file", default="", help="append the log here instead of stderr")
    p.add_argument("--add-annotation", default="", help="annotation key to add to containers")
    p.add_argument("--set-annotation", default="", help="annotation key to set on containers")
    p.add_argument("--add-env", default="", help="environment variable to add to containers")
    p.add_argument("--set-env", default="", help="environment variable to set on containers")
    ns = p.parse_args(_cli.argv(args))
    options = _cli.stub_options(ns)
    plugin = Logger(
        events=ns.events,
        add_annotation=ns.add_annotation,
        set_annotation=ns.set_annotation,
        add_env=ns.add_env,
        set_env=ns.set_env,
        log_file=ns.log_file,
    )
    return run(plugin, **options)


if __name__ == "__main__":
    sys.exit(main())
