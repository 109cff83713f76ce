"""Where the daemon listens, checked before anything is bound.

The CRI socket, the NRI socket, the containerd API socket for cAdvisor, the CRI TCP
listener, the streaming server and the metrics endpoint each have their own config key.
Two of them given one path (or one port) would have the second bind fail, or replace the
first, with a message about "another process" that is this very daemon; so start-up
compares them first and stops (a config error, exit 2) naming both keys.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from pycrid.config.decode import ConfigError
from pycrid.config.loader import LoadedConfig

_NRI = "pycrid.nri.v1.nri"
_CADVISOR = "pycrid.cadvisor.v1.containerd"
_CRI = "pycrid.grpc.v1.cri"
_WILDCARD = ("", "0.0.0.0", "::", "[::]", "*")


@dataclass(frozen=True)
class Endpoint:
    #: The config key (or flag) that sets it.
    key: str
    #: A unix socket path, or host:port.
    where: str
    unix: bool

    def clashes_with(self, other: Endpoint) -> bool:
        if self.unix != other.unix:
            return False
        if self.unix:
            return os.path.realpath(self.where) == os.path.realpath(other.where)
        host, _, port = self.where.rpartition(":")
        other_host, _, other_port = other.where.rpartition(":")
        if port != other_port or port in ("", "0"):
            return False
        return host == other_host or host in _WILDCARD or other_host in _WILDCARD


def _section(loaded: LoadedConfig, uri: str) -> Any | None:
    """A plugin's config section, or None when the plugin is disabled."""
    if uri in loaded.config.disabled_plugins:
        return None
    return loaded.plugins.get(uri)


#: The CRI socket's key; ``--address`` overrides it.
CRI_KEY = "[grpc] address (--address)"


def endpoints(loaded: LoadedConfig, cri_key: str = CRI_KEY) -> list[Endpoint]:
    """Every endpoint this config will bind."""
    cfg = loaded.config
    address = cfg.grpc.address.removeprefix("unix://")
    found = [Endpoint(cri_key, address, unix=True)]
    cri = _section(loaded, _CRI)
    if cri is not None:
        if not cri.disable_tcp_service and cfg.grpc.tcp_address:
            found.append(Endpoint("[grpc] tcp_address", cfg.grpc.tcp_address, unix=False))
        if str(cri.stream_server_port) != "0":
            found.append(Endpoint(
                f'plugins."{_CRI}".stream_server_address and stream_server_port',
                f"{cri.stream_server_address}:{cri.stream_server_port}", unix=False))
    nri = _section(loaded, _NRI)
    if nri is not None and not nri.disable and not nri.disable_connections:
        found.append(Endpoint(f'plugins."{_NRI}".socket_path', nri.socket_path, unix=True))
    cadvisor = _section(loaded, _CADVISOR)
    if cadvisor is not None and not cadvisor.disable:
        found.append(Endpoint(f'plugins."{_CADVISOR}".socket_path', cadvisor.socket_path,
                              unix=True))
    if cfg.metrics.address:
        found.append(Endpoint("[metrics] address", cfg.metrics.address, unix=False))
    return found


def check_distinct(loaded: LoadedConfig, cri_key: str = CRI_KEY) -> None:
    """Stop (ConfigError, naming both keys) if two endpoints are one."""
    seen: list[Endpoint] = []
    for ep in endpoints(loaded, cri_key):
        for earlier in seen:
            if ep.clashes_with(earlier):
                kind = "socket" if ep.unix else "port"
                raise ConfigError(ep.key, f"{ep.where} is also {earlier.key} "
                                  f"({earlier.where}); each needs its own {kind}: change "
                                  "one of them")
        seen.append(ep)
