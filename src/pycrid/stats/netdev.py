"""Pod network counters from ``/proc/<pid>/net/dev``.

That file lists the interfaces of the network namespace the process is in, so
reading it through the pause process gives the pod's counters without entering
the namespace (containerd does a setns and asks netlink; the numbers are the same).
"""

from __future__ import annotations

from dataclasses import dataclass

#: The interface CNI names for the pod's primary network (CRI NetworkUsage.default_interface).
DEFAULT_INTERFACE = "eth0"


@dataclass(frozen=True)
class InterfaceCounters:
    name: str
    rx_bytes: int = 0
    rx_packets: int = 0
    rx_errors: int = 0
    rx_dropped: int = 0
    tx_bytes: int = 0
    tx_packets: int = 0
    tx_errors: int = 0
    tx_dropped: int = 0


def parse_net_dev(text: str) -> list[InterfaceCounters]:
    """Every interface but loopback, in file order. The first two lines are headers; each
    other line is ``name: rx(bytes packets errs drop fifo frame compressed multicast)
    tx(bytes packets errs drop fifo colls carrier compressed)``."""
    out: list[InterfaceCounters] = []
    for line in text.splitlines():
        name, sep, rest = line.partition(":")
        name = name.strip()
        if not sep or not name or "|" in line or name == "lo":
            continue
        try:
            v = [int(x) for x in rest.split()]
        except ValueError:
            continue
        if len(v) < 12:
            continue
        out.append(InterfaceCounters(name=name, rx_bytes=v[0], rx_packets=v[1], rx_errors=v[2],
                                     rx_dropped=v[3], tx_bytes=v[8], tx_packets=v[9],
                                     tx_errors=v[10], tx_dropped=v[11]))
    return out


def default_interface(ifaces: list[InterfaceCounters]) -> InterfaceCounters | None:
    """eth0, else the first interface (containerd's choice)."""
    for i in ifaces:
        if i.name == DEFAULT_INTERFACE:
            return i
    return ifaces[0] if ifaces else None


def read_net_dev(pid: int, proc: str = "/proc") -> list[InterfaceCounters] | None:
    """The counters of ``pid``'s network namespace; None when the process is gone."""
    try:
        with open(f"{proc}/{pid}/net/dev") as f:
            return parse_net_dev(f.read())
    except (FileNotFoundError, ProcessLookupError):
        return None
    except OSError:
        return None


__all__ = ["DEFAULT_INTERFACE", "InterfaceCounters", "default_interface", "parse_net_dev",
           "read_net_dev"]
