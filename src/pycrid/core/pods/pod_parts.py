"""What the pod operations work with, in one frozen object, and the two steps they all
share: a pod stops being ready, a pod leaves its network.

The operations (run.py, stop.py, ...) are plain functions of ``PodParts``: no object
holds them, so each module reads as the one sequence it performs.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field

from pycrid.core import events
from pycrid.core.containers import ContainerParts
from pycrid.core.events import ContainerEvents
from pycrid.core.nri_relay import NRI
from pycrid.core.registrar import KeyedLocks, NameRegistrar, resolve_prefix
from pycrid.images.image_service import ImageService
from pycrid.network.sandbox_network import SandboxNetwork
from pycrid.operations import Operations
from pycrid.sandbox.controller import SandboxController
from pycrid.store.records import PodPhase, RecordStore, SandboxRecord


@dataclass(frozen=True)
class PodHandlers:
    """Which runtime handlers a pod may ask for, and what each gives it."""

    #: Every configured handler.
    known: frozenset[str]
    #: The handler of a pod that names none.
    default: str = "runc"
    #: Handlers whose runc can run CRI user namespaces (idmapped mounts).
    userns: frozenset[str] = frozenset()
    #: drop_infra_ctr, and the handlers whose pods always get a pause (sandboxer =
    #: "podsandbox").
    drop_infra: bool = False
    podsandbox: frozenset[str] = frozenset()
    #: Handlers that run a pod in an application kernel (gVisor): its pause container is
    #: the sandbox that runs every container of the pod.
    sandboxed: frozenset[str] = frozenset()

    @classmethod
    def of(cls, known: Collection[str], default: str = "runc", *,
           userns: Collection[str] = (), drop_infra: bool = False,
           podsandbox: Collection[str] = (), sandboxed: Collection[str] = ()) -> PodHandlers:
        return cls(frozenset(known), default, frozenset(userns), drop_infra,
                   frozenset(podsandbox) | frozenset(sandboxed), frozenset(sandboxed))

    def is_sandboxed(self, handler: str) -> bool:
        """Whether pods of ``handler`` ("" for the default) run in an application kernel."""
        return (handler or self.default) in self.sandboxed


@dataclass(frozen=True)
class PodParts:
    store: RecordStore[SandboxRecord]
    controller: SandboxController
    containers: ContainerParts
    images: ImageService
    network: SandboxNetwork
    locks: KeyedLocks
    nri: NRI
    events: ContainerEvents
    handlers: PodHandlers
    names: NameRegistrar = field(default_factory=lambda: NameRegistrar("sandbox"))
    #: Pods whose pause is being killed on purpose (its exit is no news).
    stopping: set[str] = field(default_factory=set)

    @property
    def operations(self) -> Operations:
        """The containers' runner of mutating calls (one for the whole core)."""
        return self.containers.operations

    def find(self, prefix: str, *, visible: bool = False) -> SandboxRecord:
        """The pod ``prefix`` names; with ``visible``, only among ``store.visible()``."""
        ids = [r.id for r in self.store.visible()] if visible else self.store.ids()
        sid = resolve_prefix(ids, prefix, "pod sandbox")
        rec = self.store.get(sid)
        assert rec is not None
        return rec


def not_ready(parts: PodParts, sid: str) -> None:
    """A ready pod stops being ready: record it and tell event subscribers (once)."""
    rec = parts.store.get(sid)
    if rec is not None and rec.ready:
        parts.store.update(sid, phase=PodPhase.NOTREADY)
        parts.events.emit(events.STOPPED, sid, sid)
        parts.containers.sessions.end(sid, f"pod sandbox {sid} stopped")


async def detach(parts: PodParts, sid: str) -> None:
    """CNI DEL of the pod, if anything is attached: a cached result (also after a
    restart or reboot) or a still-pinned netns (a crash during ADD)."""
    rec = parts.store.get(sid)
    if rec is None or not rec.netns:
        return
    await parts.network.tear_down(sid, rec.netns, rec.config, rec.runtime_handler)
