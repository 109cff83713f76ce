"""Pod IPs out of CNI results, whatever spec version the plugin answered in (pure).

Results before 0.3.0 carry ``ip4``/``ip6`` objects; later ones an ``ips`` list whose
entries point at the interface they belong to. The pod's IPs are those of its
``eth0`` (containerd's default interface), the primary one chosen by ``ip_pref``
as containerd's selectPodIPs does.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Mapping, Sequence
from typing import Any

DEFAULT_IFNAME = "eth0"


def interface_ips(result: Mapping[str, Any], ifname: str) -> list[str]:
    """The addresses (without prefix length) that ``result`` gives interface ``ifname``."""
    out: list[str] = []
    if "ips" in result:
        ifaces = result.get("interfaces") or []
        for entry in result.get("ips") or []:
            idx = entry.get("interface")
            if isinstance(idx, int) and 0 <= idx < len(ifaces):
                if ifaces[idx].get("name") != ifname:
                    continue
            # An IP without an interface index belongs to the attachment's interface.
            out.append(_address(entry.get("address", "")))
    else:
        for key in ("ip4", "ip6"):
            entry = result.get(key)
            if isinstance(entry, dict) and entry.get("ip"):
                out.append(_address(entry["ip"]))
    return [a for a in out if a]


def _address(cidr: str) -> str:
    try:
        return str(ipaddress.ip_interface(cidr).ip)
    except ValueError:
        return ""


def select_pod_ips(ips: Sequence[str], preference: str = "ipv4") -> list[str]:
    """``ips`` with the primary first: the first of the preferred family ("ipv4", the
    default, or "ipv6"), or as the plugin ordered them ("cni")."""
    if preference not in ("ipv4", "ipv6"):
        return list(ips)
    want = 4 if preference == "ipv4" else 6
    for i, ip in enumerate(ips):
        if ipaddress.ip_address(ip).version == want:
            return [ip, *ips[:i], *ips[i + 1:]]
    return list(ips)


def with_current_host_macs(result: Mapping[str, Any],
                           mac_of: Callable[[str], str | None]) -> dict[str, Any]:
    """``result`` with each host-side interface's MAC (no ``sandbox``) as the host has
    it now, for CHECK's prevResult.

    Neither is the runtime's to keep: a Linux bridge without a MAC of its own takes the
    lowest of its ports' (containernetworking/cni#285), so it changes as other pods come
    and go, and a host veth's can change after ADD returns (containernetworking/plugins
    #805); the bridge plugin's CHECK would then fail a healthy pod. A link that is gone
    keeps its old entry, so CHECK still fails for it; the pod side is left as ADD saw it.
    """
    out = dict(result)
    ifaces = []
    for iface in result.get("interfaces") or []:
        if isinstance(iface, dict) and not iface.get("sandbox") and iface.get("name"):
            mac = mac_of(str(iface["name"]))
            if mac is not None:
                iface = {**iface, "mac": mac}
        ifaces.append(iface)
    if "interfaces" in result:
        out["interfaces"] = ifaces
    return out
