"""The files every pod has, whatever holds its namespaces (CRI-TO-OCI.md §1.5).

``<root>/sandboxes/<id>/{hostname,hosts,resolv.conf}``, which the pod's
containers bind-mount, and the pod's directory ``<state>/sandboxes/<id>/``
with the ``shm`` tmpfs they share as /dev/shm (unless the pod uses the host's
IPC namespace, and so the host's /dev/shm).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
from dataclasses import dataclass

from cri_api.v1 import api_pb2 as pb

from pycrid.faults import failpoint
from pycrid.host import space
from pycrid.host.idmap import IDMap
from pycrid.host.mounts import Mount, mount, unmount
from pycrid.host.userns import open_to_mapped_root
from pycrid.oci.spec_mounts import SandboxFiles
from pycrid.sandbox.pod_userns import check_reachable

#: /dev/shm of a pod: one 64 MiB tmpfs shared by its containers (§1.5).
SHM_OPTIONS = ("nosuid", "nodev", "noexec", "mode=1777", "size=67108864")


def resolv_conf(dns: pb.DNSConfig | None, host_file: str = "/etc/resolv.conf") -> bytes:
    """§1.5: the host's file when the pod gives no DNS config, else search/nameserver/options."""
    if dns is None:
        try:
            with open(host_file, "rb") as f:
                return f.read()
        except FileNotFoundError:
            return b""
    lines = []
    if dns.searches:
        lines.append("search " + " ".join(dns.searches))
    lines += [f"nameserver {s}" for s in dns.servers]
    if dns.options:
        lines.append("options " + " ".join(dns.options))
    return "".join(line + "\n" for line in lines).encode()


@dataclass(frozen=True)
class HostFiles:
    """The node's files a pod's own copies start from (tests point them elsewhere)."""

    hosts: str = "/etc/hosts"
    resolv: str = "/etc/resolv.conf"


#: The node's own /etc/hosts and /etc/resolv.conf.
NODE_FILES = HostFiles()


class PodFiles:
    def __init__(self, root_dir: str, state_dir: str,
                 host_files: HostFiles = NODE_FILES) -> None:
        self.root_dir = os.path.join(root_dir, "sandboxes")
        self.state_dir = os.path.join(state_dir, "sandboxes")
        self.hosts_file = host_files.hosts
        self.resolv_file = host_files.resolv
        for d in (self.root_dir, self.state_dir):
            os.makedirs(d, mode=0o711, exist_ok=True)

    def files_dir(self, sid: str) -> str:
        return os.path.join(self.root_dir, sid)

    def bundle(self, sid: str) -> str:
        """The pod's directory under the state dir (the pause's OCI bundle, if it has one)."""
        return os.path.join(self.state_dir, sid)

    def files(self, sid: str) -> SandboxFiles:
        d = self.files_dir(sid)

        def existing(p: str) -> str | None:
            return p if os.path.exists(p) else None

        return SandboxFiles(hostname=existing(os.path.join(d, "hostname")),
                            hosts=existing(os.path.join(d, "hosts")),
                            resolv_conf=existing(os.path.join(d, "resolv.conf")),
                            shm=existing(os.path.join(self.bundle(sid), "shm")))

    def create(self, sid: str, config: pb.PodSandboxConfig, idmap: IDMap | None = None) -> None:
        """Write the pod files, make the pod's directory and mount its /dev/shm; for a pod
        in a user namespace (``idmap``), a directory its root may enter."""
        if idmap is not None:
            check_reachable(self.state_dir, idmap)
        files_dir = self.files_dir(sid)
        with space.writing(f"the files (hostname, hosts, resolv.conf) of pod sandbox {sid}",
                           files_dir):
            self._create(sid, config, files_dir, idmap)

    def _create(self, sid: str, config: pb.PodSandboxConfig, files_dir: str,
                idmap: IDMap | None) -> None:
        os.makedirs(files_dir, mode=0o755)
        hostname = config.hostname or socket.gethostname()
        _write(os.path.join(files_dir, "hostname"), (hostname + "\n").encode())
        with open(self.hosts_file, "rb") as f:
            _write(os.path.join(files_dir, "hosts"), f.read())
        dns = config.dns_config if config.HasField("dns_config") else None
        _write(os.path.join(files_dir, "resolv.conf"), resolv_conf(dns, self.resolv_file))
        failpoint("sandbox.files")
        bundle = self.bundle(sid)
        os.makedirs(bundle, mode=0o700)
        if idmap is not None:
            open_to_mapped_root(bundle, idmap)
        if config.linux.security_context.namespace_options.ipc != pb.NODE:
            shm = os.path.join(bundle, "shm")
            os.mkdir(shm, 0o700)
            mount(Mount("tmpfs", "shm", SHM_OPTIONS), shm)
        failpoint("sandbox.shm")

    def release_shm(self, sid: str) -> None:
        """Unmount /dev/shm at the pod's stop (its containers are gone)."""
        shm = os.path.join(self.bundle(sid), "shm")
        if os.path.ismount(shm):
            unmount(shm, detach=True)

    def remove(self, sid: str) -> None:
        """Everything but what the controller keeps in the pod's directory (idempotent)."""
        self.release_shm(sid)
        shutil.rmtree(self.files_dir(sid), ignore_errors=True)


def _write(path: str, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)
    os.chmod(path, 0o644)
    with contextlib.suppress(OSError):
        os.chown(path, 0, 0)
