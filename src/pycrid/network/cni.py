"""One CNI configuration directory in use: its networks, and ADD/DEL/CHECK/STATUS on them.

This is what libcni and go-cni do for containerd, in the same steps: each network
of the directory is attached on its own interface (``eth0``, ``eth1``, ...), each
plugin of a network's chain gets the network's name and version, the previous
plugin's result and the runtime capabilities it declares; the final result is
cached per attachment (``cache.py``). DEL runs the chain backwards.

Loading also checks every plugin binary exists and speaks the network's
``cniVersion`` (the VERSION command, as libcni's ValidateNetworkList), so a
config a plugin cannot run makes the network not ready with the reason, instead
of failing each pod later. containerd runs no plugin to load a network, so these
questions are bounded (``VERSION_TIMEOUT`` each, all at once), the first load runs
beside the daemon's start-up instead of before it is ready, and a plugin that does
not answer makes the network not ready, naming it, until a retry finds it answering.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pycrid.network.cache import CachedAttachment, ResultCache
from pycrid.network.conf import ConfError, NetworkConfList, at_least, load_dir, parse
from pycrid.network.invoke import (
    Invocation,
    PluginError,
    find_plugin,
    run_plugin,
    supported_versions,
)
from pycrid.network.result import (
    DEFAULT_IFNAME,
    interface_ips,
    select_pod_ips,
    with_current_host_macs,
)
from pycrid.tasks import Owner

log = logging.getLogger(__name__)

#: While not ready, a status query retries loading at most this often (a plugin binary
#: installed after its config is then picked up without an event in the config dir).
RETRY_LOAD_EVERY = 2.0


_NOT_LOADED = "CNI config not loaded yet"


class NotReady(Exception):
    """No usable network configuration; the message says why."""


def host_link_mac(name: str, sysfs: str = "/sys") -> str | None:
    """The MAC the host's link ``name`` has now (None: no such link)."""
    try:
        with open(os.path.join(sysfs, "class/net", name, "address")) as f:
            return f.read().strip() or None
    except OSError:
        return None


@dataclass(frozen=True)
class Attachment:
    """The runtime's side of a pod's CNI calls: CNI_ARGS and capability arguments."""

    container_id: str
    netns: str
    args: tuple[tuple[str, str], ...]
    capabilities: Mapping[str, Any]


def ifname(index: int) -> str:
    return f"eth{index}"


def plugin_config(net: NetworkConfList, plugin: Mapping[str, Any], prev: Any,
                  capabilities: Mapping[str, Any]) -> bytes:
    """What one plugin of the chain reads on stdin (libcni's buildOneConfig)."""
    conf = dict(plugin)
    conf["name"] = net.name
    conf["cniVersion"] = net.cni_version
    if prev is not None:
        conf["prevResult"] = prev
    wanted = {k: capabilities[k] for k, on in (plugin.get("capabilities") or {}).items()
              if on and k in capabilities}
    if wanted:  # replaces a runtimeConfig of the file, as libcni does; else it stays
        conf["runtimeConfig"] = wanted
    return json.dumps(conf).encode()


class CNINetwork:
    """The networks of one conf dir (the default one, or a runtime handler's)."""

    def __init__(self, *, conf_dir: str, bin_dirs: Sequence[str], max_conf_num: int,
                 cache: ResultCache, ip_pref: str = "ipv4", owner: Owner | None = None) -> None:
        self.conf_dir = conf_dir
        self.bin_dirs = list(bin_dirs)
        self.max_conf_num = max_conf_num
        self.cache = cache
        self.ip_pref = ip_pref
        self.networks: list[NetworkConfList] = []
        self.error: str | None = _NOT_LOADED
        self._versions: dict[tuple[str, int], list[str]] = {}
        self._last_load = 0.0
        self._load_lock = asyncio.Lock()
        #: Owns loads that run in the background (the first one, retries).
        self._owner = owner if owner is not None else Owner(f"CNI {conf_dir}")
        self._loading: asyncio.Task[None] | None = None

    # ---- configuration -------------------------------------------------------------------

    async def load(self) -> None:
        """Re-read the conf dir; on any problem, no networks and ``error`` says why."""
        async with self._load_lock:
            self._last_load = time.monotonic()
            try:
                networks = load_dir(self.conf_dir, self.max_conf_num)
                await self._negotiate_all(networks)
            except (ConfError, PluginError) as e:
                if self.error != str(e):
                    log.warning("CNI network not ready: %s", e)
                self.networks, self.error = [], str(e)
                return
            if self.error is not None or [n.raw for n in networks] != \
                    [n.raw for n in self.networks]:
                log.info("CNI config loaded from %s: %s", self.conf_dir,
                         ", ".join(f"{n.name} ({os.path.basename(n.source)}, "
                                   f"{'+'.join(n.types)})" for n in networks))
            self.networks, self.error = networks, None

    async def _negotiate_all(self, networks: Sequence[NetworkConfList]) -> None:
        """Every plugin's VERSION (cached by binary and mtime), all asked at once, each
        within VERSION_TIMEOUT; then each network's version checked against them."""
        keys: dict[str, tuple[str, int]] = {}
        for net in networks:
            for kind in net.types:
                path = find_plugin(kind, self.bin_dirs)
                keys[kind] = (path, os.stat(path).st_mtime_ns)
        ask = [k for k, key in keys.items() if key not in self._versions]
        answers = await asyncio.gather(*(supported_versions(k, self.bin_dirs) for k in ask),
                                       return_exceptions=True)
        for kind, answer in zip(ask, answers, strict=True):
            if isinstance(answer, BaseException):
                raise answer  # a PluginError (not cached: asked again at the next load)
            self._versions[keys[kind]] = answer
        for net in networks:
            for kind in net.types:
                versions = self._versions[keys[kind]]
                if net.cni_version not in versions:
                    raise ConfError(
                        f"{net.source}: plugin {kind!r} does not support config version "
                        f"{net.cni_version!r} (it supports {', '.join(versions)})")

    def load_soon(self) -> None:
        """Load in the background (start-up does not wait for plugins to answer); whoever
        needs the config meanwhile waits for that load, which is bounded."""
        if self._loading is None or self._loading.done():
            self._loading = self._owner.spawn(self.load(), f"load {self.conf_dir}")

    async def _loaded(self) -> None:
        """Until the first load has ended (later ones run while the last config serves)."""
        if self.error == _NOT_LOADED and self._loading is not None and not self._loading.done():
            await asyncio.wait({self._loading})

    async def status(self) -> str | None:
        """None when pods can be networked, else the reason. Runs STATUS on plugins of
        networks at spec 1.1.0 or later, as libcni's GetStatusNetworkList. While not
        ready, a load is retried in the background at most every RETRY_LOAD_EVERY (a
        binary installed after its config, a plugin that did not answer)."""
        await self._loaded()
        if self.error is not None:
            if time.monotonic() - self._last_load >= RETRY_LOAD_EVERY:
                self.load_soon()
            return self.error
        for net in list(self.networks):
            if not at_least(net.cni_version, "1.1.0"):
                continue
            for plugin in net.plugins:
                try:
                    await run_plugin(str(plugin["type"]), self.bin_dirs, Invocation("STATUS"),
                                     plugin_config(net, plugin, None, {}))
                except PluginError as e:
                    return f"network {net.name!r}: {e}"
        return None

    # ---- attachments ---------------------------------------------------------------------

    async def setup(self, att: Attachment) -> list[str]:
        """ADD the pod to every network; the pod's IPs (primary first). On failure, or if
        the call is cancelled, every network is DELeted again before this returns."""
        await self._loaded()
        if self.error is not None:
            raise NotReady(self.error)
        networks = list(self.networks)
        try:
            outcome = await asyncio.gather(
                *(self._add(net, ifname(i), att) for i, net in enumerate(networks)),
                return_exceptions=True)
        except asyncio.CancelledError:
            await asyncio.shield(self._undo(networks, att, []))
            raise
        failure = next((r for r in outcome if isinstance(r, BaseException)), None)
        results = [r for r in outcome if isinstance(r, dict)]
        if failure is None:
            ips = interface_ips(results[0], DEFAULT_IFNAME) if results else []
            if ips:
                return select_pod_ips(ips, self.ip_pref)
            failure = PluginError(f"network {networks[0].name!r} gave "
                                  f"{DEFAULT_IFNAME} no IP address")
        await self._undo(networks, att, outcome)
        raise failure

    async def _undo(self, networks: Sequence[NetworkConfList], att: Attachment,
                    outcome: Sequence[object]) -> None:
        """DEL every network of a failed ADD, each with its result if it got one."""
        for i, net in reversed(list(enumerate(networks))):
            got = outcome[i] if i < len(outcome) else None
            try:
                await self._del(net, ifname(i), att, got if isinstance(got, dict) else None)
            except PluginError as e:
                log.error("pod %s: DEL after a failed ADD failed too: %s", att.container_id, e)
        self.cache.purge(att.container_id)

    async def _add(self, net: NetworkConfList, iface: str, att: Attachment) -> dict[str, Any]:
        call = Invocation("ADD", att.container_id, att.netns, iface, att.args)
        result: Any = None
        for plugin in net.plugins:
            out = await run_plugin(str(plugin["type"]), self.bin_dirs, call,
                                   plugin_config(net, plugin, result, att.capabilities))
            try:
                result = json.loads(out)
            except ValueError:
                raise PluginError(f"network {net.name!r}: plugin type={plugin['type']!r} "
                                  f"returned a result that is not JSON") from None
        self.cache.put(CachedAttachment(
            network=net.name, container_id=att.container_id, ifname=iface, netns=att.netns,
            config=net.raw, args=att.args, capabilities=dict(att.capabilities),
            result=result if isinstance(result, dict) else {}))
        return result if isinstance(result, dict) else {}

    async def _del(self, net: NetworkConfList, iface: str, att: Attachment,
                   prev: dict[str, Any] | None) -> None:
        """DEL through the whole chain, backwards. Unlike libcni, a failing plugin does
        not stop the ones before it (IPAM is released even if portmap is broken); the
        first failure is raised at the end, and a retry repeats the idempotent DELs."""
        call = Invocation("DEL", att.container_id, att.netns, iface, att.args)
        if not at_least(net.cni_version, "0.4.0"):
            prev = None
        failures: list[PluginError] = []
        for plugin in reversed(net.plugins):
            try:
                await run_plugin(str(plugin["type"]), self.bin_dirs, call,
                                 plugin_config(net, plugin, prev, att.capabilities))
            except PluginError as e:
                failures.append(e)
        if failures:
            raise failures[0]

    async def teardown(self, att: Attachment, *, fallback: bool = True) -> None:
        """DEL the pod from every network it was attached to: from the cache, so what ADD
        used (config, args, capabilities) is what DEL gets, even after a restart or a
        config change; without a cache entry and with ``fallback``, from the current
        config (a crash during ADD), whose DEL tolerates what never existed."""
        cached = self.cache.of(att.container_id)
        if not cached and fallback:
            await self._loaded()  # the current config is the fallback's
        if cached:
            for entry in reversed(cached):
                net = parse(entry.config, ".conflist")
                await self._del(net, entry.ifname,
                                Attachment(att.container_id, att.netns, entry.args,
                                           entry.capabilities), entry.result)
                self.cache.delete(entry)
        elif not fallback:
            pass
        elif self.error is None:
            for i, net in reversed(list(enumerate(self.networks))):
                await self._del(net, ifname(i), att, None)
        else:
            log.warning("pod %s: no cached CNI result and no network config (%s): "
                        "nothing to DEL", att.container_id, self.error)
        self.cache.purge(att.container_id)

    async def check(self, container_id: str, netns: str) -> None:
        """CHECK every cached attachment whose network is at spec 0.4.0 or later and does
        not disable it, with what ADD used; raises PluginError with the plugin's message."""
        for entry in self.cache.of(container_id):
            net = parse(entry.config, ".conflist")
            if not at_least(net.cni_version, "0.4.0") or net.disable_check:
                continue
            call = Invocation("CHECK", container_id, netns, entry.ifname, entry.args)
            prev = with_current_host_macs(entry.result, host_link_mac)
            for plugin in net.plugins:
                await run_plugin(str(plugin["type"]), self.bin_dirs, call,
                                 plugin_config(net, plugin, prev, entry.capabilities))

    def describe(self) -> dict[str, Any]:
        """For Status verbose info (containerd's ``cniconfig``)."""
        return {"PluginDirs": self.bin_dirs, "PluginConfDir": self.conf_dir,
                "PluginMaxConfNum": self.max_conf_num, "Prefix": "eth",
                "Error": self.error or "",
                "Networks": [{"Config": {"Name": n.name, "CNIVersion": n.cni_version,
                                         "Plugins": n.types, "Source": n.source},
                              "IFName": ifname(i)} for i, n in enumerate(self.networks)]}
