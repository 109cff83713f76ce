"""Pods without a pause process (CRI-O's ``drop_infra_ctr``).

A pod whose containers do not share a PID namespace needs no process of its
own: what they share is its network namespace (pinned by the core), and here
its IPC and UTS namespaces, made by a short-lived thread and pinned with bind
mounts at ``<state>/sandboxes/<id>/ns/{ipc,uts}`` (CRI-O pins them with
``pinns``). The hostname and the pod's sysctls are set inside them before they
are pinned; the pod's containers join them by path. No conmon, no runc. A pod in
a user namespace has that pinned too (``ns/user``), and its IPC and UTS
namespaces are made inside it by a helper process (sandbox/pod_userns.py).

Pins can disappear (an operator's umount): those of ready pods are checked whenever the
node's mount table changes (``watch``), and a pod that lost one is reported, as a pod
whose pause died is.

The pod still gets an (empty) cgroup of its own under its cgroup parent, as
CRI-O makes one for a pod whose infra container it dropped: node agents that
know pods by their sandbox cgroup (the kubelet's cAdvisor) find it there, with a
running container of the pod standing in as its process (``stand_in``).
"""

from __future__ import annotations

import asyncio
import errno
import json
import logging
import os
import shutil
import socket
from collections.abc import Callable, Sequence
from typing import Any

from cri_api.v1 import api_pb2 as pb

from pycrid.errors import Internal, InvalidArgument
from pycrid.faults import failpoint
from pycrid.host import pins
from pycrid.host.mountinfo import MountTableWatch
from pycrid.host.userns import NamespaceRequest, pin_namespaces
from pycrid.oci.security import sysctl_namespace
from pycrid.oci.spec import (
    CgroupDriver,
    Namespaces,
    cgroups_path,
    pod_idmap,
    pod_sysctls,
    pod_userns,
)
from pycrid.oci.spec_mounts import SandboxFiles
from pycrid.operations import beyond_operation
from pycrid.runtime.exits import Exit
from pycrid.runtime.interface import RuncState
from pycrid.sandbox.controller import (
    SandboxAnchor,
    SandboxController,
    SandboxRequest,
    SandboxState,
    SandboxStatus,
)
from pycrid.sandbox.files import NODE_FILES, HostFiles, PodFiles
from pycrid.sandbox.pod_userns import pin_pod_userns
from pycrid.stats.cgroup_hierarchy import Hierarchy, relative_cgroup
from pycrid.store.records import SandboxRecord

log = logging.getLogger(__name__)

#: What the controller is about to make (pins and cgroup directories), written before it
#: makes any of it: a shutdown, also after a crash half-way, knows what to take down.
_LAYOUT = "sandbox.json"
#: Present once the pod is stopped (a pod sharing every namespace with the host has
#: nothing pinned that could tell).
_STOPPED = "stopped"  # the marker file a stopped pod leaves
#: A burst of mount changes (a container's create) is one look at the pins.
_SETTLE = 0.1


def _sethostname(name: str) -> None:
    try:
        socket.sethostname(name)
    except OSError as e:
        raise Internal(f"sethostname {name!r}: {e.strerror}") from None


class PinnedController(SandboxController):
    def __init__(self, *, root_dir: str, state_dir: str, cgroups: Hierarchy,
                 cgroup_driver: CgroupDriver = "cgroupfs",
                 host_files: HostFiles = NODE_FILES) -> None:
        self.pod_files = PodFiles(root_dir, state_dir, host_files)
        self.cgroups = cgroups
        self.cgroup_driver = cgroup_driver
        #: The pid of the container that stands for each pod now (see stand_in).
        self._stand_ins: dict[str, int] = {}
        #: Ready pods' pins, and whom to tell when one is gone (see watch).
        self._watched: dict[str, tuple[list[str], Callable[[str], None]]] = {}
        self._mounts = MountTableWatch(self._mounts_changed)
        self._look: asyncio.TimerHandle | None = None

    # ---- where things are ---------------------------------------------------------------

    def _pin(self, sid: str, kind: str) -> str:
        return os.path.join(self.pod_files.bundle(sid), "ns", kind)

    def _pins(self, config: pb.PodSandboxConfig, sid: str) -> dict[str, str]:
        """The namespaces this pod gets of its own: IPC unless it uses the host's, UTS
        unless it uses the host's network (and so the node's hostname)."""
        opts = config.linux.security_context.namespace_options
        kinds = [k for k, host in (("ipc", opts.ipc == pb.NODE), ("uts", opts.network == pb.NODE))
                 if not host]
        return {k: self._pin(sid, k) for k in kinds}

    def _cgroup_dirs(self, config: pb.PodSandboxConfig, sid: str) -> list[str]:
        """The pod's cgroup in every mounted hierarchy (none with the systemd driver: a
        cgroup there belongs to systemd, and a process-less scope cannot exist)."""
        if self.cgroup_driver == "systemd":
            return []
        rel = relative_cgroup(cgroups_path(config.linux.cgroup_parent, sid, self.cgroup_driver))
        if rel is None:
            return []
        mounts = sorted(set(self.cgroups.v1.values()))
        if self.cgroups.unified is not None:
            mounts.append(self.cgroups.unified)
        return [os.path.join(m, rel) for m in mounts]

    def files(self, sandbox_id: str) -> SandboxFiles:
        return self.pod_files.files(sandbox_id)

    def namespaces(self, rec: SandboxRecord) -> Namespaces:
        pinned = self._pins(rec.config, rec.id)
        opts = rec.config.linux.security_context.namespace_options
        user = self._pin(rec.id, "user") if pod_userns(opts) is not None else None
        return Namespaces(network=rec.netns or None, ipc=pinned.get("ipc"),
                          uts=pinned.get("uts"), user=user)

    # ---- lifecycle ------------------------------------------------------------------------

    async def create(self, req: SandboxRequest) -> None:
        await asyncio.to_thread(self._create, req)

    def _create(self, req: SandboxRequest) -> None:
        sid, config = req.id, req.config
        idmap = pod_idmap(config.linux.security_context.namespace_options)
        self.pod_files.create(sid, config, idmap)
        # ping_group_range may not name groups the pod's user namespace lacks
        # (containerd leaves the default out for such pods).
        sysctls = pod_sysctls(config, unprivileged_icmp=idmap is None)
        ipc = {k: v for k, v in sysctls.items() if sysctl_namespace(k) == "ipc"}
        net = {k: v for k, v in sysctls.items() if sysctl_namespace(k) == "net"}
        pinned = self._pins(config, sid)
        cgroup_dirs = self._cgroup_dirs(config, sid)
        layout_pins = {**pinned, **({"user": self._pin(sid, "user")} if idmap else {})}
        with open(os.path.join(self.pod_files.bundle(sid), _LAYOUT), "w") as f:
            json.dump({"pins": layout_pins, "cgroups": cgroup_dirs}, f)
        if idmap is not None:
            # The pod's IPC and UTS namespaces must be its user namespace's: a helper
            # process joins that one, then unshares them (host/userns.py).
            user = pin_pod_userns(self.pod_files.bundle(sid), req.netns, idmap)
            if pinned:
                pin_namespaces(NamespaceRequest(
                    pins=pinned, user=user, join={"net": req.netns} if req.netns else {},
                    new=tuple(pinned), hostname=config.hostname if "uts" in pinned else "",
                    sysctls={**ipc, **net}))
            failpoint("sandbox.pinned")
            return

        def inside() -> None:
            if "uts" in pinned and config.hostname:
                _sethostname(config.hostname)
            pins.write_sysctls(ipc)
            pins.write_sysctls(net)  # the thread joined the pod's netns first

        # A pod with net.* sysctls has a network, and so a UTS namespace of its own to pin.
        if pinned:
            pins.pin_new(pinned, inside, join={"net": req.netns} if net and req.netns else None)
        failpoint("sandbox.pinned")

    async def start(self, sandbox_id: str) -> int:
        return 0  # nothing runs: the pins hold the namespaces

    async def stop(self, sandbox_id: str, grace: float = 0) -> None:
        """The pod's containers are gone: release its IPC/UTS namespaces and /dev/shm
        (CRI-O drops the pinned namespaces at stop too)."""
        self._watched.pop(sandbox_id, None)  # unpinned on purpose: no loss
        await asyncio.to_thread(self._stop, sandbox_id)

    # ---- pins that disappear ------------------------------------------------------------

    async def watch(self, sandbox_id: str, lost: Callable[[str], None]) -> Exit | None:
        """``lost(sandbox_id)`` once any of the pod's pins is gone (nothing to watch for
        a pod that shares every namespace with the host but the network's, which the
        core watches as the pod's netns)."""
        paths = list(((self._layout(sandbox_id) or {}).get("pins") or {}).values())
        if paths:
            self._watched[sandbox_id] = (paths, lost)
            beyond_operation(self._mounts.start)  # outlives the RunPodSandbox here
            self._look_at_pins()
        return None

    def close(self) -> None:
        self._mounts.close()
        if self._look is not None:
            self._look.cancel()
            self._look = None

    def _mounts_changed(self) -> None:
        if self._look is None:
            self._look = asyncio.get_running_loop().call_later(_SETTLE, self._look_at_pins)

    def _look_at_pins(self) -> None:
        self._look = None
        for sid, (paths, lost) in list(self._watched.items()):
            if not all(pins.is_pinned(p) for p in paths):
                del self._watched[sid]
                log.warning("pod sandbox %s: a pinned namespace is gone (%s)", sid,
                            ", ".join(p for p in paths if not pins.is_pinned(p)))
                lost(sid)

    def stand_in(self, sandbox: SandboxRecord, pid: int) -> None:
        """The pod's cgroup exists while one of its containers stands for it, and is made
        anew whenever another one does: the kubelet's cAdvisor asks for a sandbox's pid
        once, when its cgroup appears, and keeps it (google/cadvisor#3577, where CRI-O's
        pods without infra lose their network stats for good)."""
        if self._stand_ins.get(sandbox.id) == pid:
            return
        dirs = (self._layout(sandbox.id) or {}).get("cgroups") or []
        _remove_dirs(dirs)
        if pid:
            for d in dirs:
                os.makedirs(d, exist_ok=True)
        self._stand_ins[sandbox.id] = pid

    def _stop(self, sid: str) -> None:
        self._stand_ins.pop(sid, None)
        _remove_dirs((self._layout(sid) or {}).get("cgroups") or [])
        bundle = self.pod_files.bundle(sid)
        if os.path.isdir(bundle):
            with open(os.path.join(bundle, _STOPPED), "w"):
                pass
        for kind in ("ipc", "uts", "user"):
            pins.unpin(self._pin(sid, kind))
        self.pod_files.release_shm(sid)

    def _layout(self, sid: str) -> dict[str, Any] | None:
        try:
            with open(os.path.join(self.pod_files.bundle(sid), _LAYOUT)) as f:
                layout: dict[str, Any] = json.load(f)
                return layout
        except (OSError, ValueError):
            return None

    def _state(self, sid: str) -> SandboxState:
        """running until stopped, while every namespace pinned at create still is."""
        layout = self._layout(sid)
        if layout is None or os.path.exists(os.path.join(self.pod_files.bundle(sid), _STOPPED)):
            return SandboxState.STOPPED
        pinned = layout.get("pins") or {}
        alive = all(pins.is_pinned(p) for p in pinned.values())
        return SandboxState.RUNNING if alive else SandboxState.STOPPED

    async def status(self, sandbox_id: str, verbose: bool = False) -> SandboxStatus:
        return self.recovered_status(sandbox_id, {})

    def recovered_status(self, sandbox_id: str,
                         runtime_states: dict[str, RuncState]) -> SandboxStatus:
        return SandboxStatus(sandbox_id, 0, self._state(sandbox_id))

    async def shutdown(self, sandbox_id: str) -> Sequence[str]:
        self._watched.pop(sandbox_id, None)
        await asyncio.to_thread(self._shutdown, sandbox_id)
        return ()  # no snapshot

    def _shutdown(self, sid: str) -> None:
        self._stop(sid)
        self.pod_files.remove(sid)
        shutil.rmtree(self.pod_files.bundle(sid), ignore_errors=True)

    def exited(self, sandbox_id: str, exit_: Exit) -> None:
        pass  # no process, no exit

    def anchor(self, sandbox: SandboxRecord) -> SandboxAnchor:
        """Its empty cgroup (none with the systemd driver), and no process of its own: the
        core lets a running container of the pod stand in (core/anchors.py)."""
        try:
            made = bool(self._cgroup_dirs(sandbox.config, sandbox.id))
            path = (cgroups_path(sandbox.config.linux.cgroup_parent, sandbox.id,
                                 self.cgroup_driver) if made else "")
        except InvalidArgument:  # a parent that does not fit the driver: none was made
            path = ""
        return SandboxAnchor(cgroups_path=path, pid=0, spec="")


def _remove_dirs(dirs: list[str]) -> None:
    """The pod's empty cgroup (its containers' cgroups are their own, beside it)."""
    for d in dirs:
        try:
            os.rmdir(d)
        except FileNotFoundError:
            pass
        except OSError as e:
            if e.errno != errno.EBUSY:
                raise
            log.warning("pod cgroup %s still in use; left in place", d)
