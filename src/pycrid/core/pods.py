"""Pod sandboxes: run, stop, remove, status, list.

``run`` is the readable sequence of DESIGN.md: reserve the name, record the
intent, make the network namespace, attach it to the pod network (CNI ADD),
let the sandbox controller create and start the pause container, mark the pod
ready; each step's undo is pushed right after it succeeds, so a failure at any
point leaves nothing behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import secrets
import uuid
from collections.abc import Callable, Collection, Sequence
from typing import Any

from cri_api.v1 import api_pb2 as pb

from pycrid.core import events
from pycrid.core.containers import RECOVERY_CONCURRENCY, ContainerParts, labels_match, now_ns
from pycrid.core.containers.remove import remove_locked
from pycrid.core.containers.stop import stop_locked
from pycrid.core.events import ContainerEvents
from pycrid.core.nri_objects import resources_from_cri
from pycrid.core.nri_relay import NRI
from pycrid.core.registrar import KeyedLocks, NameRegistrar, resolve_prefix
from pycrid.errors import InvalidArgument, NotFound
from pycrid.faults import failpoint
from pycrid.images.image_service import ImageService
from pycrid.network.cni_args import bandwidth
from pycrid.network.netns import create_netns, is_pinned, remove_netns
from pycrid.network.pod_networks import PodNetworks
from pycrid.oci.resources import resources_json
from pycrid.oci.security import validate_pod as validate_pod_security
from pycrid.runtime.exits import Exit
from pycrid.runtime.interface import RuncState
from pycrid.sandbox.controller import SandboxController, SandboxRequest, SandboxState
from pycrid.store.image_records import ImageRecord
from pycrid.store.records import PodPhase, RecordStore, SandboxRecord

log = logging.getLogger(__name__)

#: How many pods' networks recovery CHECKs at once.
_RECOVERY_CHECKS = 8


def _validate(config: pb.PodSandboxConfig, handler: str, handlers: Collection[str]) -> None:
    md = config.metadata
    if not config.HasField("metadata") or not md.name or not md.namespace:
        raise InvalidArgument("pod sandbox config must include metadata with a name and "
                              "a namespace")
    if handler and handler not in handlers:
        raise InvalidArgument(f"no runtime for handler {handler!r} is configured "
                              f"(known: {', '.join(repr(h) for h in sorted(handlers))})")
    opts = config.linux.security_context.namespace_options
    if opts.network == pb.NODE and config.hostname:
        # runc refuses a hostname without a private UTS namespace; say so up front.
        raise InvalidArgument("a host-network pod shares the node's hostname: "
                              "hostname must be empty")
    if opts.network != pb.NODE:
        bandwidth(config.annotations)  # refuses unreadable limits before any side effect
    validate_pod_security(config)  # sysctls, seccomp profile: before any side effect


def _own_userns(opts: pb.NamespaceOption) -> bool:
    """The pod asks for a user namespace of its own."""
    return opts.HasField("userns_options") and opts.userns_options.mode == pb.POD


class PodManager:
    def __init__(self, *, store: RecordStore[SandboxRecord], controller: SandboxController,
                 containers: ContainerParts, images: ImageService, netns_dir: str,
                 locks: KeyedLocks, nri: NRI, network: PodNetworks, events: ContainerEvents,
                 handlers: Collection[str], default_handler: str = "runc",
                 userns_handlers: Collection[str] = (), drop_infra: bool = False,
                 podsandbox_handlers: Collection[str] = ()) -> None:
        self.store = store
        self.events = events
        self.network = network
        self.handlers = frozenset(handlers)
        self.default_handler = default_handler
        #: Handlers whose runc can run CRI user namespaces (idmapped mounts).
        self.userns_handlers = frozenset(userns_handlers)
        #: drop_infra_ctr, and the handlers whose pods always get a pause (sandboxer =
        #: "podsandbox").
        self.drop_infra = drop_infra
        self.podsandbox_handlers = frozenset(podsandbox_handlers)
        self.controller = controller
        self.containers = containers
        self.images = images
        self.netns_dir = netns_dir
        self.locks = locks
        self.nri = nri
        self.names = NameRegistrar("sandbox")
        #: Pods whose pause is being killed on purpose (its exit is no news).
        self._stopping: set[str] = set()
        os.makedirs(netns_dir, mode=0o711, exist_ok=True)

    def find(self, prefix: str, *, visible: bool = False) -> SandboxRecord:
        """The pod ``prefix`` names; with ``visible``, only among ``store.visible()``."""
        ids = [r.id for r in self.store.visible()] if visible else self.store.ids()
        sid = resolve_prefix(ids, prefix, "pod sandbox")
        rec = self.store.get(sid)
        assert rec is not None
        return rec

    def list(self, flt: pb.PodSandboxFilter | None) -> list[SandboxRecord]:
        recs = self.store.visible()
        if flt is None:
            return recs
        if flt.id:
            recs = [r for r in recs if r.id.startswith(flt.id)]
        if flt.HasField("state"):
            want_ready = flt.state.state == pb.SANDBOX_READY
            recs = [r for r in recs if r.ready == want_ready]
        if flt.label_selector:
            recs = [r for r in recs if labels_match(flt.label_selector, r.config.labels)]
        return recs

    # ---- run -----------------------------------------------------------------------------

    async def run(self, config: pb.PodSandboxConfig, handler: str) -> str:
        _validate(config, handler, self.handlers)
        chosen = handler or self.default_handler  # the record keeps the name as asked
        opts = config.linux.security_context.namespace_options
        if _own_userns(opts) and chosen not in self.userns_handlers:
            # The kubelet checks this handler feature (Status) before asking; refuse a
            # request that skipped the check instead of failing deep inside runc.
            raise InvalidArgument(f"runtime handler {chosen!r} does not support user "
                                  "namespaces (its runc has no idmapped mounts)")
        md = config.metadata
        name = f"{md.name}_{md.namespace}_{md.uid}_{md.attempt}"
        sid = secrets.token_hex(32)
        host_network = config.linux.security_context.namespace_options.network == pb.NODE
        async with (self.nri.blocking_sync(), self.locks(sid).write(),
                    contextlib.AsyncExitStack() as undo):
            self.names.reserve(name, sid)
            undo.callback(self.names.release, name)
            # CRI-O's pair of lines (running, then ready): an operator can follow a pod's
            # id from the request to the result, also when it fails in between.
            log.info("running pod sandbox %s (%s)", sid, name)
            kind = self._controller_for(config, chosen)
            # A pod without a pause process needs no sandbox image.
            image = await self._sandbox_image() if kind == "pause" else None
            netns = "" if host_network else os.path.join(self.netns_dir, f"cni-{uuid.uuid4()}")
            self.store.put(SandboxRecord(
                id=sid, name=name, config=config, runtime_handler=handler,
                created_at=now_ns(), netns=netns, controller=kind,
                image_id=image.id if image is not None else "",
                image_name=self.images.config.sandbox_image if image is not None else ""))
            undo.callback(self.store.delete, sid)
            failpoint("sandbox.record")
            if netns:
                await asyncio.to_thread(create_netns, netns)
                undo.callback(remove_netns, netns)
                failpoint("sandbox.netns")
            undo.push_async_callback(self.controller.shutdown, sid)
            # The pause joins the netns by path and CNI configures the netns: neither waits
            # for the other, so CNI ADD runs beside conmon + runc create/start (about a third
            # of RunPodSandbox; pycrid.bench.lifecycle). Both are let finish before any unwinding.
            started, attached = await asyncio.gather(
                self._start_sandbox(sid, config, image, netns, chosen),
                self._attach(sid, netns, config, handler, undo), return_exceptions=True)
            failures = [o for o in (started, attached) if isinstance(o, BaseException)]
            for extra in failures[1:]:
                log.warning("pod %s: %s (while failing for another reason)", sid, extra)
            if failures:
                raise failures[0]
            assert isinstance(started, int)
            rec = self.store.update(sid, pid=started)
            undo.push_async_callback(self.nri.remove_pod, sid)  # Stop and Remove follow a Run
            await self.nri.run_pod(rec)
            self.store.update(sid, phase=PodPhase.READY)
            undo.pop_all()
        log.info("pod sandbox %s is ready", sid)
        self.events.emit(events.CREATED, sid, sid)
        self.events.emit(events.STARTED, sid, sid)
        return sid

    def _controller_for(self, config: pb.PodSandboxConfig, handler: str) -> str:
        """"pinned" (no pause process) for a pod whose containers share no PID namespace,
        when drop_infra_ctr allows and its handler does not ask for a sandbox process
        (CRI-O's NeedsInfra); "pause" otherwise, and always for user-namespace pods."""
        opts = config.linux.security_context.namespace_options
        if (not self.drop_infra or opts.pid == pb.POD or handler in self.podsandbox_handlers
                or _own_userns(opts)):
            return "pause"
        return "pinned"

    async def _start_sandbox(self, sid: str, config: pb.PodSandboxConfig,
                             image: ImageRecord | None, netns: str, handler: str) -> int:
        if image is None:
            req = SandboxRequest(id=sid, config=config, netns=netns, runtime_handler=handler)
        else:
            req = SandboxRequest(
                id=sid, config=config, image_name=self.images.config.sandbox_image,
                image_config=json.loads(self.images.content.read(image.id)),
                image_chain_top=image.chain[-1], netns=netns, runtime_handler=handler)
        await self.controller.create(req)
        return await self.controller.start(sid)

    async def _attach(self, sid: str, netns: str, config: pb.PodSandboxConfig, handler: str,
                      undo: contextlib.AsyncExitStack) -> None:
        """CNI ADD; a failed or cancelled ADD DELs itself, a finished one is the pod's."""
        if not netns:
            return
        ips = await self.network.attach(sid, netns, config, handler)
        undo.push_async_callback(self._detach, sid)
        self.store.update(sid, ips=tuple(ips))
        failpoint("sandbox.network")

    async def _sandbox_image(self) -> ImageRecord:
        ref = self.images.config.sandbox_image
        image = self.images.resolve_local(ref)
        if image is None:
            log.info("pulling sandbox image %s", ref)
            image = await self.images.pull(ref, None)
        if not image.chain:
            raise InvalidArgument(f"sandbox image {ref} has no layers")
        return image

    # ---- stop / remove -------------------------------------------------------------------

    async def stop(self, prefix: str) -> None:
        """§4: every container killed, then the pause, then /dev/shm and the netns (idempotent)."""
        try:
            rec = self.find(prefix)
        except NotFound:
            return
        async with self.nri.blocking_sync(), self.locks(rec.id).write():
            await self._stop_locked(rec.id)

    async def _stop_locked(self, sid: str) -> None:
        for c in self.containers.of_sandbox(sid):
            async with self.locks(c.id).write():
                await stop_locked(self.containers, c.id, 0)
        await self.nri.stop_pod(sid)
        failpoint("sandbox.stop")
        self._stopping.add(sid)
        try:
            await self.controller.stop(sid)
        finally:
            self._stopping.discard(sid)
        self._not_ready(sid)  # the pause is dead: before the network goes, not after
        failpoint("sandbox.stopped")
        rec = self.store.get(sid)
        if rec is not None and rec.netns:
            await self._detach(sid)
            failpoint("sandbox.detached")
            await asyncio.to_thread(remove_netns, rec.netns)

    async def remove(self, prefix: str) -> None:
        try:
            rec = self.find(prefix)
        except NotFound:
            return
        async with self.nri.blocking_sync(), self.locks(rec.id).write():
            await self._stop_locked(rec.id)
            self.store.update(rec.id, phase=PodPhase.REMOVING)
            await self._remove_rest(rec)

    async def _remove_rest(self, rec: SandboxRecord) -> None:
        for c in self.containers.of_sandbox(rec.id):
            async with self.locks(c.id).write():
                await remove_locked(self.containers, c.id)
        failpoint("sandbox.remove")
        await self.controller.shutdown(rec.id)
        failpoint("sandbox.shutdown")
        if rec.netns:
            await self._detach(rec.id)
            await asyncio.to_thread(remove_netns, rec.netns)
        self.store.delete(rec.id)
        self.names.release(rec.name)
        self.locks.drop(rec.id)
        self.events.emit(events.DELETED, rec.id, rec.id)
        await self.nri.remove_pod(rec.id)

    async def _detach(self, sid: str) -> None:
        """CNI DEL of the pod, if anything is attached: a cached result (also after a
        restart or reboot) or a still-pinned netns (a crash during ADD)."""
        rec = self.store.get(sid)
        if rec is None or not rec.netns:
            return
        await self.network.detach(sid, rec.netns, rec.config, rec.runtime_handler,
                                  netns_alive=is_pinned(rec.netns))

    async def update_resources(self, prefix: str, overhead: pb.LinuxContainerResources | None,
                               resources: pb.LinuxContainerResources | None) -> None:
        """UpdatePodSandboxResources: NRI UpdatePodSandbox (a refusal fails the call), the
        new values recorded in the pod's config, PostUpdatePodSandbox. The pod cgroup itself
        is the kubelet's (cgroupfs driver), as with containerd's pause-container sandboxes."""
        async with self.nri.blocking_sync():
            rec = self.find(prefix, visible=True)
            async with self.locks(rec.id).write():
                rec = self.find(rec.id)
                empty = pb.LinuxContainerResources()
                await self.nri.update_pod(rec, resources_from_cri(overhead or empty),
                                          resources_from_cri(resources or empty))
                config = pb.PodSandboxConfig()
                config.CopyFrom(rec.config)
                if overhead is not None:
                    config.linux.overhead.CopyFrom(overhead)
                if resources is not None:
                    config.linux.resources.CopyFrom(resources)
                rec = self.store.update(rec.id, config=config)
                await self.nri.post_update_pod(rec)

    # ---- exits and restart ---------------------------------------------------------------

    def notify_exit(self, exit_: Exit) -> None:
        """From the exit watcher, at once: wake whoever waits for the pause to exit."""
        self.controller.exited(exit_.id, exit_)

    async def handle_exit(self, exit_: Exit) -> None:
        """From the exit monitor: the pause process ended, the pod is no longer ready."""
        rec = self.store.get(exit_.id)
        if rec is not None and rec.ready:
            if rec.id not in self._stopping:
                log.warning("pause process of pod %s exited with %d", rec.id, exit_.code)
            self._not_ready(rec.id)

    def _not_ready(self, sid: str) -> None:
        """A ready pod stops being ready: record it and tell event subscribers (once)."""
        rec = self.store.get(sid)
        if rec is not None and rec.ready:
            self.store.update(sid, phase=PodPhase.NOTREADY)
            self.events.emit(events.STOPPED, sid, sid)
            self.containers.sessions.end(sid, f"pod sandbox {sid} stopped")

    async def recover(self, states: dict[str, RuncState],
                      submit: Callable[[Exit], None]) -> Sequence[str]:
        """Reload records (RECOVERY_CONCURRENCY at a time): undo interrupted creations,
        finish interrupted removals, and keep a pod ready only if its pause process lives
        (runc's view in ``states``; a pause exit found here goes to ``submit``) and its netns
        is still pinned. Returns the pods whose network ``check_networks`` should CHECK."""
        bound = asyncio.Semaphore(RECOVERY_CONCURRENCY)
        exited: set[str] = set()

        def exit_found(exit_: Exit) -> None:
            exited.add(exit_.id)
            submit(exit_)

        async def one(rec: SandboxRecord) -> None:
            async with bound:
                try:
                    await self._recover_one(rec, states, exit_found)
                except Exception:
                    log.exception("pod sandbox %s: recovery failed; marking it not ready",
                                  rec.id)
                    self._not_ready(rec.id)

        await asyncio.gather(*(one(r) for r in self.store.all()))
        return [r.id for r in self.store.all() if r.ready and r.netns and r.id not in exited]

    async def check_networks(self, ids: Sequence[str]) -> None:
        """CNI CHECK of pods that survived a restart (8 at a time); one whose network is
        broken stops being ready (a STOPPED event), as if its pause had died. Runs after
        the gate opened: CHECK costs a few plugin runs per pod, and a node with many pods
        should be serving again before they are all checked (containerd does not CHECK at
        all after a restart)."""
        bound = asyncio.Semaphore(_RECOVERY_CHECKS)
        await asyncio.gather(*(self._check_network(sid, bound) for sid in ids))

    async def _check_network(self, sid: str, bound: asyncio.Semaphore) -> None:
        async with bound, self.locks(sid).read():  # not while a stop or removal runs
            rec = self.store.get(sid)
            if rec is None or not rec.ready:
                return
            problem = await self.network.check(rec.id, rec.netns, rec.runtime_handler)
        if problem is not None:
            log.warning("pod sandbox %s: network CHECK failed, marking it not ready: %s",
                        sid, problem)
            self._not_ready(sid)

    async def _recover_one(self, rec: SandboxRecord, states: dict[str, RuncState],
                           submit: Callable[[Exit], None]) -> None:
        if rec.creating:
            log.info("pod sandbox %s: undoing an interrupted creation", rec.id)
            for c in self.containers.of_sandbox(rec.id):
                await remove_locked(self.containers, c.id)
            await self.controller.shutdown(rec.id)
            if rec.netns:
                await self._detach(rec.id)
                await asyncio.to_thread(remove_netns, rec.netns)
            self.store.delete(rec.id)
            return
        self.names.reserve(rec.name, rec.id)
        if rec.phase is PodPhase.REMOVING:
            log.info("pod sandbox %s: finishing an interrupted removal", rec.id)
            await self._stop_locked(rec.id)
            await self._remove_rest(rec)
            return
        if not rec.ready:
            return
        status = self.controller.recovered_status(rec.id, states)
        if status.exit is not None:
            submit(status.exit)  # handled after recovery, as a fresh exit
        elif status.state is not SandboxState.RUNNING:
            log.warning("pod sandbox %s: its %s gone", rec.id,
                        "pause process is" if rec.controller == "pause"
                        else "pinned namespaces are")
            self._not_ready(rec.id)
        elif rec.netns and not is_pinned(rec.netns):
            log.warning("pod sandbox %s: network namespace %s is gone", rec.id, rec.netns)
            self._not_ready(rec.id)

    async def details(self, rec: SandboxRecord) -> dict[str, Any]:
        """PodSandboxStatus verbose info (containerd's keys)."""
        status = await self.controller.status(rec.id, verbose=True)
        return {"pid": rec.pid, "processStatus": status.state,
                "netNamespaceClosed": bool(rec.netns) and not is_pinned(rec.netns),
                "netns": rec.netns, "image": rec.image_name, "snapshotKey": rec.id,
                "cniResult": {c.ifname: c.result for c in self.network.cache.of(rec.id)},
                "snapshotter": self.images.snapshotter.name,
                "runtimeSpec": status.info.get("runtimeSpec"), **_recorded_resources(rec)}


def _recorded_resources(rec: SandboxRecord) -> dict[str, Any]:
    """Verbose info ``overhead`` and ``resources`` (containerd's keys, ``{"linux": ...}``):
    from RunPodSandbox, replaced by UpdatePodSandboxResources."""
    linux = rec.config.linux
    return {key: {"linux": resources_json(getattr(linux, key))}
            for key in ("overhead", "resources") if linux.HasField(key)}
