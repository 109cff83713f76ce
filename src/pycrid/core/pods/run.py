"""RunPodSandbox, the readable sequence of DESIGN.md.

Reserve the name, record the intent, make the network namespace, attach it to the pod
network (CNI ADD), let the sandbox controller create and start the pause container,
mark the pod ready; each step's undo is pushed as the step begins (every undo is
idempotent), so a failure at any point leaves nothing behind. The call runs detached
from its client (operations.py): a client that goes away makes it stop at its next
named step and undo itself; a step is never cut in the middle.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import secrets

from cri_api.v1 import api_pb2 as pb

from pycrid.core import events
from pycrid.core.containers import now_ns
from pycrid.core.pods.pause_exit import lost
from pycrid.core.pods.pod_parts import PodHandlers, PodParts, detach
from pycrid.errors import InvalidArgument
from pycrid.faults import step
from pycrid.oci.security import validate_pod as validate_pod_security
from pycrid.oci.spec import pod_idmap
from pycrid.operations import Undo, detached, finish, interruptible
from pycrid.sandbox.controller import SandboxRequest
from pycrid.store.image_records import ImageRecord
from pycrid.store.records import PodPhase, SandboxRecord

log = logging.getLogger(__name__)


@detached("RunPodSandbox", undo_on_cancel=True)
async def run_pod(parts: PodParts, config: pb.PodSandboxConfig, handler: str) -> str:
    _validate(parts, config, handler)
    chosen = handler or parts.handlers.default  # the record keeps the name as asked
    opts = config.linux.security_context.namespace_options
    idmap = pod_idmap(opts)  # checks the mappings before any side effect
    if idmap is not None and chosen not in parts.handlers.userns:
        # The kubelet checks this handler feature (Status) before asking; refuse a
        # request that skipped the check instead of failing deep inside runc.
        raise InvalidArgument(f"runtime handler {chosen!r} does not support user "
                              "namespaces (its runc has no idmapped mounts)")
    md = config.metadata
    name = f"{md.name}_{md.namespace}_{md.uid}_{md.attempt}"
    sid = secrets.token_hex(32)
    host_network = config.linux.security_context.namespace_options.network == pb.NODE
    async with (parts.nri.blocking_sync(), parts.locks(sid).write(), Undo() as undo):
        parts.names.reserve(name, sid)
        undo.callback(parts.names.release, name)
        # CRI-O's pair of lines (running, then ready): an operator can follow a pod's
        # id from the request to the result, also when it fails in between.
        log.info("running pod sandbox %s (%s)", sid, name)
        kind = _controller_for(parts.handlers, config, chosen)
        # A pod without a pause process needs no sandbox image (a pull stops cleanly).
        image = await interruptible(_sandbox_image(parts)) if kind == "pause" else None
        netns = "" if host_network else parts.network.new_netns_path()
        parts.store.put(SandboxRecord(
            id=sid, name=name, config=config, runtime_handler=handler,
            created_at=now_ns(), netns=netns, controller=kind,
            image_id=image.id if image is not None else "",
            image_name=parts.images.config.sandbox_image if image is not None else ""))
        undo.callback(parts.store.delete, sid)
        await step("sandbox.record")
        if netns:
            undo.push_async_callback(parts.network.remove_netns, netns)
            # A thread (or, for a pod in a user namespace, a helper process that makes
            # the netns inside it: network/netns.py): never cut short.
            await finish(parts.network.create_netns(netns, idmap))
            await step("sandbox.netns")
        undo.push_async_callback(parts.controller.shutdown, sid)
        # The pause joins the netns by path and CNI configures the netns: neither waits
        # for the other, so CNI ADD runs beside conmon + runc create/start (about a third
        # of RunPodSandbox; pycrid.bench.lifecycle). Both are let finish before any
        # unwinding; the pause's threads and conmon are never cut short.
        started, attached = await asyncio.gather(
            finish(_start_sandbox(parts, sid, config, image, netns, chosen)),
            _attach(parts, sid, netns, config, handler, undo), return_exceptions=True)
        failures = [o for o in (started, attached) if isinstance(o, BaseException)]
        for extra in failures[1:]:
            log.warning("pod %s: %s (while failing for another reason)", sid, extra)
        if failures:
            raise failures[0]
        assert isinstance(started, int)
        rec = parts.store.update(sid, pid=started)
        undo.push_async_callback(parts.nri.remove_pod, sid)  # Stop and Remove follow a Run
        await parts.nri.run_pod(rec)
        parts.store.update(sid, phase=PodPhase.READY)
        undo.pop_all()
    # Its pins (a pod without a pause) are watched from now on; a pause is watched
    # through its conmon since it was created.
    try:
        await parts.controller.watch(sid, functools.partial(lost, parts))
    except Exception:  # the pod is READY and recorded: answering an error would make
        # the kubelet run a second one
        log.exception("pod sandbox %s is ready, but watching its monitor failed", sid)
    log.info("pod sandbox %s is ready", sid)
    parts.events.emit(events.CREATED, sid, sid)
    parts.events.emit(events.STARTED, sid, sid)
    return sid


def _validate(parts: PodParts, config: pb.PodSandboxConfig, handler: str) -> None:
    md = config.metadata
    if not config.HasField("metadata") or not md.name or not md.namespace:
        raise InvalidArgument("pod sandbox config must include metadata with a name and "
                              "a namespace")
    known = parts.handlers.known
    if handler and handler not in known:
        raise InvalidArgument(f"no runtime for handler {handler!r} is configured "
                              f"(known: {', '.join(repr(h) for h in sorted(known))})")
    opts = config.linux.security_context.namespace_options
    if opts.network == pb.NODE and config.hostname:
        # runc refuses a hostname without a private UTS namespace; say so up front.
        raise InvalidArgument("a host-network pod shares the node's hostname: "
                              "hostname must be empty")
    if opts.network != pb.NODE:
        parts.network.validate(config)  # refuses unreadable limits before any side effect
    validate_pod_security(config)  # sysctls, seccomp profile: before any side effect


def _controller_for(handlers: PodHandlers, config: pb.PodSandboxConfig, handler: str) -> str:
    """"pinned" (no pause process) for a pod whose containers share no PID namespace,
    when drop_infra_ctr allows and its handler does not ask for a sandbox process
    (CRI-O's NeedsInfra); "pause" otherwise."""
    opts = config.linux.security_context.namespace_options
    if not handlers.drop_infra or opts.pid == pb.POD or handler in handlers.podsandbox:
        return "pause"
    return "pinned"


async def _start_sandbox(parts: PodParts, sid: str, config: pb.PodSandboxConfig,
                         image: ImageRecord | None, netns: str, handler: str) -> int:
    if image is None:
        req = SandboxRequest(id=sid, config=config, netns=netns, runtime_handler=handler)
    else:
        req = SandboxRequest(
            id=sid, config=config, image_name=parts.images.config.sandbox_image,
            image_config=json.loads(parts.images.content.read(image.id)),
            image_chain_top=image.chain[-1], netns=netns, runtime_handler=handler)
    await parts.controller.create(req)
    return await parts.controller.start(sid)


async def _attach(parts: PodParts, sid: str, netns: str, config: pb.PodSandboxConfig,
                  handler: str, undo: Undo) -> None:
    """CNI ADD; a failed ADD DELs itself, a finished one is the pod's. A client that goes
    away does not cut it short (the step after it undoes it): a plugin killed half-way
    can break the node's network, as the bridge plugin killed between attaching its veth
    and pinning the bridge's MAC leaves a bridge whose MAC falls to 00:00:00:00:00:00 with
    its last port, and every later ADD on it fails with "could not set bridge's mac"."""
    if not netns:
        return
    ips = await parts.network.set_up(sid, netns, config, handler)
    undo.push_async_callback(detach, parts, sid)
    parts.store.update(sid, ips=tuple(ips))
    await step("sandbox.network")


async def _sandbox_image(parts: PodParts) -> ImageRecord:
    ref = parts.images.config.sandbox_image
    image = parts.images.resolve_local(ref)
    if image is None:
        log.info("pulling sandbox image %s", ref)
        image = await parts.images.pull(ref, None)
    if not image.chain:
        raise InvalidArgument(f"sandbox image {ref} has no layers")
    return image
