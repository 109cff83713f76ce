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
import signal
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from pycrid.errors import InvalidArgument, NotFound
from pycrid.faults import failpoint, step
from pycrid.host import space
from pycrid.host.idmap import IDMap
from pycrid.images.snapshots import Snapshotter
from pycrid.oci.resources import with_sandbox_shares
from pycrid.oci.sandbox_spec import SandboxSpecRequest, sandbox_spec
from pycrid.oci.spec import Namespaces, cgroups_path, pod_idmap, pod_userns
from pycrid.oci.spec_inputs import (
    DEFAULT_HOST,
    DEFAULT_POLICY,
    HandlerOptions,
    HostInput,
    ImageInput,
    SpecPolicy,
)
from pycrid.oci.spec_mounts import SandboxFiles
from pycrid.runtime.bundle import (
    prepare_rootfs,
    read_etc,
    read_spec,
    remove_bundle,
    write_spec,
)
from pycrid.runtime.exits import Exit, ExitWaiters
from pycrid.runtime.handlers import HandlerSpec
from pycrid.runtime.interface import ContainerRuntime, CreateOptions, RuncState, RuncStatus
from pycrid.runtime.mapped_rootfs import RootfsMapping
from pycrid.sandbox.controller import (
    SandboxAnchor,
    SandboxController,
    SandboxRequest,
    SandboxState,
    SandboxStatus,
)
from pycrid.sandbox.files import PodFiles
from pycrid.sandbox.pod_userns import pin_pod_userns, unpin_pod_userns, user_pin
from pycrid.store.records import SandboxRecord

log = logging.getLogger(__name__)




class PauseController(SandboxController):
    def __init__(self, *, runtime: ContainerRuntime, snapshotter: Snapshotter, root_dir: str,
                 state_dir: str, handlers: Mapping[str, HandlerSpec] | None = None,
                 host: HostInput = DEFAULT_HOST, policy: SpecPolicy = DEFAULT_POLICY,
                 slow_chown: bool = False) -> None:
        self.runtime = runtime
        #: A chowned copy of the pause image where idmapped layers fail (user namespaces).
        self.slow_chown = slow_chown
        #: Spec options by runtime handler (base spec, annotation pass-through).
        self.handlers = dict(handlers or {})
        #: Created sandboxes not started yet, with their handler.
        self._handler_of: dict[str, str] = {}
        self.snapshotter = snapshotter
        self.pod_files = PodFiles(root_dir, state_dir)
        #: The host's facts (probed once, by the daemon) and the node's spec policy.
        self.host = host
        self.policy = policy
        self.waiters = ExitWaiters(runtime.exit_of)

    def bundle(self, sid: str) -> str:
        return self.pod_files.bundle(sid)

    def files(self, sandbox_id: str) -> SandboxFiles:
        return self.pod_files.files(sandbox_id)

    # ---- lifecycle ---------------------------------------------------------------------

    async def create(self, req: SandboxRequest) -> None:
        await asyncio.to_thread(self._create, req)

    def _create(self, req: SandboxRequest) -> None:
        sid, config = req.id, req.config
        idmap = pod_idmap(config.linux.security_context.namespace_options)
        self.pod_files.create(sid, config, idmap)
        bundle = self.bundle(sid)
        with space.writing(f"the rootfs and spec of the pause of pod sandbox {sid}", bundle):
            self._bundle(req, bundle, idmap)

    def _bundle(self, req: SandboxRequest, bundle: str, idmap: IDMap | None) -> None:
        sid, config = req.id, req.config
        userns, mapping = "", None
        if idmap is not None:
            userns = pin_pod_userns(bundle, req.netns, idmap)
            mapping = RootfsMapping(idmap, userns, self.slow_chown, stage="sandbox")
        rootfs = prepare_rootfs(self.snapshotter, sid, req.image_chain_top, bundle, mapping)
        failpoint("sandbox.rootfs")
        handler = self.handlers.get(req.runtime_handler)
        spec = sandbox_spec(
            SandboxSpecRequest(config, sid, pause_image=req.image_name,
                               files=self.files(sid), netns_path=req.netns,
                               userns_path=userns),
            ImageInput(req.image_config, etc_passwd=read_etc(rootfs, "passwd"),
                       etc_group=read_etc(rootfs, "group")),
            host=self.host, policy=self.policy,
            handler=HandlerOptions(base_spec=handler.base_spec if handler else None,
                                   pod_annotations=handler.pod_annotations if handler else ()))
        if handler is None or not handler.sandboxed:
            with_sandbox_shares(spec)  # cpu.shares 2, as containerd's pause
        # A gVisor pause's cgroup holds the whole pod's sandbox: no pause-sized limits
        # (gVisor's shim moves the sandbox to the pod's cgroup for the same reason).
        write_spec(bundle, spec)
        self._handler_of[sid] = req.runtime_handler
        failpoint("sandbox.spec")

    async def start(self, sandbox_id: str) -> int:
        pid = await self.runtime.create(CreateOptions(
            id=sandbox_id, bundle=self.bundle(sandbox_id), name=f"pause-{sandbox_id[:12]}",
            runtime_handler=self._handler_of.pop(sandbox_id, "")))
        await step("sandbox.created")
        await self.runtime.start(sandbox_id)
        await step("sandbox.started")
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
        await asyncio.to_thread(self._release, sandbox_id)

    def _release(self, sandbox_id: str) -> None:
        """What a stopped pod no longer needs: /dev/shm and its user namespace."""
        self.pod_files.release_shm(sandbox_id)
        unpin_pod_userns(self.bundle(sandbox_id))

    async def status(self, sandbox_id: str, verbose: bool = False) -> SandboxStatus:
        state = await self.runtime.state(sandbox_id)
        info: dict[str, Any] = {}
        if verbose and state is not None:
            info["runtimeState"] = state.raw
            with contextlib.suppress(NotFound):
                info["runtimeSpec"] = read_spec(self.bundle(sandbox_id))
        return self._status(sandbox_id, state, info)

    def recovered_status(self, sandbox_id: str,
                         runtime_states: dict[str, RuncState]) -> SandboxStatus:
        return self._status(sandbox_id, runtime_states.get(sandbox_id), {})

    def _status(self, sandbox_id: str, state: RuncState | None,
                info: dict[str, Any]) -> SandboxStatus:
        exit_ = self.runtime.exit_of(sandbox_id)
        if state is None:
            return SandboxStatus(sandbox_id, 0, SandboxState.UNKNOWN, exit_)
        alive = state.status in (RuncStatus.RUNNING, RuncStatus.CREATED)
        return SandboxStatus(sandbox_id, state.pid,
                             SandboxState.RUNNING if alive else SandboxState.STOPPED, exit_, info)

    async def shutdown(self, sandbox_id: str) -> Sequence[str]:
        self._handler_of.pop(sandbox_id, None)  # created, never started
        await self.runtime.delete(sandbox_id)
        released = await asyncio.to_thread(remove_bundle, self.snapshotter, sandbox_id,
                                           self.bundle(sandbox_id))
        await asyncio.to_thread(self.pod_files.remove, sandbox_id)
        self.runtime.forget_exit(sandbox_id)
        return released

    def exited(self, sandbox_id: str, exit_: Exit) -> None:
        self.waiters.notify(exit_)

    async def watch(self, sandbox_id: str, lost: Callable[[str], None]) -> Exit | None:
        """Its conmon, watched since the pause was created (the runtime handles its
        death): armed again after a restart, or, found dead, handled now."""
        bundle = self.bundle(sandbox_id)
        if self.runtime.exit_of(sandbox_id) is not None or \
                self.runtime.watch(sandbox_id, bundle):
            return None
        return await self.runtime.monitor_lost(sandbox_id, bundle, reason="Unknown")

    def stand_in(self, sandbox: SandboxRecord, pid: int) -> None:
        pass  # the pause stands for its pod

    def namespaces(self, rec: SandboxRecord) -> Namespaces:
        """Everything through the pause's /proc/<pid>/ns (a namespace the pause took from
        the host is the host's there too), but the user namespace: its pin."""
        def at(kind: str) -> str:
            return f"/proc/{rec.pid}/ns/{kind}"

        opts = rec.config.linux.security_context.namespace_options
        user = user_pin(self.bundle(rec.id)) if pod_userns(opts) is not None else None
        return Namespaces(network=at("net"), ipc=at("ipc"), uts=at("uts"), pid=at("pid"),
                          user=user)

    def anchor(self, sandbox: SandboxRecord) -> SandboxAnchor:
        """The pause: its cgroup, its pid while it lives, its bundle's spec."""
        try:
            path = cgroups_path(sandbox.config.linux.cgroup_parent, sandbox.id,
                                self.policy.cgroup_driver)
        except InvalidArgument:  # a parent that no longer fits the driver: no cgroup known
            path = ""
        pid = 0
        if sandbox.ready:
            pid = sandbox.pid
        elif sandbox.creating:
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

