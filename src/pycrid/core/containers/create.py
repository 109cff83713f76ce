"""CreateContainer: reserve the name, record the intent, have the bundle built, let NRI
adjust the spec, create the runc container; each step's undo is pushed as the step
begins (every undo is idempotent), so a failure at any point leaves nothing behind. The
call runs detached from its client (operations.py): a client that goes away makes it
stop at its next named step and undo itself."""

from __future__ import annotations

import json
import logging
import os
import secrets
import signal

from cri_api.v1 import api_pb2 as pb

from pycrid.core import events
from pycrid.core.containers import restore
from pycrid.core.containers.parts import ContainerParts, now_ns
from pycrid.core.containers.remove import cleanup
from pycrid.core.registrar import resolve_prefix
from pycrid.errors import FailedPrecondition, InvalidArgument, NotFound
from pycrid.faults import step
from pycrid.oci.resources import record_of
from pycrid.oci.spec_mounts import IMAGE_VOLUME_FAILED, check_image_mount, is_image_mount
from pycrid.operations import Undo, detached, finish
from pycrid.runtime.container_bundles import (
    ContainerBundleRequest,
    ContainerImage,
    ContainerPod,
    VolumeImage,
)
from pycrid.runtime.interface import CreateOptions
from pycrid.store.image_records import ImageRecord
from pycrid.store.records import ContainerPhase, ContainerRecord, SandboxRecord

log = logging.getLogger(__name__)


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


@detached("CreateContainer", undo_on_cancel=True)
async def create_container(parts: ContainerParts, sandbox_prefix: str,
                           config: pb.ContainerConfig,
                           sandbox_config: pb.PodSandboxConfig | None) -> str:
    _validate(config)
    if not sandbox_prefix:
        raise InvalidArgument("pod_sandbox_id must not be empty")
    sid = _runnable_sandbox(parts, sandbox_prefix)
    async with parts.nri.blocking_sync(), parts.locks(sid).read():
        sandbox = parts.sandboxes.get(sid)
        if sandbox is None or not sandbox.ready:
            raise FailedPrecondition(f"pod sandbox {sandbox_prefix} is not ready")
        plan = await restore.plan(parts, config, sandbox)
        if plan is not None:
            return await _create(parts, sandbox, plan.config, sandbox_config, plan)
        return await _create(parts, sandbox, config, sandbox_config)


def _runnable_sandbox(parts: ContainerParts, prefix: str) -> str:
    """The id of the pod ``prefix`` names, at once. A pod whose RunPodSandbox has not
    returned (an NRI plugin may still hold its event) is not there yet: the create
    fails instead of waiting for the pod's lock (containerd adds a sandbox to its store
    only after the NRI hook, so it answers NotFound too)."""
    try:
        sid = resolve_prefix([r.id for r in parts.sandboxes.visible()], prefix, "pod sandbox")
    except NotFound:
        if any(r.id.startswith(prefix) and r.creating
               for r in parts.sandboxes.all()):
            raise NotFound(f"pod sandbox {prefix} is not ready: it is still being created "
                           "(RunPodSandbox has not returned)") from None
        raise
    return sid


async def _create(parts: ContainerParts, sandbox: SandboxRecord, config: pb.ContainerConfig,
                  sandbox_config: pb.PodSandboxConfig | None,
                  plan: restore.RestorePlan | None = None) -> str:
    """The create; with ``plan``, of a container restored from a checkpoint: its archive
    unpacked and its rootfs changes applied, its log carried over, no runc container
    until StartContainer restores one (restore.py)."""
    image = parts.images.resolve_local(config.image.image)
    if image is None:
        raise NotFound(f"image {config.image.image!r} not found: pull it first")
    view = parts.images.view(image)
    volume_images = _volume_images(parts, config)
    # The pod namespace's signature policy, with the signatures kept from the pull (CRI-O
    # checks at create too): an image pulled for another namespace, or under an older
    # policy, runs only if this one accepts it.
    namespace = sandbox.config.metadata.namespace
    await parts.images.check_run(image, [config.image.user_specified_image,
                                         config.image.image], namespace)
    for i, vol in volume_images.items():
        m = config.mounts[i]
        await parts.images.check_run(vol, [m.image.user_specified_image, m.image.image],
                                     namespace)
    image_config = json.loads(parts.images.content.read(image.id))
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

    async with Undo() as undo:
        parts.names.reserve(name, cid)
        undo.callback(parts.names.release, name)
        log.info("creating container %s (%s) in pod sandbox %s", cid, name, sandbox.id)
        rec = parts.store.put(ContainerRecord(
            id=cid, sandbox_id=sandbox.id, name=name, config=config,
            created_at=now_ns(), image_id=image.id,
            image_name=view.repo_tags[0] if view.repo_tags else config.image.image,
            image_ref=view.repo_digests[0] if view.repo_digests else image.id,
            log_path=log_path, stop_signal=stop_signal))
        undo.callback(parts.store.delete, cid)
        await step("container.record")
        undo.push_async_callback(cleanup, parts, cid)
        diff = ""
        if plan is not None:
            diff = await restore.unpack_archive(parts, cid, plan)  # stops when asked
            await step("restore.unpacked")
        # Snapshots, mounts and volume copies are made by threads: never cut short.
        built = await finish(parts.bundles.build(ContainerBundleRequest(
            cid, config,
            ContainerPod(sandbox.id, pod_config, namespaces=parts.controller.namespaces(sandbox),
                         files=parts.controller.files(sandbox.id),
                         runtime_handler=sandbox.runtime_handler),
            ContainerImage(image_config, image.chain[-1] if image.chain else None,
                           {i: VolumeImage(v.id, v.chain[-1])
                            for i, v in volume_images.items()}),
            target_pid=_target_pid(parts, config, sandbox), rootfs_diff=diff)))
        spec = built.spec
        if plan is not None:
            restore.check_compatible(plan, spec)
        undo.push_async_callback(parts.nri.undo_container, cid)  # Stop and Remove
        await parts.nri.create_container(rec, spec)
        await finish(parts.bundles.write_spec(cid, spec))
        await step("container.bundle")
        if log_path:
            os.makedirs(os.path.dirname(log_path), mode=0o755, exist_ok=True)
        if plan is not None:
            undo.callback(restore.forget_log, log_path)  # a copy cut short goes too
            await finish(restore.restore_log(parts, cid, log_path))
            await step("restore.logged")
            pid = 0
        else:
            # conmon goes on without us: let it report, so the undo knows what it made.
            pid = await finish(parts.runtime.create(create_options(parts, rec, sandbox)))
        await step("container.created")
        user = spec["process"]["user"]
        rec = parts.store.update(cid, phase=ContainerPhase.CREATED, pid=pid, uid=user["uid"],
                                 gid=user["gid"], groups=tuple(user.get("additionalGids") or ()),
                                 resources=record_of(spec), config=built.config,
                                 restore=plan is not None)
        undo.pop_all()
    log.info("created container %s", cid)
    parts.events.emit(events.CREATED, cid, sandbox.id)
    await parts.nri.post_create(rec)
    return cid


def create_options(parts: ContainerParts, rec: ContainerRecord,
                   sandbox: SandboxRecord) -> CreateOptions:
    """How the runtime makes the container (conmon's flags): at create, or at a
    restored container's start."""
    config = rec.config
    return CreateOptions(
        id=rec.id, bundle=parts.paths.bundle(rec.id), name=rec.name, log_path=rec.log_path,
        tty=config.tty, stdin=config.stdin, stdin_once=config.stdin_once,
        runtime_handler=sandbox.runtime_handler)


def _volume_images(parts: ContainerParts, config: pb.ContainerConfig
                   ) -> dict[int, ImageRecord]:
    """The image of each image volume, by mount index, checked before any side effect:
    the kubelet pulls them first, so a missing one is NotFound (containerd resolves
    them locally too)."""
    found: dict[int, ImageRecord] = {}
    for i, m in enumerate(config.mounts):
        if not is_image_mount(m):
            continue
        check_image_mount(m)
        img = parts.images.resolve_local(m.image.image)
        if img is None or not img.chain:
            raise NotFound(f"{IMAGE_VOLUME_FAILED}: mount {m.container_path!r}: image "
                           f"{m.image.image!r} not found: pull it first")
        found[i] = img
    return found


def _target_pid(parts: ContainerParts, config: pb.ContainerConfig,
                sandbox: SandboxRecord) -> int | None:
    """§2.14: a TARGET pid namespace is a running container of the same pod."""
    opts = config.linux.security_context.namespace_options
    if opts.pid != pb.TARGET:
        return None
    target = parts.store.get(opts.target_id)
    if target is None or target.sandbox_id != sandbox.id:
        raise NotFound(f"target container {opts.target_id!r} not found in pod {sandbox.id}")
    if target.state != pb.CONTAINER_RUNNING or target.pid <= 0:
        raise FailedPrecondition(f"target container {opts.target_id!r} is not running")
    return target.pid
