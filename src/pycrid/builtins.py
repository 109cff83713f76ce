"""The built-in plugins: registration is wiring only.

Each init fetches what it needs from the context and hands it to a
constructor that knows nothing of the registry (containerd's
plugins/cri/cri.go pattern), so tests can build the same objects directly.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from pycrid import release
from pycrid.config.images_schema import ImagesConfig
from pycrid.config.loader import LoadedConfig
from pycrid.config.schema import CAdvisorConfig, CRIServerConfig, NRIConfig, RuntimeConfig
from pycrid.oci.spec import configured_driver
from pycrid.plugin.registry import Registration, Registry, SkipPlugin
from pycrid.plugin.startup import InitContext
from pycrid.tasks import Owner

log = logging.getLogger(__name__)

METADATA = "pycrid.metadata.v1"
CONTENT = "pycrid.content.v1"
SNAPSHOTTER = "pycrid.snapshotter.v1"
CRI = "pycrid.cri.v1"
GRPC = "pycrid.grpc.v1"
RUNTIME = "pycrid.runtime.v1"
SANDBOX = "pycrid.sandbox.v1"
NRI = "pycrid.nri.v1"
HOST = "pycrid.host.v1"
CADVISOR = "pycrid.cadvisor.v1"

#: Config layout 1 kept the image keys in the CRI server's own section.
_V1_CRI_SECTION = f"{GRPC}.cri"


def _owner(ctx: InitContext, name: str) -> Owner:
    """A child of the daemon's owner (a fresh one when a test builds plugins by hand)."""
    parent: Owner | None = ctx.properties.get("owner")
    return parent.child(name) if parent is not None else Owner(name)


def _root(ctx: InitContext, name: str) -> str:
    path = os.path.join(ctx.properties["root"], name)
    os.makedirs(path, mode=0o700, exist_ok=True)
    return path


async def _init_metadata(ctx: InitContext) -> Any:
    from pycrid.store.db import Database

    return Database(os.path.join(_root(ctx, "metadata"), "pycrid.db"))


async def _init_content(ctx: InitContext) -> Any:
    from pycrid.images.content import ContentStore

    return ContentStore(_root(ctx, "content"))


async def _init_overlayfs(ctx: InitContext) -> Any:
    from pycrid.images.overlay import OverlaySnapshotter

    db = ctx.get_by_id(METADATA, "sqlite")
    return OverlaySnapshotter(_root(ctx, os.path.join("snapshots", "overlayfs")), db)


def _migrate_images(from_version: int, plugins: dict[str, Any]) -> None:
    """Version 1 -> 2: image keys move from the CRI server's section to their own."""
    if from_version != 1:
        return
    old = plugins.get(_V1_CRI_SECTION)
    if not isinstance(old, dict):
        return
    new = plugins.setdefault(f"{CRI}.images", {})
    for key in ("sandbox_image", "max_concurrent_downloads", "image_pull_progress_timeout"):
        if key in old:
            new.setdefault(key, old.pop(key))
    legacy = old.get("containerd")
    if isinstance(legacy, dict) and "snapshotter" in legacy:
        new.setdefault("snapshotter", legacy.pop("snapshotter"))
        if not legacy:
            del old["containerd"]
    reg = old.get("registry")
    if isinstance(reg, dict):
        new.setdefault("registry", {}).update(reg)
        del old["registry"]
    if not old:
        del plugins[_V1_CRI_SECTION]


def _migrate_runtime(from_version: int, plugins: dict[str, Any]) -> None:
    """Version 1 -> 2: ``systemd_cgroup = true`` becomes ``cgroup_driver = "systemd"``."""
    if from_version != 1:
        return
    old = plugins.get(_V1_CRI_SECTION)
    if isinstance(old, dict) and "systemd_cgroup" in old:
        systemd = old.pop("systemd_cgroup")
        plugins.setdefault(f"{CRI}.runtime", {}).setdefault(
            "cgroup_driver", "systemd" if systemd is True else "cgroupfs")
        if not old:
            del plugins[_V1_CRI_SECTION]


async def _init_images(ctx: InitContext) -> Any:
    from pycrid.images.distribution import RegistryClient
    from pycrid.images.hosts import RegistryHosts
    from pycrid.images.image_service import ImageService
    from pycrid.images.partial.file_index import FileIndex
    from pycrid.store.image_records import ImageStore

    config: ImagesConfig = ctx.config
    db = ctx.get_by_id(METADATA, "sqlite")
    hosts = RegistryHosts(config.registry.config_path or None)
    client = RegistryClient(hosts)
    service = ImageService(
        store=ImageStore(db),
        content=ctx.get_by_id(CONTENT, "content"),
        snapshotter=ctx.get_by_id(SNAPSHOTTER, config.snapshotter),
        client=client,
        config=config,
        metrics=ctx.properties.get("metrics"),
        owner=_owner(ctx, "images"),
        files=FileIndex(db),
    )
    service.policy = _signature_policy(config, db, client, hosts)
    return service


def _signature_policy(config: ImagesConfig, db: Any, client: Any, hosts: Any) -> Any:
    """The signature policy part: the files are read at each pull, but a configured policy
    that is not there stops start-up (the default path may be absent: no verification)."""
    from pycrid.config.decode import ConfigError
    from pycrid.config.images_schema import DEFAULT_POLICY
    from pycrid.images.policy.enforcer import PolicySettings, SignaturePolicy
    from pycrid.images.policy.sources import SignatureSource
    from pycrid.store.signature_records import SignatureStore

    section = f'plugins."{CRI}.images"'
    path = config.signature_policy
    optional = path == DEFAULT_POLICY
    if path and not optional and not os.path.isfile(path):
        raise ConfigError(f"{section}.signature_policy", f"{path} does not exist")
    policy = SignaturePolicy(
        PolicySettings(path, optional, config.signature_policy_dir, config.registries_d),
        SignatureSource(client, hosts), SignatureStore(db))
    state = policy.describe()["state"]
    log.info("signature policy %s: %s", path or "(none)", state)
    return policy


async def _init_runtime_config(ctx: InitContext) -> Any:
    # The CRI runtime section: read by the runtime, sandbox and CRI plugins.
    from pycrid.config.decode import ConfigError
    from pycrid.config.schema import RUNSC_TYPE, RuntimeHandlerConfig
    from pycrid.runtime.runsc_config import available as runsc_available

    config: RuntimeConfig = ctx.config
    # A config that adds handlers keeps the default runc one, as containerd's does.
    config.runtimes.setdefault("runc", RuntimeHandlerConfig())
    # gVisor when it is installed: a RuntimeClass with handler runsc then needs no config.
    if config.discover_runsc and "runsc" not in config.runtimes and runsc_available():
        config.runtimes["runsc"] = RuntimeHandlerConfig(runtime_type=RUNSC_TYPE)
    if config.default_runtime_name not in config.runtimes:
        raise ConfigError(f'plugins."{CRI}.runtime".default_runtime_name',
                          f"{config.default_runtime_name!r} is not one of runtimes "
                          f"({', '.join(sorted(config.runtimes))})")
    return config


async def _init_nri_config(ctx: InitContext) -> Any:
    # containerd's io.containerd.nri.v1.nri section; the CRI plugin builds NRI from it.
    from pycrid.nri.adaptation.plugin_socket import check_socket_free

    check_socket_free(ctx.config)
    return ctx.config


async def _init_host_facts(ctx: InitContext) -> Any:
    # What this node offers, probed once for every part (runc: the default handler's).
    from pycrid.host.facts import probe
    from pycrid.oci.defaults import ALL_CAPABILITIES
    from pycrid.runtime.handlers import default_runc

    config: RuntimeConfig = ctx.get_by_id(CRI, "runtime")
    return await probe(default_runc(config), ALL_CAPABILITIES, config.criu_path)


async def _init_runc(ctx: InitContext) -> Any:
    # One runtime (binary, root) per runtime handler, routed by object id: runc under
    # conmon, or gVisor's runsc under conmon for a handler of that type.
    import dataclasses

    from pycrid.runtime.conmon import ConmonRuntime
    from pycrid.runtime.handlers import (
        HandlerFeatures,
        RuntimeRouter,
        load_handlers,
        probe_features,
    )
    from pycrid.runtime.interface import ContainerRuntime
    from pycrid.runtime.runc_checkpoint import CheckpointSupport
    from pycrid.runtime.runc_cli import find_binary
    from pycrid.runtime.runsc import RunscRuntime
    from pycrid.runtime.runsc_config import known_capabilities, probe_runsc
    from pycrid.stats.cgroup_hierarchy import hierarchy_of

    config: RuntimeConfig = ctx.get_by_id(CRI, "runtime")
    state = ctx.properties["state"]
    handlers = load_handlers(config, state)
    runtimes: dict[str, ContainerRuntime] = {}
    facts = ctx.get_by_id(HOST, "facts")
    cgroups = hierarchy_of(facts.cgroup_mounts)
    systemd = config.cgroup_driver == "systemd"
    owner = _owner(ctx, "conmon monitors")
    for name, spec in handlers.items():
        if spec.runsc is not None:
            runsc = spec.runsc
            probe = await probe_runsc(runsc.binary)
            runtimes[name] = RunscRuntime(state_dir=state, settings=runsc,
                                          conmon=config.conmon_path, systemd_cgroup=systemd,
                                          cgroups=cgroups, owner=owner, probe=probe,
                                          cgroup_roots=tuple(sorted(
                                              {m.mount_point for m in facts.cgroup_mounts})))
            # gVisor's read-only bind mounts are read-only all the way down.
            features = HandlerFeatures(recursive_read_only_mounts=True,
                                       update_resources=probe.can_update)
            spec = dataclasses.replace(spec, capabilities=known_capabilities(probe.version),
                                       version=probe.version)
            log.info("runtime handler %s: gVisor runsc %s at %s (root %s, flags %s)", name,
                     probe.version, runsc.binary, runsc.root, " ".join(runsc.args("%ID%")))
        else:
            runc = find_binary(spec.runc_binary, "runc", "runtime_path")
            features = await probe_features(runc)
            runtimes[name] = ConmonRuntime(state_dir=state, runc=runc,
                                           conmon=config.conmon_path, runc_root=spec.runc_root,
                                           systemd_cgroup=systemd, cgroups=cgroups,
                                           owner=owner, checkpoints=CheckpointSupport(
                                               facts.criu, runc_can=features.checkpoint))
            spec = dataclasses.replace(spec, runc_binary=runc)  # as found on the search path
        handlers[name] = dataclasses.replace(spec, features=features)
    return RuntimeRouter(runtimes, config.default_runtime_name, handlers)


async def _init_podsandbox(ctx: InitContext) -> Any:
    from pycrid.oci.spec_inputs import HostInput, SpecPolicy
    from pycrid.sandbox.pause import PauseController

    config: RuntimeConfig = ctx.get_by_id(CRI, "runtime")
    images = ctx.get_by_id(CRI, "images")
    runtime = ctx.get_by_id(RUNTIME, "runc")
    return PauseController(runtime=runtime, handlers=runtime.handlers,
                           snapshotter=images.snapshotter, root_dir=ctx.properties["root"],
                           state_dir=ctx.properties["state"],
                           host=HostInput.from_facts(ctx.get_by_id(HOST, "facts")),
                           policy=SpecPolicy(cgroup_driver=configured_driver(config.cgroup_driver),
                                             unset_seccomp_profile=config.unset_seccomp_profile),
                           slow_chown=images.config.slow_chown)


async def _init_pinned(ctx: InitContext) -> Any:
    from pycrid.sandbox.pinned import PinnedController
    from pycrid.stats.cgroup_hierarchy import hierarchy_of

    config: RuntimeConfig = ctx.get_by_id(CRI, "runtime")
    return PinnedController(root_dir=ctx.properties["root"], state_dir=ctx.properties["state"],
                            cgroups=hierarchy_of(ctx.get_by_id(HOST, "facts").cgroup_mounts),
                            cgroup_driver=configured_driver(config.cgroup_driver))


async def _init_cri(ctx: InitContext) -> Any:
    from pycrid.core.cri_service import CoreConfig
    from pycrid.core_wiring import CoreInputs, build_core
    from pycrid.cri.grpc_plugin import CRIPlugin
    from pycrid.nri.adaptation.call_accounting import PluginInstruments

    loaded: LoadedConfig = ctx.properties["loaded_config"]
    runtime = ctx.get_by_id(RUNTIME, "runc")
    # Metrics and tracing are the daemon's (absent when tests build a core by hand).
    metrics = ctx.properties.get("metrics")
    tracer = ctx.properties.get("tracer")
    db = ctx.get_by_id(METADATA, "sqlite")
    core = build_core(
        CoreInputs(
            db=db,
            images=ctx.get_by_id(CRI, "images"),
            runtime=runtime,
            handlers=runtime.handlers,
            controller=ctx.get_by_id(SANDBOX, "podsandbox"),
            pinned=ctx.get_by_id(SANDBOX, "pinned"),
            host=ctx.get_by_id(HOST, "facts"),
            nri_instruments=PluginInstruments(observer=metrics, tracer=tracer),
            owner=_owner(ctx, "cri"),
        ),
        CoreConfig(config=loaded.config, runtime=ctx.get_by_id(CRI, "runtime"),
                   nri=ctx.get_by_id(NRI, "nri"), warnings=loaded.warnings,
                   source=loaded.source))
    # Every component's schema is known to be readable by now (the last, pods, by
    # build_core): the state says which release started on it, for a later refusal.
    db.record_start(release.VERSION, release.commit())
    if metrics is not None:
        metrics.bind(core)
    return CRIPlugin(core=core, server_config=ctx.config, ready=ctx.register_readiness(),
                     state_dir=ctx.properties["state"],
                     record=None if metrics is None else metrics.cri_call, tracer=tracer)


async def _init_containerd_api(ctx: InitContext) -> Any:
    # Served from init, before recovery: the kubelet's cAdvisor dials it once at its own
    # start, and the records it reads are in memory from the start.
    from pycrid.cadvisor.containerd_api import handlers
    from pycrid.cadvisor.containerd_socket import ContainerdEndpoint
    from pycrid.cadvisor.view import view_of
    from pycrid.errors import FailedPrecondition

    config: CAdvisorConfig = ctx.config
    if config.disable:
        raise SkipPlugin("disabled in its config (disable = true)")
    core = ctx.get_by_id(GRPC, "cri").core
    endpoint = ContainerdEndpoint(config.socket_path, handlers(view_of(core)))
    try:
        await endpoint.start()
    except FailedPrecondition as e:  # a real containerd's socket, most likely: not ours
        message = f"containerd's API for the kubelet's cAdvisor is not served: {e}"
        log.warning("%s", message)
        core.warnings.append(message)
        raise SkipPlugin(str(e)) from None
    core.sockets["containerd"] = config.socket_path
    return endpoint


def registry() -> Registry:
    reg = Registry()
    reg.register(Registration(type=METADATA, id="sqlite", init=_init_metadata))
    reg.register(Registration(type=CONTENT, id="content", init=_init_content))
    reg.register(Registration(type=SNAPSHOTTER, id="overlayfs", requires=(METADATA,),
                              init=_init_overlayfs))
    reg.register(Registration(type=CRI, id="images", requires=(METADATA, CONTENT, SNAPSHOTTER),
                              config=ImagesConfig, migrate=_migrate_images, init=_init_images))
    reg.register(Registration(type=CRI, id="runtime", config=RuntimeConfig,
                              migrate=_migrate_runtime, init=_init_runtime_config))
    reg.register(Registration(type=HOST, id="facts", requires=(CRI,), init=_init_host_facts))
    reg.register(Registration(type=RUNTIME, id="runc", requires=(CRI, HOST), init=_init_runc))
    reg.register(Registration(type=SANDBOX, id="podsandbox", requires=(CRI, RUNTIME, HOST),
                              init=_init_podsandbox))
    reg.register(Registration(type=SANDBOX, id="pinned", requires=(CRI, HOST),
                              init=_init_pinned))
    reg.register(Registration(type=NRI, id="nri", config=NRIConfig, init=_init_nri_config))
    reg.register(Registration(type=GRPC, id="cri",
                              requires=(METADATA, CRI, HOST, RUNTIME, SANDBOX, NRI),
                              config=CRIServerConfig, init=_init_cri))
    reg.register(Registration(type=CADVISOR, id="containerd", requires=(GRPC,),
                              config=CAdvisorConfig, init=_init_containerd_api))
    return reg
