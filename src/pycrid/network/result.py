"""Pod IPs out of CNI results, whatever spec version the plugin answered in.

Results before 0.3.0 carry ``ip4``/``ip6`` objects; later ones an ``ips`` list whose
entries point at the interface they belong to. The pod's IPs are those of its
``eth0`` (containerd's default interface), the primary one chosen by ``ip_pref``
as containerd's selectPodIPs does.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping, Sequence
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
