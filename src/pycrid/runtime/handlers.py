"""Runtime handlers (the kubelet's RuntimeClass): named runc set-ups chosen per pod.

Each handler is a runc binary with its own state root plus the OCI spec options
containerd keeps per runtime (base spec, privileged without host devices,
annotation pass-through). ``RuntimeRouter`` presents every handler's runtime as
one ``ContainerRuntime``: the core keeps addressing objects by id, and the
router remembers which handler created each id (and learns it again from each
root's ``runc list`` after a restart).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import platform
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from pycrid.config.decode import ConfigError
from pycrid.config.schema import RUNC_TYPE, RUNSC_TYPE, RuntimeConfig
from pycrid.errors import InvalidArgument
from pycrid.runtime.exits import Exit
from pycrid.runtime.interface import (
    CheckpointPaths,
    ContainerRuntime,
    CreateOptions,
    ExecResult,
    RuncState,
)
from pycrid.runtime.runc_cli import find_binary
from pycrid.runtime.runsc_config import RunscSettings
from pycrid.runtime.runsc_config import load as load_runsc
from pycrid.stats.cgroup_stats import CgroupStats
from pycrid.stdio import ProcessIO

log = logging.getLogger(__name__)

_SECTION = 'plugins."pycrid.cri.v1.runtime".runtimes'


@dataclass(frozen=True)
class HandlerFeatures:
    """What the handler's runc can do, as the CRI Status reports it."""

    recursive_read_only_mounts: bool = False
    user_namespaces: bool = False
    #: The binary says it can checkpoint and restore with CRIU (not in the CRI's
    #: features; Status verbose info reports it).
    checkpoint: bool = False
    #: ``UpdateContainerResources`` can change a running container's limits.
    update_resources: bool = True


@dataclass(frozen=True)
class HandlerSpec:
    """A handler's spec options, read once at start."""

    name: str
    runc_root: str
    runc_binary: str = ""
    base_spec: dict[str, Any] | None = None
    privileged_without_host_devices: bool = False
    pod_annotations: tuple[str, ...] = ()
    container_annotations: tuple[str, ...] = ()
    features: HandlerFeatures = HandlerFeatures()
    runtime_type: str = RUNC_TYPE
    #: A gVisor handler's binary, root and flags (None for runc).
    runsc: RunscSettings | None = None
    #: The capabilities its runtime knows (None: every one the host has).
    capabilities: frozenset[str] | None = None
    #: What its binary says of its version (runsc's; "" when not asked).
    version: str = ""

    @property
    def sandboxed(self) -> bool:
        """Pods run in an application kernel (gVisor): one sandbox process per pod, the
        containers inside it, with no host cgroup or process of their own."""
        return self.runsc is not None


def runc_binary(config: RuntimeConfig, handler: str) -> str:
    """The runc a handler runs: its BinaryName, else the runtime section's runtime_path."""
    return config.runtimes[handler].options.BinaryName or config.runtime_path


def default_runc(config: RuntimeConfig) -> str:
    """The default handler's runc as the path that will run: configured, else found on
    the search path (an unset runtime_path is the usual config)."""
    default = config.runtimes.get(config.default_runtime_name)
    if default is None or default.runtime_type != RUNC_TYPE:  # a gVisor default: runc's own
        return find_binary(config.runtime_path, "runc", "runtime_path")
    return find_binary(runc_binary(config, config.default_runtime_name), "runc",
                       "runtime_path")


def load_handlers(config: RuntimeConfig, state_dir: str) -> dict[str, HandlerSpec]:
    """Every configured handler with its base spec (and a gVisor handler's runsc.toml)
    read; a bad file stops start-up with the key's name (containerd fails the same way)."""
    out: dict[str, HandlerSpec] = {}
    for name, h in sorted(config.runtimes.items()):
        runsc = None
        if h.runtime_type == RUNSC_TYPE:
            runsc = load_runsc(f"{_SECTION}.{name}", binary=h.options.BinaryName,
                               root=h.options.Root, config_path=h.options.ConfigPath,
                               default_root=os.path.join(
                                   state_dir, "runsc" if name == "runsc" else f"runsc-{name}"))
            root, binary = runsc.root, runsc.binary
        else:
            for key in ("TypeUrl", "ConfigPath"):
                if getattr(h.options, key):
                    raise ConfigError(f"{_SECTION}.{name}.options.{key}",
                                      f"is for runtime_type = \"{RUNSC_TYPE}\" only")
            default_root = "runc" if name == config.default_runtime_name else f"runc-{name}"
            root = h.options.Root or os.path.join(state_dir, default_root)
            binary = runc_binary(config, name)
        out[name] = HandlerSpec(
            name=name, runc_root=root, runc_binary=binary,
            base_spec=_base_spec(name, h.base_runtime_spec) if h.base_runtime_spec else None,
            privileged_without_host_devices=h.privileged_without_host_devices,
            pod_annotations=tuple(h.pod_annotations),
            container_annotations=tuple(h.container_annotations),
            runtime_type=h.runtime_type, runsc=runsc)
    roots = [h.runc_root for h in out.values()]
    if len(set(roots)) != len(roots):
        raise ConfigError(f"{_SECTION}.*.options.Root",
                          "two runtime handlers share one runc root")
    return out


def _base_spec(name: str, path: str) -> dict[str, Any]:
    key = f"{_SECTION}.{name}.base_runtime_spec"
    try:
        with open(path, "rb") as f:
            spec = json.load(f)
    except OSError as e:
        raise ConfigError(key, f"cannot read {path}: {e.strerror}") from None
    except ValueError as e:
        raise ConfigError(key, f"{path} is not valid JSON: {e}") from None
    if not isinstance(spec, dict) or not isinstance(spec.get("process"), dict) \
            or not isinstance(spec.get("linux"), dict):
        raise ConfigError(key, f"{path} is not an OCI runtime spec (needs process and linux)")
    spec.setdefault("root", {"path": "rootfs"})
    spec.setdefault("mounts", [])
    spec["process"].setdefault("user", {"uid": 0, "gid": 0})
    spec["process"].setdefault("cwd", "/")
    spec["linux"].setdefault("namespaces", [])
    spec["linux"].setdefault("resources", {"devices": [{"allow": False, "access": "rwm"}]})
    return spec


def _kernel_at_least(major: int, minor: int) -> bool:
    try:
        parts = platform.release().split(".")
        return (int(parts[0]), int(parts[1].split("-")[0])) >= (major, minor)
    except (IndexError, ValueError):
        return False


#: runc's own annotation in ``runc features`` (since 1.1): built with checkpoint/restore.
CHECKPOINT_ANNOTATION = "org.opencontainers.runc.checkpoint.enabled"


def features_from(raw: Mapping[str, Any]) -> HandlerFeatures:
    """containerd's reading of ``runc features``: rro needs the mount option and a kernel
    with mount_setattr (5.12); CRI user namespaces need idmapped mounts too. Checkpoint
    support is what the binary's annotation says (a runtime that is not runc, gVisor's
    runsc for one, says nothing, and is refused)."""
    rro = "rro" in (raw.get("mountOptions") or []) and _kernel_at_least(5, 12)
    linux = raw.get("linux") or {}
    idmap = ((linux.get("mountExtensions") or {}).get("idmap") or {}).get("enabled") is True
    userns = "user" in (linux.get("namespaces") or []) and idmap
    checkpoint = (raw.get("annotations") or {}).get(CHECKPOINT_ANNOTATION) == "true"
    return HandlerFeatures(recursive_read_only_mounts=rro, user_namespaces=userns,
                           checkpoint=checkpoint)


async def probe_features(runc: str) -> HandlerFeatures:
    """Ask the binary (``runc features``); an older runc without the command has none."""
    proc = await asyncio.create_subprocess_exec(
        runc, "features", stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL)
    out, _ = await proc.communicate()
    if proc.returncode != 0:
        return HandlerFeatures()
    try:
        raw = json.loads(out)
    except ValueError:
        return HandlerFeatures()
    return features_from(raw) if isinstance(raw, dict) else HandlerFeatures()


class RuntimeRouter(ContainerRuntime):
    """One ContainerRuntime per handler behind the single interface the core uses.

    Exit files, logs and attach sockets do not depend on the handler (the runtimes
    share one exit directory), so only runc commands are routed.
    """

    def __init__(self, runtimes: Mapping[str, ContainerRuntime], default: str,
                 handlers: Mapping[str, HandlerSpec] | None = None) -> None:
        if default not in runtimes:
            raise ValueError(f"default handler {default!r} has no runtime")
        dirs = {rt.exit_dir for rt in runtimes.values()}
        if len(dirs) != 1:
            raise ValueError("runtime handlers must share one exit directory")
        self.runtimes = dict(runtimes)
        self.default = default
        #: The handlers' spec options and features, by name.
        self.handlers: dict[str, HandlerSpec] = dict(handlers or {})
        self.exit_dir = dirs.pop()
        self._owner: dict[str, str] = {}

    def handler_of(self, object_id: str) -> str:
        return self._owner.get(object_id, self.default)

    def _of(self, object_id: str) -> ContainerRuntime:
        return self.runtimes[self.handler_of(object_id)]

    async def create(self, opts: CreateOptions) -> int:
        handler = opts.runtime_handler or self.default
        if handler not in self.runtimes:
            raise InvalidArgument(f"no runtime for handler {handler!r} is configured")
        self._owner[opts.id] = handler
        return await self.runtimes[handler].create(opts)

    async def start(self, object_id: str) -> None:
        await self._of(object_id).start(object_id)

    async def kill(self, object_id: str, signal: int) -> bool:
        return await self._of(object_id).kill(object_id, signal)

    async def delete(self, object_id: str) -> None:
        await self._of(object_id).delete(object_id)
        self._owner.pop(object_id, None)

    async def update(self, object_id: str, resources: dict[str, Any]) -> None:
        await self._of(object_id).update(object_id, resources)

    async def state(self, object_id: str) -> RuncState | None:
        return await self._of(object_id).state(object_id)

    async def states(self) -> dict[str, RuncState]:
        """Every handler's ``runc list``; who listed an id owns it from now on."""
        merged: dict[str, RuncState] = {}
        for name, rt in self.runtimes.items():
            for oid, state in (await rt.states()).items():
                merged[oid] = state
                self._owner[oid] = name
        return merged

    async def exec_sync(self, object_id: str, process: dict[str, Any], *,
                        limit: float | None, output_cap: int) -> ExecResult:
        return await self._of(object_id).exec_sync(object_id, process, limit=limit,
                                                   output_cap=output_cap)

    async def exec_stream(self, object_id: str, process: dict[str, Any], io: ProcessIO) -> int:
        return await self._of(object_id).exec_stream(object_id, process, io)

    async def attach(self, bundle: str, io: ProcessIO) -> None:
        await self.runtimes[self.default].attach(bundle, io)

    def watch(self, object_id: str, bundle: str) -> bool:
        return self._of(object_id).watch(object_id, bundle)

    async def monitor_lost(self, object_id: str, bundle: str, reason: str = "") -> Exit | None:
        return await self._of(object_id).monitor_lost(object_id, bundle, reason)

    def close(self) -> None:
        """Stop watching monitors (the daemon is stopping; they go on)."""
        for rt in self.runtimes.values():
            rt.close()

    def exit_of(self, object_id: str) -> Exit | None:
        return self._of(object_id).exit_of(object_id)

    def forget_exit(self, object_id: str) -> None:
        self._of(object_id).forget_exit(object_id)

    def oom_killed(self, bundle: str) -> bool:
        # A bundle is named for its object's id.
        return self._of(os.path.basename(bundle.rstrip("/"))).oom_killed(bundle)

    async def reopen_log(self, bundle: str, log_path: str) -> None:
        await self.runtimes[self.default].reopen_log(bundle, log_path)

    def checkpoint_refusal(self, runtime_handler: str) -> str | None:
        rt = self.runtimes.get(runtime_handler or self.default)
        if rt is None:
            return f"no runtime for handler {runtime_handler!r} is configured"
        return rt.checkpoint_refusal(runtime_handler or self.default)

    async def pause(self, object_id: str) -> None:
        await self._of(object_id).pause(object_id)

    async def resume(self, object_id: str) -> None:
        await self._of(object_id).resume(object_id)

    async def checkpoint(self, object_id: str, paths: CheckpointPaths) -> None:
        await self._of(object_id).checkpoint(object_id, paths)

    async def restore(self, opts: CreateOptions, images: str) -> int:
        handler = opts.runtime_handler or self.default
        if handler not in self.runtimes:
            raise InvalidArgument(f"no runtime for handler {handler!r} is configured")
        self._owner[opts.id] = handler
        return await self.runtimes[handler].restore(opts, images)

    def own_stats(self, object_id: str) -> Callable[[], CgroupStats | None] | None:
        return self._of(object_id).own_stats(object_id)
