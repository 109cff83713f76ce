"""Pod networks for the core: which CNI config a pod uses, kept in step with its directory.

One ``CNINetwork`` per distinct config directory (the ``[cni]`` one, plus any a
runtime handler names with ``cni_conf_dir``, as containerd's per-runtime network
plugins). Each directory is watched with inotify by a task this object owns;
a change reloads it (after a short pause, so a burst of writes is one reload), so
networks come and go without a restart. The pod CIDR from UpdateRuntimeConfig
feeds ``ipRanges`` and, with ``conf_template``, writes a config when none exists.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import os
from collections.abc import Mapping, Sequence
from typing import Any

from cri_api.v1 import api_pb2 as pb

from pycrid import inotify
from pycrid.config.schema import CNIConfig, RuntimeHandlerConfig
from pycrid.errors import FailedPrecondition, InvalidArgument, ResourceExhausted, Unknown
from pycrid.network.cache import ResultCache
from pycrid.network.cni import CNINetwork, NotReady
from pycrid.network.cni_args import EGRESS_ANNOTATION, INGRESS_ANNOTATION, attachment
from pycrid.network.invoke import PluginError
from pycrid.network.template import TemplateError, render
from pycrid.tasks import Owner

log = logging.getLogger(__name__)

#: containerd writes 10-containerd-net.conflist; the same idea under pycrid's name.
TEMPLATE_OUTPUT = "10-pycrid-net.conflist"
_WATCH_MASK = (inotify.CLOSE_WRITE | inotify.MOVED_TO | inotify.MOVED_FROM | inotify.DELETE
               | inotify.CREATE | inotify.DELETE_SELF | inotify.MOVE_SELF)
_SETTLE = 0.1


class PodNetworks:
    def __init__(self, config: CNIConfig, runtimes: Mapping[str, RuntimeHandlerConfig],
                 default_runtime: str, cache_dir: str, owner: Owner | None = None) -> None:
        self.config = config
        self.cache = ResultCache(cache_dir)
        self.default_runtime = default_runtime
        self.pod_cidrs: list[str] = []
        #: The watch task of each directory, and the loads in the background.
        self._watches = owner if owner is not None else Owner("CNI conf dirs")
        self._by_dir: dict[str, CNINetwork] = {}
        self._by_handler: dict[str, CNINetwork] = {}
        self.default = self._network(config.conf_dir, config.max_conf_num)
        for name, rt in runtimes.items():
            if rt.cni_conf_dir:
                self._by_handler[name] = self._network(rt.cni_conf_dir, rt.cni_max_conf_num)

    def _network(self, conf_dir: str, max_conf_num: int) -> CNINetwork:
        if conf_dir not in self._by_dir:
            self._by_dir[conf_dir] = CNINetwork(
                conf_dir=conf_dir, bin_dirs=self.config.bin_dirs, max_conf_num=max_conf_num,
                cache=self.cache, ip_pref=self.config.ip_pref, owner=self._watches)
        return self._by_dir[conf_dir]

    def for_handler(self, handler: str) -> CNINetwork:
        return self._by_handler.get(handler or self.default_runtime, self.default)

    # ---- lifetime ------------------------------------------------------------------------

    async def start(self) -> None:
        """Watch, then load, every directory (a change between the two is not missed);
        a missing directory is created, as containerd does. The loads run in the
        background: a plugin slow to answer VERSION never holds up the daemon's start
        (calls that need the network wait for the load, which is bounded)."""
        for net in self._by_dir.values():
            with contextlib.suppress(OSError):
                os.makedirs(net.conf_dir, mode=0o755, exist_ok=True)
            ino = _try_watch(net.conf_dir)
            net.load_soon()
            self._watches.spawn(self._watch(net, ino), f"cni-watch {net.conf_dir}")

    async def aclose(self) -> None:
        await self._watches.aclose()

    async def _watch(self, net: CNINetwork, ino: inotify.Inotify | None) -> None:
        """Reload on every change; while the directory is gone, look for it every second."""
        while True:
            if ino is None:
                await asyncio.sleep(1)
                if (ino := _try_watch(net.conf_dir)) is None:
                    continue
                await net.load()  # the directory is back
            try:
                while True:
                    events = await ino.wait()
                    await asyncio.sleep(_SETTLE)  # a burst of writes is one reload
                    events += ino.read_events()
                    await net.load()
                    if any(e.mask & (inotify.DELETE_SELF | inotify.MOVE_SELF | inotify.IGNORED)
                           for e in events):
                        log.warning("CNI conf dir %s was removed or moved", net.conf_dir)
                        break
            finally:
                ino.close()
                ino = None

    # ---- status --------------------------------------------------------------------------

    async def not_ready_reason(self) -> str | None:
        """Why the default network cannot serve pods (containerd reports only that one)."""
        return await self.default.status()

    def describe(self) -> dict[str, Any]:
        info = self.default.describe()
        if self._by_handler:
            info["Handlers"] = {h: n.describe() for h, n in sorted(self._by_handler.items())}
        return info

    # ---- pods ----------------------------------------------------------------------------

    async def attach(self, sandbox_id: str, netns: str, config: pb.PodSandboxConfig,
                     handler: str) -> list[str]:
        """CNI ADD for a new pod; its IPs. The CRI error carries the plugin's message."""
        att = attachment(sandbox_id, netns, config, self.pod_cidrs)
        net = self.for_handler(handler)
        try:
            return await net.setup(att)
        except NotReady as e:
            raise FailedPrecondition(f"pod network is not ready: {e}") from None
        except PluginError as e:
            raise Unknown(f"failed to set up the pod network: {e}") from None

    async def detach(self, sandbox_id: str, netns: str, config: pb.PodSandboxConfig,
                     handler: str, *, netns_alive: bool) -> None:
        """CNI DEL; idempotent. With nothing cached and the netns gone there is nothing
        left to delete."""
        att = attachment(sandbox_id, netns, _without_bandwidth(config), self.pod_cidrs)
        try:
            await self.for_handler(handler).teardown(att, fallback=netns_alive)
        except PluginError as e:
            raise Unknown(f"failed to tear down the pod network: {e}") from None

    async def check(self, sandbox_id: str, netns: str, handler: str) -> str | None:
        """CNI CHECK of a pod's attachments: None if fine, else the plugin's message."""
        try:
            await self.for_handler(handler).check(sandbox_id, netns)
        except PluginError as e:
            return str(e)
        return None

    # ---- UpdateRuntimeConfig -------------------------------------------------------------

    async def update_pod_cidr(self, pod_cidr: str) -> None:
        """The kubelet's node pod CIDRs ("a,b"): kept for ``ipRanges``; with a
        ``conf_template`` and no valid default config, a config is written from it."""
        cidrs = [c.strip() for c in pod_cidr.split(",") if c.strip()]
        if not cidrs:
            return
        families = set()
        for c in cidrs:
            try:
                families.add(ipaddress.ip_network(c, strict=False).version)
            except ValueError:
                raise InvalidArgument(f"pod CIDR {c!r} is not a CIDR") from None
        self.pod_cidrs = cidrs
        template = self.config.conf_template
        if not template:
            return
        if await self.default.status() is None:
            log.info("CNI network is ready; not writing a config from %s", template)
            return
        routes = [r for v, r in ((4, "0.0.0.0/0"), (6, "::/0")) if v in families]
        write_from_template(template, self.default.conf_dir, cidrs, routes)
        await self.default.load()


def _try_watch(conf_dir: str) -> inotify.Inotify | None:
    ino = inotify.Inotify()
    try:
        ino.add_watch(conf_dir, _WATCH_MASK)
    except (OSError, ResourceExhausted) as e:  # not there yet; or the watch limit
        ino.close()
        log.debug("cannot watch %s (%s); retrying", conf_dir,
                  e.strerror if isinstance(e, OSError) else e)
        return None
    return ino


def write_from_template(template: str, conf_dir: str, cidrs: Sequence[str],
                        routes: Sequence[str]) -> str:
    try:
        with open(template) as f:
            text = f.read()
        out = render(text, {"PodCIDR": cidrs[0], "PodCIDRRanges": list(cidrs),
                            "Routes": list(routes)})
    except OSError as e:
        raise FailedPrecondition(f"cannot read CNI conf_template {template}: "
                                 f"{e.strerror}") from None
    except TemplateError as e:
        raise FailedPrecondition(f"CNI conf_template {template}: {e}") from None
    os.makedirs(conf_dir, mode=0o755, exist_ok=True)
    path = os.path.join(conf_dir, TEMPLATE_OUTPUT)
    tmp = os.path.join(conf_dir, f".{TEMPLATE_OUTPUT}.tmp")
    with open(tmp, "w") as f:
        f.write(out)
        f.flush()
        os.fsync(f.fileno())
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)
    log.info("wrote CNI config %s from %s (pod CIDRs %s)", path, template, ", ".join(cidrs))
    return path


def _without_bandwidth(config: pb.PodSandboxConfig) -> pb.PodSandboxConfig:
    """The config without bandwidth annotations, for teardown and CHECK: their cached
    arguments are what counts, and an annotation that would now be refused must not
    stop a DEL."""
    if INGRESS_ANNOTATION not in config.annotations and \
            EGRESS_ANNOTATION not in config.annotations:
        return config
    copy = pb.PodSandboxConfig()
    copy.CopyFrom(config)
    copy.annotations.pop(INGRESS_ANNOTATION, None)
    copy.annotations.pop(EGRESS_ANNOTATION, None)
    return copy
