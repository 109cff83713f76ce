"""Containers: create, start, stop, remove, status, list, exec-sync.

Each operation is one function that records its intent, does its steps with
their undo pushed on an ``AsyncExitStack`` right after each succeeds, and
records the result (containerd's container_create.go pattern). Exits come
from the exit monitor through ``handle_exit``; every state change is also a
CRI container event (core/events.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import secrets
import shutil
import signal
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from cri_api.v1 import api_pb2 as pb

from pycrid.core import events
from pycrid.core.anchors import PodAnchors
from pycrid.core.events import ContainerEvents
from pycrid.core.nri_objects import resources_from_cri
from pycrid.core.nri_relay import NRI
from pycrid.core.registrar import KeyedLocks, NameRegistrar, resolve_prefix
from pycrid.core.sessions import SessionEnds
from pycrid.cri_fields import set_image_ref
from pycrid.errors import DeadlineExceeded, FailedPrecondition, InvalidArgument, NotFound
from pycrid.faults import failpoint
from pycrid.host.cgroups import probe as probe_cgroups
from pycrid.images.image_service import ImageService
from pycrid.oci.devices import cri_devices, nodes_under
from pycrid.oci.mounts import IMAGE_VOLUME_FAILED, check_image_mount, is_image_mount
from pycrid.oci.resources import (
    ResourcePolicy,
    apply,
    cri_from_nri,
    merge_update,
    record_of,
    update_payload,
    validate,
)
from pycrid.oci.security import host_security, own_capabilities
from pycrid.oci.spec import CgroupDriver, container_spec
from pycrid.runtime.bundle import (
    copy_image_volume,
    prepare_rootfs,
    read_etc,
    read_spec,
    remove_bundle,
    write_spec,
)
from pycrid.runtime.exits import Exit, ExitWaiters
from pycrid.runtime.handlers import HandlerSpec
from pycrid.runtime.image_volumes import mount_image_volume, remove_image_volumes
from pycrid.runtime.interface import ContainerRuntime, CreateOptions, RuncState, RuncStatus
from pycrid.sandbox.controller import SandboxController
from pycrid.sandbox.pause import own_oom_score_adj
from pycrid.store.image_records import ImageRecord
from pycrid.store.records import ContainerPhase, ContainerRecord, RecordStore, SandboxRecord

log = logging.getLogger(__name__)

#: ExecSync keeps at most this much of each stream (containerd's limit).
EXEC_OUTPUT_CAP = 16 * 1024 * 1024
#: How long to wait for an exit after SIGKILL before calling the container lost.
KILL_WAIT = 30.0
#: How many containers start-up recovery works on at once.
RECOVERY_CONCURRENCY = 16


def now_ns() -> int:
    return time.time_ns()


def state_name(state: pb.ContainerState.ValueType) -> str:
    return pb.ContainerState.Name(state)


def parse_signal(value: str) -> str:
    """An image's StopSignal (``SIGINT``, ``INT`` or ``2``) as a signal name."""
    text = value.strip().upper()
    if not text:
        return "SIGTERM"
    if text.isdigit():
        try:
            return signal.Signals(int(text)).name
        except ValueError:
            raise InvalidArgument(f"invalid stop signal {value!r}") from None
    name = text if text.startswith("SIG") else "SIG" + text
    if name not in signal.Signals.__members__:
        raise InvalidArgument(f"invalid stop signal {value!r}")
    return name


def _validate(config: pb.ContainerConfig) -> None:
    if not config.HasField("metadata") or not config.metadata.name:
        raise InvalidArgument("container config must include metadata with a name")
    if not config.image.image:
        raise InvalidArgument(f"container {config.metadata.name!r}: image is not set")


def labels_match(selector: Any, labels: Any) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


@dataclass
class ContainerPaths:
    state_dir: str
    root_dir: str

    def bundle(self, cid: str) -> str:
        return os.path.join(self.state_dir, "containers", cid)

    def volumes(self, cid: str) -> str:
        return os.path.join(self.root_dir, "containers", cid)


class ContainerManager:
    def __init__(self, *, store: RecordStore[ContainerRecord],
                 sandboxes: RecordStore[SandboxRecord], controller: SandboxController,
                 runtime: ContainerRuntime, images: ImageService, paths: ContainerPaths,
                 locks: KeyedLocks, nri: NRI, events: ContainerEvents,
                 cgroup_driver: CgroupDriver = "auto",
                 handlers: Mapping[str, HandlerSpec] | None = None,
                 default_handler: str = "runc",
                 resource_policy: ResourcePolicy | None = None,
                 unset_seccomp_profile: str = "", anchors: PodAnchors | None = None) -> None:
        self.store = store
        self.events = events
        #: Told when a container starts or exits: it may now stand for its pod.
        self.anchors = anchors
        self.sandboxes = sandboxes
        self.controller = controller
        self.runtime = runtime
        self.images = images
        self.paths = paths
        self.locks = locks
        self.nri = nri
        self.cgroup_driver = cgroup_driver
        #: Host cgroup facts (probed once, here at start) and the resource config keys.
        self.resource_policy = resource_policy or ResourcePolicy(probe_cgroups())
        #: Spec options and features of each runtime handler, by name.
        self.handlers = dict(handlers or {})
        self.default_handler = default_handler
        self.names = NameRegistrar("container")
        self.waiters = ExitWaiters(runtime.exit_of)
        self.min_oom_score_adj = own_oom_score_adj()
        #: Security facts of the host (probed once) and the seccomp default.
        self.host_security = host_security()
        self.host_capabilities = own_capabilities()
        self.unset_seccomp_profile = unset_seccomp_profile
        self._stop_signalled: set[str] = set()
        #: Containers whose StartContainer runs: their exit is handled after it (a process
        #: that exits at once must not be STOPPED before it is STARTED).
        self._starting: dict[str, asyncio.Event] = {}
        #: Containers being stopped for an NRI eviction, with the plugin's reason.
        self._evicted: dict[str, str] = {}
        #: Exec and attach sessions (and, by pod id, port-forwards), ended with the object.
        self.sessions = SessionEnds()
        os.makedirs(os.path.join(paths.state_dir, "containers"), mode=0o700, exist_ok=True)
        os.makedirs(os.path.join(paths.root_dir, "containers"), mode=0o700, exist_ok=True)

    # ---- lookups -------------------------------------------------------------------------

    def find(self, prefix: str, *, visible: bool = False) -> ContainerRecord:
        """The container ``prefix`` names; with ``visible``, only among ``store.visible()``."""
        ids = [r.id for r in self.store.visible()] if visible else self.store.ids()
        cid = resolve_prefix(ids, prefix, "container")
        rec = self.store.get(cid)
        assert rec is not None
        return rec

    def of_sandbox(self, sandbox_id: str) -> list[ContainerRecord]:
        return [c for c in self.store.all() if c.sandbox_id == sandbox_id]

    def list(self, flt: pb.ContainerFilter | None) -> list[ContainerRecord]:
        recs = self.store.visible()
        if flt is None:
            return recs
        if flt.id:
            recs = [r for r in recs if r.id.startswith(flt.id)]
        if flt.pod_sandbox_id:
            recs = [r for r in recs if r.sandbox_id.startswith(flt.pod_sandbox_id)]
        if flt.HasField("state"):
            recs = [r for r in recs if r.state == flt.state.state]
        if flt.label_selector:
            recs = [r for r in recs if labels_match(flt.label_selector, r.config.labels)]
        return recs

    # ---- create --------------------------------------------------------------------------

    async def create(self, sandbox_prefix: str, config: pb.ContainerConfig,
                     sandbox_config: pb.PodSandboxConfig | None) -> str:
        _validate(config)
        if not sandbox_prefix:
            raise InvalidArgument("pod_sandbox_id must not be empty")
        sid = self._runnable_sandbox(sandbox_prefix)
        async with self.nri.blocking_sync(), self.locks(sid).read():
            sandbox = self.sandboxes.get(sid)
            if sandbox is None or not sandbox.ready:
                raise FailedPrecondition(f"pod sandbox {sandbox_prefix} is not ready")
            return await self._create(sandbox, config, sandbox_config)

    def _runnable_sandbox(self, prefix: str) -> str:
        """The id of the pod ``prefix`` names, at once. A pod whose RunPodSandbox has not
        returned (an NRI plugin may still hold its event) is not there yet: the create
        fails instead of waiting for the pod's lock (containerd adds a sandbox to its store
        only after the NRI hook, so it answers NotFound too)."""
        try:
            sid = resolve_prefix([r.id for r in self.sandboxes.visible()], prefix, "pod sandbox")
        except NotFound:
            if any(r.id.startswith(prefix) and r.creating
                   for r in self.sandboxes.all()):
                raise NotFound(f"pod sandbox {prefix} is not ready: it is still being created "
                               "(RunPodSandbox has not returned)") from None
            raise
        return sid

    async def _create(self, sandbox: SandboxRecord, config: pb.ContainerConfig,
                      sandbox_config: pb.PodSandboxConfig | None) -> str:
        image = self.images.resolve_local(config.image.image)
        if image is None:
            raise NotFound(f"image {config.image.image!r} not found: pull it first")
        view = self.images.view(image)
        volume_images = self._volume_images(config)
        image_config = json.loads(self.images.content.read(image.id))
        md, pmd = config.metadata, sandbox.config.metadata
        name = f"{md.name}_{pmd.name}_{pmd.namespace}_{pmd.uid}_{md.attempt}"
        cid = secrets.token_hex(32)
        pod_config = sandbox.config
        if sandbox_config is not None and sandbox_config.linux.cgroup_parent:
            pod_config = pb.PodSandboxConfig()
            pod_config.CopyFrom(sandbox.config)
            pod_config.linux.cgroup_parent = sandbox_config.linux.cgroup_parent
        stop_signal = (pb.Signal.Name(config.stop_signal) if config.stop_signal
                       else parse_signal((image_config.get("config") or {})
                                         .get("StopSignal") or ""))
        log_path = ""
        if sandbox.config.log_directory and config.log_path:
            log_path = os.path.join(sandbox.config.log_directory, config.log_path)

        async with contextlib.AsyncExitStack() as undo:
            self.names.reserve(name, cid)
            undo.callback(self.names.release, name)
            log.info("creating container %s (%s) in pod sandbox %s", cid, name, sandbox.id)
            rec = self.store.put(ContainerRecord(
                id=cid, sandbox_id=sandbox.id, name=name, config=config,
                created_at=now_ns(), image_id=image.id,
                image_name=view.repo_tags[0] if view.repo_tags else config.image.image,
                image_ref=view.repo_digests[0] if view.repo_digests else image.id,
                log_path=log_path, stop_signal=stop_signal))
            undo.callback(self.store.delete, cid)
            failpoint("container.record")
            undo.push_async_callback(self.cleanup, cid)
            spec, resolved = await asyncio.to_thread(
                self._prepare_bundle, cid, config, pod_config, sandbox, image_config,
                image.chain[-1] if image.chain else None, config.image.image, volume_images)
            undo.push_async_callback(self.nri.undo_container, cid)  # Stop and Remove
            await self.nri.create_container(rec, spec)
            await asyncio.to_thread(write_spec, self.paths.bundle(cid), spec)
            failpoint("container.bundle")
            if log_path:
                os.makedirs(os.path.dirname(log_path), mode=0o755, exist_ok=True)
            pid = await self.runtime.create(CreateOptions(
                id=cid, bundle=self.paths.bundle(cid), name=name, log_path=log_path,
                tty=config.tty, stdin=config.stdin, stdin_once=config.stdin_once,
                runtime_handler=sandbox.runtime_handler))
            failpoint("container.created")
            user = spec["process"]["user"]
            rec = self.store.update(cid, phase=ContainerPhase.CREATED, pid=pid, uid=user["uid"],
                                    gid=user["gid"], groups=tuple(user.get("additionalGids") or ()),
                                    resources=record_of(spec), config=resolved)
            undo.pop_all()
        log.info("created container %s", cid)
        self.events.emit(events.CREATED, cid, sandbox.id)
        await self.nri.post_create(rec)
        return cid

    def _volume_images(self, config: pb.ContainerConfig) -> dict[int, ImageRecord]:
        """The image of each image volume, by mount index, checked before any side effect:
        the kubelet pulls them first, so a missing one is NotFound (containerd resolves
        them locally too)."""
        found: dict[int, ImageRecord] = {}
        for i, m in enumerate(config.mounts):
            if not is_image_mount(m):
                continue
            check_image_mount(m)
            img = self.images.resolve_local(m.image.image)
            if img is None or not img.chain:
                raise NotFound(f"{IMAGE_VOLUME_FAILED}: mount {m.container_path!r}: image "
                               f"{m.image.image!r} not found: pull it first")
            found[i] = img
        return found

    def _mount_image_volumes(self, cid: str, config: pb.ContainerConfig,
                             images: Mapping[int, ImageRecord]) -> pb.ContainerConfig:
        """Mount each image volume (runtime/image_volumes.py); returns the config with
        their host paths and image ids set, which ContainerStatus.mounts reports
        (containerd fills in host_path; cri-api's ImageSpec.image_ref is the id that
        PullImage answered)."""
        if not images:
            return config
        resolved = pb.ContainerConfig()
        resolved.CopyFrom(config)
        for i, img in images.items():
            m = resolved.mounts[i]
            m.host_path = mount_image_volume(
                self.images.snapshotter, container_id=cid, index=i, parent=img.chain[-1],
                bundle=self.paths.bundle(cid), sub_path=m.image_sub_path,
                what=f"{IMAGE_VOLUME_FAILED}: mount {m.container_path!r} of image "
                     f"{m.image.image!r}")
            set_image_ref(m.image, img.id)
        failpoint("container.image_volumes")
        return resolved

    def _prepare_bundle(self, cid: str, config: pb.ContainerConfig,
                        pod_config: pb.PodSandboxConfig, sandbox: SandboxRecord,
                        image_config: dict[str, Any], parent: str | None,
                        image_name: str, volume_images: Mapping[int, ImageRecord],
                        ) -> tuple[dict[str, Any], pb.ContainerConfig]:
        """Rootfs, image volumes and spec; returns the spec and the config with the image
        volumes' host paths."""
        bundle = self.paths.bundle(cid)
        rootfs = prepare_rootfs(self.images.snapshotter, cid, parent, bundle)
        failpoint("container.rootfs")
        config = self._mount_image_volumes(cid, config, volume_images)
        volumes_dir = os.path.join(self.paths.volumes(cid), "volumes")
        privileged = config.linux.security_context.privileged
        spec = container_spec(
            config, pod_config, image_config, container_id=cid, sandbox_id=sandbox.id,
            namespaces=self.controller.namespaces(sandbox),
            etc_passwd=read_etc(rootfs, "passwd"),
            etc_group=read_etc(rootfs, "group"), image_name=image_name,
            files=self.controller.files(sandbox.id), volumes_dir=volumes_dir,
            node_hostname=os.uname().nodename, cgroup_v2=self.resource_policy.host.unified,
            devices=cri_devices(list(config.devices)),
            host_devices=nodes_under("/dev", "/dev") if privileged else (),
            cgroup_driver=self.cgroup_driver, min_oom_score_adj=self.min_oom_score_adj,
            resource_policy=self.resource_policy, **self._handler_options(sandbox, config),
            target_pid=self._target_pid(config, sandbox),
            host_capabilities=self.host_capabilities, host_security=self.host_security,
            unset_seccomp_profile=self.unset_seccomp_profile)
        for m in spec["mounts"]:
            if m["source"].startswith(volumes_dir + os.sep):
                copy_image_volume(rootfs, m["destination"], m["source"])
        for m in config.mounts:
            if m.host_path and not os.path.exists(m.host_path):
                os.makedirs(m.host_path, mode=0o755, exist_ok=True)  # as containerd does
        return spec, config

    def _target_pid(self, config: pb.ContainerConfig, sandbox: SandboxRecord) -> int | None:
        """§2.14: a TARGET pid namespace is a running container of the same pod."""
        opts = config.linux.security_context.namespace_options
        if opts.pid != pb.TARGET:
            return None
        target = self.store.get(opts.target_id)
        if target is None or target.sandbox_id != sandbox.id:
            raise NotFound(f"target container {opts.target_id!r} not found in pod {sandbox.id}")
        if target.state != pb.CONTAINER_RUNNING or target.pid <= 0:
            raise FailedPrecondition(f"target container {opts.target_id!r} is not running")
        return target.pid

    def _handler_options(self, sandbox: SandboxRecord,
                         config: pb.ContainerConfig) -> dict[str, Any]:
        """container_spec's options that come from the pod's runtime handler."""
        handler = self.handlers.get(sandbox.runtime_handler or self.default_handler)
        if handler is None:
            return {}
        if not handler.features.user_namespaces:
            # runc without idmapped mounts ignores a mapping: refuse instead of dropping it.
            for m in config.mounts:
                if m.uidMappings or m.gidMappings:
                    raise InvalidArgument(
                        f"mount {m.container_path!r} asks for an idmapped mount, which runtime "
                        f"handler {handler.name!r} does not support (its runc has none)")
        return {"base_spec": handler.base_spec,
                "privileged_without_host_devices": handler.privileged_without_host_devices,
                "pod_annotation_globs": handler.pod_annotations,
                "container_annotation_globs": handler.container_annotations,
                "rro_supported": handler.features.recursive_read_only_mounts}

    async def cleanup(self, cid: str) -> None:
        """Every trace of a container but its record and log (idempotent). The image chains
        its snapshots were built on are collected if no image holds them any more."""
        await self.runtime.delete(cid)
        released = await asyncio.to_thread(self._remove_files, cid)
        self.runtime.forget_exit(cid)
        await self.images.release(released)

    def _remove_files(self, cid: str) -> Sequence[str]:
        """Bundle (mounts first), rootfs snapshot, image volume views, copied VOLUMEs;
        returns the parents of the snapshots removed."""
        snapshotter = self.images.snapshotter
        released = remove_bundle(snapshotter, cid, self.paths.bundle(cid))
        released += remove_image_volumes(snapshotter, cid)
        shutil.rmtree(self.paths.volumes(cid), ignore_errors=True)
        return released

    # ---- start / stop / remove ----------------------------------------------------------

    async def start(self, prefix: str) -> None:
        async with self.nri.blocking_sync():
            rec = self.find(prefix)
            async with self.locks(rec.id).write():
                done = self._starting[rec.id] = asyncio.Event()
                try:
                    await self._start_locked(rec.id)
                finally:
                    del self._starting[rec.id]
                    done.set()

    async def _start_locked(self, cid: str) -> None:
        rec = self._current(cid)
        if rec.phase is not ContainerPhase.CREATED or rec.state != pb.CONTAINER_CREATED:
            raise FailedPrecondition(
                f"container {rec.id} is in {state_name(rec.state)} state, not created")
        sandbox = self.sandboxes.get(rec.sandbox_id)
        if sandbox is None or not sandbox.ready:
            raise FailedPrecondition(f"pod sandbox {rec.sandbox_id} of container "
                                     f"{rec.id} is not ready")
        started = now_ns()
        try:
            failpoint("container.start")
            await self.nri.start_container(rec)
            await self.runtime.start(rec.id)
        except Exception as e:
            # containerd records a start failure as an exit with StartError, code 128.
            self._finish(rec.id, now_ns(), 128, "StartError", str(e))
            await self.runtime.delete(rec.id)
            raise
        # Killed here, recovery finds runc's container running and finishes the start.
        failpoint("container.started")
        rec = self.store.update(rec.id, started_at=started)
        if self.anchors is not None:
            self.anchors.refresh(rec.sandbox_id)
        self.events.emit(events.STARTED, rec.id, rec.sandbox_id)
        await self.nri.post_start(rec)

    def _current(self, cid: str) -> ContainerRecord:
        rec = self.store.get(cid)
        if rec is None:
            raise NotFound(f"container {cid} not found")
        return rec

    async def stop(self, prefix: str, grace: float) -> None:
        """CRI-TO-OCI.md §4: unknown id or not running is success; signal, wait, SIGKILL."""
        try:
            rec = self.find(prefix)
        except NotFound:
            return
        async with self.nri.blocking_sync(), self.locks(rec.id).write():
            await self.stop_locked(rec.id, grace)

    async def stop_locked(self, cid: str, grace: float) -> None:
        """Stop the process, then tell NRI (once per container, also for one that had
        already exited on its own)."""
        await self._stop_process(cid, grace)
        rec = self.store.get(cid)
        if rec is not None and rec.finished_at:
            await self.nri.stop_container(cid)

    async def _stop_process(self, cid: str, grace: float) -> None:
        rec = self.store.get(cid)
        if rec is None or rec.state not in (pb.CONTAINER_RUNNING, pb.CONTAINER_UNKNOWN):
            return
        if grace > 0:
            if cid not in self._stop_signalled:
                self._stop_signalled.add(cid)
                await self.runtime.kill(cid, signal.Signals[rec.stop_signal].value)
                failpoint("container.signalled")
            exit_ = await self.waiters.wait(cid, grace)
            if exit_ is not None:
                self.record_exit(exit_)
                return
        await self.runtime.kill(cid, signal.SIGKILL)
        failpoint("container.killed")
        exit_ = await self.waiters.wait(cid, KILL_WAIT)
        if exit_ is None:
            state = await self.runtime.state(cid)
            if state is not None and state.status is not RuncStatus.STOPPED:
                raise DeadlineExceeded(f"container {cid} did not exit {KILL_WAIT:.0f}s "
                                       "after SIGKILL")
            exit_ = Exit(cid, 255, now_ns(), reason="Unknown")
        self.record_exit(exit_)

    async def remove(self, prefix: str) -> None:
        try:
            rec = self.find(prefix)
        except NotFound:
            return
        async with self.nri.blocking_sync(), self.locks(rec.id).write():
            await self.remove_locked(rec.id)

    async def remove_locked(self, cid: str) -> None:
        rec = self.store.get(cid)
        if rec is None:
            return
        if rec.state in (pb.CONTAINER_RUNNING, pb.CONTAINER_UNKNOWN):
            await self.stop_locked(cid, 0)
        self.store.update(cid, phase=ContainerPhase.REMOVING)
        self.sessions.end(cid, f"container {cid} was removed")
        failpoint("container.remove")
        await self.cleanup(cid)
        failpoint("container.cleaned")
        self.store.delete(cid)
        self.names.release(rec.name)
        self._stop_signalled.discard(cid)
        self._evicted.pop(cid, None)
        self.locks.drop(cid)
        self.events.emit(events.DELETED, cid, rec.sandbox_id)
        await self.nri.remove_container(cid)

    # ---- exits ---------------------------------------------------------------------------

    def notify_exit(self, exit_: Exit) -> None:
        """From the exit watcher, at once: wake whoever waits for this exit."""
        self.waiters.notify(exit_)

    async def handle_exit(self, exit_: Exit) -> None:
        """From the exit monitor (retried if it raises): record the exit, then NRI's
        StopContainer (once per container, whoever stops it first)."""
        if (starting := self._starting.get(exit_.id)) is not None:
            await starting.wait()  # the start's record, event and NRI hooks come first
        if self.store.get(exit_.id) is None:
            return  # removed meanwhile
        failpoint("exit.handle")
        self.record_exit(exit_)
        await self.nri.container_exited(exit_.id)
        # The runc container is done with once its exit is recorded (the OOM check read its
        # cgroup): delete it now, as containerd deletes a task when it exits, so that
        # RemoveContainer has no runc to run.
        async with self.locks(exit_.id).write():
            if self.store.get(exit_.id) is not None:
                await self.runtime.delete(exit_.id)

    def record_exit(self, exit_: Exit) -> None:
        """The exit in the record, once: reason OOMKilled when conmon saw the cgroup's OOM
        event (memory.oom_control on v1, memory.events on v2), Evicted for an NRI
        eviction, else Completed or Error."""
        rec = self.store.get(exit_.id)
        if rec is None or rec.finished_at:
            return
        reason, message = exit_.reason, ""
        if rec.id in self._evicted:
            reason, message = "Evicted", self._evicted[rec.id]
        elif not reason and exit_.code == 137 and self.runtime.oom_killed(
                self.paths.bundle(exit_.id)):
            reason = "OOMKilled"
        if not reason:
            reason = "Completed" if exit_.code == 0 else "Error"
        self._finish(rec.id, exit_.at_ns, exit_.code, reason, message)

    def _finish(self, cid: str, at_ns: int, code: int, reason: str, message: str) -> None:
        rec = self.store.update(cid, finished_at=at_ns, exit_code=code, reason=reason,
                                message=message, pid=0)
        if self.anchors is not None:
            self.anchors.refresh(rec.sandbox_id)
        self.events.emit(events.STOPPED, cid, rec.sandbox_id)
        self.sessions.end(cid, f"container {cid} exited with {code}")

    # ---- resources and evictions ----------------------------------------------------------

    async def update_resources(self, prefix: str,
                               linux: pb.LinuxContainerResources | None) -> None:
        """UpdateContainerResources: NRI UpdateContainer may replace the request (a refusal
        fails the call), the result goes to the live cgroup and the spec, PostUpdate."""
        async with self.nri.blocking_sync():
            rec = self.find(prefix, visible=True)
            async with self.locks(rec.id).write():
                rec = self._current(rec.id)
                if rec.state not in (pb.CONTAINER_CREATED, pb.CONTAINER_RUNNING):
                    raise FailedPrecondition(f"container {rec.id} is in "
                                             f"{state_name(rec.state)} state: cannot update it")
                linux = linux or pb.LinuxContainerResources()
                validate(linux, self.resource_policy)  # before NRI or runc see it
                requested = resources_from_cri(linux)
                final = await self.nri.update_container(rec, requested)
                if final is not requested:  # a plugin's answer replaces the request
                    linux = cri_from_nri(final)
                # containerd's updateOCIResource: the same rules as at create.
                await self._set_resources(
                    rec.id, lambda current: apply(current, linux, self.resource_policy))
                await self.nri.post_update(rec, final)

    async def _set_resources(self, cid: str,
                             new: Callable[[Mapping[str, Any]], dict[str, Any]]) -> None:
        """Both update paths end here: ``new`` turns the spec's resources into the next
        ones, which go whole to ``runc update`` (memory and memsw together, so raising and
        lowering both pass the v1 kernel's checks), then to the spec and the record, so
        status and restarts see them."""
        bundle = self.paths.bundle(cid)
        spec = read_spec(bundle)
        linux = spec.setdefault("linux", {})
        resources = new(linux.get("resources") or {})
        await self.runtime.update(cid, update_payload(resources))
        linux["resources"] = resources
        await asyncio.to_thread(write_spec, bundle, spec)
        self.store.update(cid, resources=record_of(spec))

    async def apply_resources(self, cid: str, resources: dict[str, Any]) -> None:
        """An NRI plugin's new cgroup limits (only the changed fields) for a created or
        running container, laid over the current ones."""
        rec = self._current(cid)
        if rec.state not in (pb.CONTAINER_CREATED, pb.CONTAINER_RUNNING):
            raise FailedPrecondition(f"container {cid} is {state_name(rec.state)}")
        await self._set_resources(cid, lambda current: merge_update(current, resources))

    async def evict(self, cid: str, reason: str) -> None:
        """An NRI plugin's eviction: stop the container at once; its status says
        ``Evicted`` with the plugin's reason (upstream drops evictions)."""
        async with self.nri.blocking_sync():
            if self.store.get(cid) is None:
                return
            async with self.locks(cid).write():
                rec = self.store.get(cid)
                if rec is None or rec.state not in (pb.CONTAINER_RUNNING,
                                                    pb.CONTAINER_UNKNOWN):
                    return
                self._evicted[cid] = reason
                await self.stop_locked(cid, 0)

    # ---- exec ----------------------------------------------------------------------------

    async def exec_sync(self, prefix: str, cmd: Sequence[str],
                        limit_s: int) -> tuple[int, bytes, bytes]:
        if not cmd:
            raise InvalidArgument("exec command must not be empty")
        rec = self.find(prefix)
        if rec.state != pb.CONTAINER_RUNNING:
            raise FailedPrecondition(
                f"container {rec.id} is in {state_name(rec.state)} state, not running")
        process = read_spec(self.paths.bundle(rec.id))["process"]
        process["args"] = list(cmd)
        process["terminal"] = False
        try:
            result = await self.runtime.exec_sync(
                rec.id, process, limit=limit_s if limit_s > 0 else None,
                output_cap=EXEC_OUTPUT_CAP)
        except TimeoutError:
            raise DeadlineExceeded(
                f"timeout {limit_s}s exceeded running {list(cmd)!r}: the process was killed"
            ) from None
        return result.exit_code, result.stdout, result.stderr

    def details(self, rec: ContainerRecord) -> dict[str, Any]:
        """ContainerStatus verbose info (containerd's keys)."""
        try:
            spec: dict[str, Any] | None = read_spec(self.paths.bundle(rec.id))
        except NotFound:
            spec = None
        removing = rec.phase is ContainerPhase.REMOVING
        return {"sandboxID": rec.sandbox_id, "pid": rec.pid, "removing": removing,
                "snapshotKey": rec.id, "snapshotter": self.images.snapshotter.name,
                "runtimeSpec": spec}

    async def reopen_log(self, prefix: str) -> None:
        rec = self.find(prefix)
        if rec.state != pb.CONTAINER_RUNNING:
            raise FailedPrecondition(f"container {rec.id} is not running")
        await self.runtime.reopen_log(self.paths.bundle(rec.id), rec.log_path)

    # ---- restart -------------------------------------------------------------------------

    async def recover(self, states: dict[str, RuncState],
                      submit: Callable[[Exit], None]) -> None:
        """Reload records (RECOVERY_CONCURRENCY at a time): finish or undo half-done work,
        then reconcile each with runc's view (``states``, from one ``runc list``) and
        conmon's exit file. Exits that happened while the daemon was down go to ``submit``
        (the exit monitor), to be handled as if they had just happened. A record whose
        recovery fails is marked unknown; the others go on."""
        bound = asyncio.Semaphore(RECOVERY_CONCURRENCY)

        async def one(rec: ContainerRecord) -> None:
            async with bound:
                try:
                    await self._recover_one(rec, states.get(rec.id), submit)
                except Exception:
                    log.exception("container %s: recovery failed; marking it unknown", rec.id)
                    if self.store.get(rec.id) is not None:
                        self.store.update(rec.id, unknown=True)

        await asyncio.gather(*(one(rec) for rec in self.store.all()))

    async def _recover_one(self, rec: ContainerRecord, state: RuncState | None,
                           submit: Callable[[Exit], None]) -> None:
        if rec.phase is not ContainerPhase.CREATED or self.sandboxes.get(rec.sandbox_id) is None:
            log.info("container %s: removing what an interrupted %s left", rec.id,
                     "removal" if rec.phase is ContainerPhase.REMOVING else "creation")
            await self.cleanup(rec.id)
            self.store.delete(rec.id)
            return
        self.names.reserve(rec.name, rec.id)
        if rec.finished_at:
            return
        exit_ = self.runtime.exit_of(rec.id)
        status = state.status if state is not None else None
        if exit_ is None and status in (None, RuncStatus.STOPPED):
            # No status anywhere (runc forgot it, conmon died with it): containerd's
            # unknown exit code and reason.
            exit_ = Exit(rec.id, 255, now_ns(), reason="Unknown")
        started = status in (RuncStatus.RUNNING, RuncStatus.PAUSED)
        if not rec.started_at and exit_ is None and started:
            # Killed between ``runc start`` and its record: the start happened; finish it.
            log.info("container %s: finishing an interrupted start", rec.id)
            self.store.update(rec.id, started_at=now_ns())
            self.events.emit(events.STARTED, rec.id, rec.sandbox_id)
        if exit_ is not None:
            submit(exit_)
