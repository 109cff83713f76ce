"""Wire the core from its parts: which concrete part fills each interface the core calls.

Kept out of the core (containerd keeps its CRI plugin's wiring apart from the service the
same way), so the core's modules name interfaces; only this module names the concrete
sandbox router, bundle builder, pod network and stores.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field

from pycrid.config.schema import RUNSC_TYPE
from pycrid.core import orphans
from pycrid.core.anchors import PodAnchors
from pycrid.core.containers import ContainerParts
from pycrid.core.containers.stop import evict
from pycrid.core.containers.update import apply_resources
from pycrid.core.cri_service import CoreConfig, CoreParts, CRIService
from pycrid.core.events import ContainerEvents
from pycrid.core.nri_relay import NRI, ContainerActions, RelaySources
from pycrid.core.pods.pod_parts import PodHandlers, PodParts
from pycrid.core.registrar import KeyedLocks
from pycrid.core.stats_queries import StatsService
from pycrid.host.facts import HostFacts
from pycrid.images.image_service import ImageService
from pycrid.network.netns_cni import NetnsCNI
from pycrid.network.pod_networks import PodNetworks
from pycrid.nri.adaptation.call_accounting import PluginInstruments
from pycrid.oci.nri_host_support import HostSupport
from pycrid.oci.resources import ResourcePolicy
from pycrid.oci.spec import configured_driver
from pycrid.oci.spec_inputs import HostInput, SpecPolicy
from pycrid.operations import Operations
from pycrid.runtime.bundle import ContainerPaths
from pycrid.runtime.handlers import HandlerSpec
from pycrid.runtime.interface import ContainerRuntime
from pycrid.runtime.snapshot_bundles import BundleSettings, SnapshotBundles
from pycrid.sandbox.controller import SandboxController
from pycrid.sandbox.router import SandboxRouter
from pycrid.stats.cgroup_hierarchy import hierarchy_of
from pycrid.store.db import Database
from pycrid.store.records import container_store, sandbox_store
from pycrid.tasks import Owner


@dataclass(frozen=True)
class CoreInputs:
    """The parts the core is built on, each made by its own plugin."""

    db: Database
    images: ImageService
    runtime: ContainerRuntime
    #: Pods with a pause container; ``pinned`` (when given) pods without one.
    controller: SandboxController
    host: HostFacts
    #: The daemon's owner of the core's tasks.
    owner: Owner
    handlers: Mapping[str, HandlerSpec] = field(default_factory=dict)
    pinned: SandboxController | None = None
    nri_instruments: PluginInstruments | None = None



def build_core(inputs: CoreInputs, settings: CoreConfig) -> CRIService:
    """Wire the core from its parts (used by the CRI plugin and by tests).

    The NRI side is built here with the stores it reports on, never on its own, so every
    exit the core sees, from start-up recovery on, can reach plugins."""
    runtime_config, host, runtime = settings.runtime, inputs.host, inputs.runtime
    root, state = settings.config.root, settings.config.state
    handlers = dict(inputs.handlers)
    images = inputs.images
    locks = KeyedLocks()
    sandboxes = sandbox_store(inputs.db)
    pinned = inputs.pinned
    controllers = {"pause": inputs.controller, **({"pinned": pinned} if pinned else {})}
    controller = SandboxRouter(controllers, lambda sid: (
        rec.controller if (rec := sandboxes.get(sid)) is not None else None))
    ctr_store = container_store(inputs.db)
    anchors = PodAnchors(controller=controller, sandboxes=sandboxes, containers=ctr_store)
    events = ContainerEvents(sandboxes, ctr_store)
    driver = configured_driver(runtime_config.cgroup_driver)
    paths = ContainerPaths(state_dir=state, root_dir=root)
    resource_policy = ResourcePolicy(
        host.cgroups, runtime_config.disable_hugetlb_controller,
        runtime_config.tolerate_missing_hugetlb_controller, runtime_config.pids_limit)
    bundles = SnapshotBundles(images.snapshotter, paths, BundleSettings(
        host=HostInput.from_facts(host),
        policy=SpecPolicy(cgroup_driver=driver, resources=resource_policy,
                          unset_seccomp_profile=runtime_config.unset_seccomp_profile),
        handlers=handlers, default_handler=runtime_config.default_runtime_name,
        slow_chown=images.config.slow_chown))
    # NRI and the containers need each other: the relay's actions call the container
    # operations on the parts built just below.
    containers: ContainerParts
    nri = NRI(settings.nri,
              sources=RelaySources(
                  sandboxes=sandboxes, containers=ctr_store,
                  pod_cgroups_path=lambda rec: anchors.of(rec).cgroups_path,
                  pod_namespaces=controller.namespaces,
                  read_spec=bundles.read_spec, sandboxed=_gvisor_seccomp(
                      handlers, runtime_config.default_runtime_name)),
              actions=ContainerActions(
                  apply_resources=lambda cid, res: apply_resources(containers, cid, res),
                  evict=lambda cid, why: evict(containers, cid, why)),
              host=HostSupport.from_facts(host), instruments=inputs.nri_instruments,
              owner=inputs.owner.child("nri"))
    containers = ContainerParts(
        store=ctr_store, sandboxes=sandboxes, controller=controller, runtime=runtime,
        bundles=bundles, images=images, paths=paths, locks=locks, nri=nri, events=events,
        resource_policy=resource_policy, anchors=anchors,
        operations=Operations(inputs.owner.child("operations")),
        default_handler=runtime_config.default_runtime_name)
    network = PodNetworks(runtime_config.cni, runtime_config.runtimes,
                          runtime_config.default_runtime_name, os.path.join(root, "cni"),
                          owner=inputs.owner.child("CNI conf dirs"))
    pods = PodParts(store=sandboxes, controller=controller, containers=containers,
                    images=images, network=NetnsCNI(network, os.path.join(state, "netns")),
                    locks=locks, nri=nri, events=events, handlers=PodHandlers.of(
                        runtime_config.runtimes.keys(), runtime_config.default_runtime_name,
                        userns=[n for n, h in handlers.items() if h.features.user_namespaces],
                        drop_infra=runtime_config.drop_infra_ctr and pinned is not None,
                        podsandbox=[n for n, h in runtime_config.runtimes.items()
                                    if h.sandboxer == "podsandbox"],
                        # gVisor's sandbox is the pod's pause container: always one.
                        sandboxed=[n for n, h in runtime_config.runtimes.items()
                                   if h.runtime_type == RUNSC_TYPE]))
    stats = StatsService(pods=pods, containers=containers, snapshotter=images.snapshotter,
                         period=float(runtime_config.stats_collect_period), cgroup_driver=driver,
                         anchor=anchors.of, hierarchy=hierarchy_of(host.cgroup_mounts),
                         owner=inputs.owner.child("stats"))
    parts = CoreParts(images=images, pods=pods, containers=containers, runtime=runtime,
                      nri=nri, events=events, stats=stats, anchors=anchors,
                      handlers=handlers, host=host)
    return CRIService(parts, settings, owner=inputs.owner, layout=orphans.Layout(
        root=root, state=state, exit_dir=runtime.exit_dir))


def _gvisor_seccomp(handlers: Mapping[str, HandlerSpec], default: str) -> dict[str, bool]:
    """The gVisor handlers ("" for the default when it is one), each with whether it applies
    OCI seccomp policies (runsc --oci-seccomp)."""
    out = {name: h.runsc.oci_seccomp for name, h in handlers.items() if h.runsc is not None}
    if default in out:
        out[""] = out[default]
    return out
