"""The pause-container sandbox controller (containerd's ``podsandbox`` controller).

A pod is a pause process in new ipc/uts (and optionally pid) namespaces,
joining the network namespace the core made; the pod's containers join its
namespaces through ``/proc/<pause pid>/ns``. On disk (CRI-TO-OCI.md §1.5):
``<root>/sandboxes/<id>/{hostname,hosts,resolv.conf}`` and the bundle
``<state>/sandboxes/<id>/`` with ``config.json``, ``rootfs`` and the ``shm``
tmpfs the pod's containers share.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import platform
import shutil
import signal
import socket
from collections.abc import Mapping
from typing import Any

from cri_api.v1 import api_pb2 as pb

from pycrid.errors import InvalidArgument, NotFound, Unimplemented
from pycrid.faults import failpoint
from pycrid.images.mount import mount, unmount
from pycrid.images.snapshots import Mount, Snapshotter
from pycrid.oci.mounts import SandboxFiles
from pycrid.oci.resources import with_sandbox_shares
from pycrid.oci.security import host_security
from pycrid.oci.spec import CgroupDriver, cgroups_path, sandbox_spec
from pycrid.runtime.bundle import (
    prepare_rootfs,
    read_etc,
    read_spec,
    remove_bundle,
    write_spec,
)
from pycrid.runtime.exits import Exit, ExitWaiters
from pycrid.runtime.handlers import HandlerSpec
from pycrid.runtime.interface import ContainerRuntime, CreateOptions
from pycrid.sandbox.controller import (
    SandboxAnchor,
    SandboxController,
    SandboxRequest,
    SandboxStatus,
)
from pycrid.store.pods import CREATING, SandboxRecord

log = logging.getLogger(__name__)

#: /dev/shm of a pod: one 64 MiB tmpfs shared by its containers (§1.5).
SHM_OPTIONS = ("nosuid", "nodev", "noexec", "mode=1777", "size=67108864")
_ARCH = {"x86_64": "amd64", "aarch64": "arm64"}


def own_oom_score_adj() -> int:
    """The lowest oom_score_adj we may give a child without CAP_SYS_RESOURCE."""
    try:
        with open("/proc/self/oom_score_adj") as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return 0


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


class PauseController(SandboxController):
    def __init__(self, *, runtime: ContainerRuntime, snapshotter: Snapshotter, root_dir: str,
                 state_dir: str, cgroup_driver: CgroupDriver = "auto",
                 hosts_file: str = "/etc/hosts", resolv_file: str = "/etc/resolv.conf",
                 handlers: Mapping[str, HandlerSpec] | None = None,
                 unset_seccomp_profile: str = "") -> None:
        self.runtime = runtime
        #: Spec options by runtime handler (base spec, annotation pass-through).
        self.handlers = dict(handlers or {})
        #: Created sandboxes not started yet, with their handler.
        self._handler_of: dict[str, str] = {}
        self.snapshotter = snapshotter
        self.root_dir = os.path.join(root_dir, "sandboxes")
        self.state_dir = os.path.join(state_dir, "sandboxes")
        self.cgroup_driver = cgroup_driver
        self.hosts_file = hosts_file
        self.resolv_file = resolv_file
        self.waiters = ExitWaiters(runtime.exit_of)
        self.min_oom_score_adj = own_oom_score_adj()
        self.host_security = host_security()  # probed once
        self.unset_seccomp_profile = unset_seccomp_profile
        for d in (self.root_dir, self.state_dir):
            os.makedirs(d, mode=0o711, exist_ok=True)

    def _files_dir(self, sid: str) -> str:
        return os.path.join(self.root_dir, sid)

    def bundle(self, sid: str) -> str:
        return os.path.join(self.state_dir, sid)

    def files(self, sandbox_id: str) -> SandboxFiles:
        d = self._files_dir(sandbox_id)
        shm = os.path.join(self.bundle(sandbox_id), "shm")

        def existing(p: str) -> str | None:
            return p if os.path.exists(p) else None

        return SandboxFiles(hostname=existing(os.path.join(d, "hostname")),
                            hosts=existing(os.path.join(d, "hosts")),
                            resolv_conf=existing(os.path.join(d, "resolv.conf")),
                            shm=existing(shm))

    # ---- lifecycle ---------------------------------------------------------------------

    async def create(self, req: SandboxRequest) -> None:
        await asyncio.to_thread(self._create, req)

    def _create(self, req: SandboxRequest) -> None:
        sid, config = req.id, req.config
        files_dir = self._files_dir(sid)
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
        if config.linux.security_context.namespace_options.ipc != pb.NODE:
            shm = os.path.join(bundle, "shm")
            os.mkdir(shm, 0o700)
            mount(Mount("tmpfs", "shm", SHM_OPTIONS), shm)
        failpoint("sandbox.shm")

        rootfs = prepare_rootfs(self.snapshotter, sid, req.image_chain_top, bundle)
        failpoint("sandbox.rootfs")
        handler = self.handlers.get(req.runtime_handler)
        spec = sandbox_spec(
            config, req.image_config, sandbox_id=sid, pause_image=req.image_name,
            files=self.files(sid), netns_path=req.netns,
            etc_passwd=read_etc(rootfs, "passwd"), etc_group=read_etc(rootfs, "group"),
            cgroup_driver=self.cgroup_driver, min_oom_score_adj=self.min_oom_score_adj,
            base_spec=handler.base_spec if handler else None,
            pod_annotation_globs=handler.pod_annotations if handler else (),
            host_security=self.host_security, unset_seccomp_profile=self.unset_seccomp_profile)
        with_sandbox_shares(spec)  # cpu.shares 2, as containerd's pause
        write_spec(bundle, spec)
        self._handler_of[sid] = req.runtime_handler
        failpoint("sandbox.spec")

    async def start(self, sandbox_id: str) -> int:
        pid = await self.runtime.create(CreateOptions(
            id=sandbox_id, bundle=self.bundle(sandbox_id), name=f"pause-{sandbox_id[:12]}",
            runtime_handler=self._handler_of.pop(sandbox_id, "")))
        failpoint("sandbox.created")
        await self.runtime.start(sandbox_id)
        failpoint("sandbox.started")
        return pid

    async def stop(self, sandbox_id: str, grace: float = 0) -> None:
        """SIGKILL the pause process (§4: the pause is always killed), wait, drop /dev/shm.

        A pause whose exit conmon has already recorded (a second StopPodSandbox, or the
        stop inside RemovePodSandbox) is not signalled again: that was a ``runc kill``
        spawned for nothing."""
        if self.runtime.exit_of(sandbox_id) is None and \
                await self.runtime.kill(sandbox_id, signal.SIGKILL):
            if await self.waiters.wait(sandbox_id, 30) is None:
                log.warning("pause process of sandbox %s did not exit 30s after SIGKILL",
                            sandbox_id)
        shm = os.path.join(self.bundle(sandbox_id), "shm")
        if os.path.ismount(shm):
            await asyncio.to_thread(unmount, shm, detach=True)

    async def wait(self, sandbox_id: str) -> Exit:
        exit_ = await self.waiters.wait(sandbox_id)
        assert exit_ is not None
        return exit_

    async def status(self, sandbox_id: str, verbose: bool = False) -> SandboxStatus:
        state = await self.runtime.state(sandbox_id)
        info: dict[str, Any] = {}
        if verbose and state is not None:
            info["runtimeState"] = state
            with contextlib.suppress(NotFound):
                info["runtimeSpec"] = read_spec(self.bundle(sandbox_id))
        return self._status(sandbox_id, state, info)

    def recovered_status(self, sandbox_id: str,
                         runtime_states: dict[str, dict[str, Any]]) -> SandboxStatus:
        return self._status(sandbox_id, runtime_states.get(sandbox_id), {})

    def _status(self, sandbox_id: str, state: dict[str, Any] | None,
                info: dict[str, Any]) -> SandboxStatus:
        exit_ = self.runtime.exit_of(sandbox_id)
        if state is None:
            return SandboxStatus(sandbox_id, 0, "unknown", exit_)
        status = "running" if state.get("status") in ("running", "created") else "stopped"
        return SandboxStatus(sandbox_id, int(state.get("pid") or 0), status, exit_, info)

    async def shutdown(self, sandbox_id: str) -> None:
        self._handler_of.pop(sandbox_id, None)  # created, never started
        await self.runtime.delete(sandbox_id)
        await asyncio.to_thread(remove_bundle, self.snapshotter, sandbox_id,
                                self.bundle(sandbox_id))
        shutil.rmtree(self._files_dir(sandbox_id), ignore_errors=True)
        self.runtime.forget_exit(sandbox_id)

    def platform(self, sandbox_id: str) -> str:
        machine = platform.machine()
        return f"linux/{_ARCH.get(machine, machine)}"

    async def update(self, sandbox_id: str, resources: pb.LinuxContainerResources) -> None:
        raise Unimplemented("updating pod sandbox resources is not supported yet")

    def exited(self, sandbox_id: str, exit_: Exit) -> None:
        self.waiters.notify(exit_)

    def anchor(self, sandbox: SandboxRecord) -> SandboxAnchor:
        """The pause: its cgroup, its pid while it lives, its bundle's spec."""
        try:
            path = cgroups_path(sandbox.config.linux.cgroup_parent, sandbox.id,
                                self.cgroup_driver)
        except InvalidArgument:  # a parent that no longer fits the driver: no cgroup known
            path = ""
        pid = 0
        if sandbox.ready:
            pid = sandbox.pid
        elif sandbox.phase == CREATING:
            # The pause may run while RunPodSandbox still waits for CNI: the record gets
            # its pid at the end, conmon's pid file has it as soon as runc created it.
            pid = sandbox.pid or _pid_file(os.path.join(self.bundle(sandbox.id), "pidfile"))
        return SandboxAnchor(cgroups_path=path, pid=pid,
                             spec=os.path.join(self.bundle(sandbox.id), "config.json"))


def _pid_file(path: str) -> int:
    try:
        with open(path) as f:
            return int(f.read().strip() or 0)
    except (OSError, ValueError):
        return 0


def _write(path: str, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)
    os.chmod(path, 0o644)
    with contextlib.suppress(OSError):
        os.chown(path, 0, 0)
