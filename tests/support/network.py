"""The pod network of test daemons, and the host state CNI plugins touch.

Every test daemon gets its own CNI conf dir with one conflist: Debian's bridge,
host-local and portmap plugins. Each daemon (known by its base dir, so a restarted
daemon keeps its network) gets its own bridge ``pcrtN``, its own /24 inside
10.199.0.0/16 and its own host-local store, so daemons running at the same time
never share an address (the bridge plugin allows one gateway per bridge). Pod
traffic stays on the host: no IP masquerade, and no route beyond the pod subnet.

Suites run side by side on one machine share the 250 bridges; ``PYCRID_TEST_BRIDGE`` and
``PYCRID_TEST_SUBNET`` (``pcrt`` and ``10.199`` by default) give one a pool of its own.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import socket
import subprocess
import time
from collections.abc import Collection
from typing import Any

BRIDGE_PREFIX = os.environ.get("PYCRID_TEST_BRIDGE", "pcrt")
SUBNET_PREFIX = os.environ.get("PYCRID_TEST_SUBNET", "10.199")
CNI_SECTION = '[plugins."pycrid.cri.v1.runtime".cni]'
BIN_DIRS = ["/usr/lib/cni", "/opt/cni/bin"]
_subnets: dict[str, int] = {}
#: How long a daemon waits for one of the 250 bridge names when other test processes on
#: the host hold them all.
BRIDGE_WAIT = 240.0  # within the 300 s a test may take (pyproject.toml)
_configured: set[str] = set()
#: The alias this process gives the bridges it claims.
_MARK = f"pycrid-test-{os.getpid()}-{secrets.token_hex(4)}"


def _index(base: str) -> int:
    """The daemon's network number: claimed by creating bridge ``pcrtN`` (atomic, so two
    processes, e.g. a benchmark run by a test, never pick the same one)."""
    if base in _subnets:
        return _subnets[base]
    # The 250 names are the host's: test processes running at once (several checkouts'
    # suites) may hold them all for a while; each gives its own back when it ends.
    deadline = time.monotonic() + BRIDGE_WAIT
    while True:
        for n in range(1, 251):
            if n in _subnets.values():
                continue
            r = subprocess.run(["ip", "link", "add", f"{BRIDGE_PREFIX}{n}", "type", "bridge"],
                               capture_output=True, check=False)
            if r.returncode == 0:
                # Marked as this process's: it deletes only bridges still carrying its mark.
                subprocess.run(["ip", "link", "set", f"{BRIDGE_PREFIX}{n}", "alias", _MARK],
                               capture_output=True, check=False)
                _subnets[base] = n
                return n
        if time.monotonic() > deadline:
            raise RuntimeError(f"no free test bridge {BRIDGE_PREFIX}1..{BRIDGE_PREFIX}250 for "
                               f"{BRIDGE_WAIT:.0f} s")
        time.sleep(2)


def release(base: str) -> None:
    """Give back the bridge and subnet of the daemon under ``base`` once it is stopped (the
    end of its test), so that the fault matrices, a daemon per case, do not use up the
    250 test networks a session (and whatever else runs on the machine) shares. A network
    with a pod's veth or IP still on it is kept for the session's leak check to report."""
    n = _subnets.get(base)
    if n is None or veths({f"{BRIDGE_PREFIX}{n}"}) or allocated_ips(base):
        return
    del _subnets[base]
    _configured.discard(base)
    name = f"{BRIDGE_PREFIX}{n}"
    shown = subprocess.run(["ip", "-o", "link", "show", name], capture_output=True,
                           text=True, check=False).stdout
    if f"alias {_MARK}" in shown:
        subprocess.run(["ip", "link", "del", name], capture_output=True, check=False)


def release_under(top: str) -> None:
    """:func:`release` for every daemon base at or below ``top`` (a test's ``tmp_path``)."""
    top = top.rstrip("/")
    for base in [b for b in _subnets if b == top or b.startswith(top + "/")]:
        release(base)


def subnet_of(base: str) -> str:
    return f"{SUBNET_PREFIX}.{_index(base)}.0/24"


def bridge_of(base: str) -> str:
    return f"{BRIDGE_PREFIX}{_index(base)}"


def daemon_bases() -> list[str]:
    """Base dirs of every daemon given a test network in this process."""
    return list(_subnets)


def ipam_dir(base: str) -> str:
    return os.path.join(base, "cni-ipam")


def conf_dir(base: str) -> str:
    return os.path.join(base, "cni", "net.d")


def test_conflist(base: str, name: str = "pycrid-test", **extra: Any) -> dict[str, Any]:
    """The default test network as a conflist document (callers may change it)."""
    return {
        "cniVersion": "1.0.0", "name": name,
        "plugins": [
            {"type": "bridge", "bridge": bridge_of(base), "isGateway": True, "ipMasq": False,
             "hairpinMode": True,
             "ipam": {"type": "host-local", "ranges": [[{"subnet": subnet_of(base)}]],
                      "dataDir": ipam_dir(base)}},
            {"type": "portmap", "capabilities": {"portMappings": True}},
        ],
        **extra,
    }


def write_conflist(directory: str, doc: dict[str, Any], name: str = "10-test.conflist") -> str:
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, name)
    tmp = os.path.join(directory, f".{name}.tmp")
    with open(tmp, "w") as f:
        json.dump(doc, f)
    os.replace(tmp, path)
    return path


def with_private_cni(config_text: str, base: str) -> str:
    """Give a test daemon its own CNI conf dir holding the test network, unless the
    config already has a CNI section (then the test manages it)."""
    if CNI_SECTION in config_text:
        return config_text
    # Once, and never over a file the test wrote: a restarted daemon finds what it left.
    if base not in _configured:
        _configured.add(base)
        if not os.path.exists(os.path.join(conf_dir(base), "10-test.conflist")):
            write_conflist(conf_dir(base), test_conflist(base))
    return (f"{config_text.rstrip()}\n{CNI_SECTION}\nconf_dir = \"{conf_dir(base)}\"\n"
            f"bin_dirs = {json.dumps(BIN_DIRS)}\n")


def allocated_ips(base: str) -> list[str]:
    """Addresses host-local still holds in ``base``'s store (its bookkeeping files aside)."""
    out = []
    root = ipam_dir(base)
    for dirpath, _dirs, files in os.walk(root):
        out += [os.path.join(dirpath, f) for f in files
                if f != "lock" and not f.startswith("last_reserved_ip")]
    return out


# ---- host state, for the session's leak check ----------------------------------------------


def veths(bridges: Collection[str] | None = None) -> set[str]:
    """veth interfaces on the host; with ``bridges``, only those enslaved to one of them
    (the host ends of this process's pods: another runtime's pods have their own)."""
    out = subprocess.run(["ip", "-o", "link", "show", "type", "veth"], capture_output=True,
                         text=True, check=False).stdout
    found = set()
    for line in out.splitlines():
        if ":" not in line:
            continue
        words = line.split()
        master = words[words.index("master") + 1] if "master" in words else ""
        if bridges is None or master in bridges:
            found.add(line.split(":")[1].strip().split("@")[0])
    return found


def our_bridges() -> set[str]:
    """The bridges of every daemon given a test network in this process."""
    return {bridge_of(base) for base in daemon_bases()}


def nat_rules() -> list[str]:
    out = subprocess.run(["iptables-save", "-t", "nat"], capture_output=True, text=True,
                         check=False).stdout
    return [line for line in out.splitlines() if line.startswith(("-A", ":"))]


def pod_nat_rules(ids: Collection[str] | None = None) -> list[str]:
    """Rules a pod's port mappings put in (their per-pod CNI-DN chains and jumps); with
    ``ids``, only those of these pods or of this process's test subnets, and the chains
    those rules jump to (another runtime's pods have rules of their own)."""
    rules = [r for r in nat_rules() if "CNI-DN-" in r or SUBNET_PREFIX + "." in r]
    if ids is None:
        return rules
    subnets = [subnet_of(base).rsplit(".", 1)[0] + "." for base in daemon_bases()]
    ours = [r for r in rules if any(s in r for s in subnets) or any(i in r for i in ids)]
    chains = {w for r in ours for w in r.split() if w.startswith("CNI-DN-")}
    return [r for r in rules if r in ours or any(c in r.split() or f":{c}" in r
                                                  for c in chains)]


_SCAFFOLD = [
    ("PREROUTING", ["-m", "addrtype", "--dst-type", "LOCAL", "-j", "CNI-HOSTPORT-DNAT"]),
    ("OUTPUT", ["-m", "addrtype", "--dst-type", "LOCAL", "-j", "CNI-HOSTPORT-DNAT"]),
    ("POSTROUTING", ["-m", "comment", "--comment", "CNI portfwd requiring masquerade", "-j",
                     "CNI-HOSTPORT-MASQ"]),
]


def remove_portmap_scaffolding() -> None:
    """Drop the shared chains the portmap plugin creates on first use (it never removes
    them), so the session leaves the nat table as it found it; not while any pod's
    mapping still jumps from them (another runtime's, on a busy node)."""
    if any(r.startswith("-A CNI-HOSTPORT-DNAT ") for r in nat_rules()):
        return
    for chain, rule in _SCAFFOLD:
        subprocess.run(["iptables", "-t", "nat", "-D", chain, *rule], capture_output=True,
                       check=False)
    for chain in ("CNI-HOSTPORT-DNAT", "CNI-HOSTPORT-SETMARK", "CNI-HOSTPORT-MASQ"):
        subprocess.run(["iptables", "-t", "nat", "-F", chain], capture_output=True, check=False)
        subprocess.run(["iptables", "-t", "nat", "-X", chain], capture_output=True, check=False)


def remove_bridges() -> None:
    """Delete the bridges of every daemon of this process (tests, benchmarks): those that
    still carry this process's mark (one deleted meanwhile may be another's by now)."""
    for base in daemon_bases():
        name = bridge_of(base)
        shown = subprocess.run(["ip", "-o", "link", "show", name], capture_output=True,
                               text=True, check=False).stdout
        if f"alias {_MARK}" in shown:
            subprocess.run(["ip", "link", "del", name], capture_output=True, check=False)


def ip_forward() -> str:
    with open("/proc/sys/net/ipv4/ip_forward") as f:
        return f.read().strip()


def set_ip_forward(value: str) -> None:
    with contextlib.suppress(OSError), open("/proc/sys/net/ipv4/ip_forward", "w") as f:
        f.write(value)


def http_get(port: int) -> bytes:
    """The whole answer to ``GET /`` on 127.0.0.1:``port`` (HTTP/1.0: the server closes)."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as conn:
        conn.sendall(b"GET / HTTP/1.0\r\n\r\n")
        response = bytearray()
        while chunk := conn.recv(65536):
            response += chunk
    return bytes(response)
