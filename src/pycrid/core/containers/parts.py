"""The parts every container operation uses, held in one frozen object, and the
bookkeeping the operations share (name reservations, exit waiters, sessions, and what
is under way)."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

from cri_api.v1 import api_pb2 as pb

from pycrid.core.anchors import PodAnchors
from pycrid.core.events import ContainerEvents
from pycrid.core.nri_relay import NRI
from pycrid.core.registrar import KeyedLocks, NameRegistrar, resolve_prefix
from pycrid.core.sessions import SessionEnds
from pycrid.errors import NotFound
from pycrid.images.image_service import ImageService
from pycrid.oci.resources import ResourcePolicy
from pycrid.operations import Operations
from pycrid.runtime.bundle import ContainerPaths
from pycrid.runtime.container_bundles import ContainerBundles
from pycrid.runtime.exits import ExitWaiters
from pycrid.runtime.interface import ContainerRuntime
from pycrid.sandbox.controller import SandboxController
from pycrid.store.records import ContainerRecord, RecordStore, SandboxRecord
from pycrid.tasks import Owner

#: How many containers start-up recovery works on at once.
RECOVERY_CONCURRENCY = 16


def now_ns() -> int:
    return time.time_ns()


def state_name(state: pb.ContainerState.ValueType) -> str:
    return pb.ContainerState.Name(state)


def labels_match(selector: Any, labels: Any) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


@dataclass
class InFlight:
    """What operations under way tell each other, by container id (memory only)."""

    #: Containers sent their stop signal: a second StopContainer does not send it again.
    stop_signalled: set[str] = field(default_factory=set)
    #: Containers whose StartContainer runs: their exit is handled after it (a process
    #: that exits at once must not be STOPPED before it is STARTED).
    starting: dict[str, asyncio.Event] = field(default_factory=dict)
    #: Containers being stopped for an NRI eviction, with the plugin's reason.
    evicted: dict[str, str] = field(default_factory=dict)

    def forget(self, cid: str) -> None:
        self.stop_signalled.discard(cid)
        self.evicted.pop(cid, None)


@dataclass(frozen=True)
class ContainerParts:
    store: RecordStore[ContainerRecord]
    sandboxes: RecordStore[SandboxRecord]
    #: The pods' namespaces and files, which their containers join and mount.
    controller: SandboxController
    runtime: ContainerRuntime
    #: Makes, reads and removes each container's bundle and spec.
    bundles: ContainerBundles
    images: ImageService
    paths: ContainerPaths
    locks: KeyedLocks
    nri: NRI
    events: ContainerEvents
    #: Host cgroup facts (probed once, at start) and the resource config keys.
    resource_policy: ResourcePolicy
    #: Told when a container starts or exits: it may now stand for its pod.
    anchors: PodAnchors
    #: The runtime handler of pods that name none (what a checkpoint archive records).
    default_handler: str = "runc"
    names: NameRegistrar = field(default_factory=lambda: NameRegistrar("container"))
    #: Exec and attach sessions (and, by pod id, port-forwards), ended with the object.
    sessions: SessionEnds = field(default_factory=SessionEnds)
    inflight: InFlight = field(default_factory=InFlight)
    #: Runs the mutating calls so that a client going away cannot cut them short.
    operations: Operations = field(default_factory=lambda: Operations(Owner("operations")))
    #: Whoever waits for a container's exit (a stop), woken by the exit watcher.
    waiters: ExitWaiters = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "waiters", ExitWaiters(self.runtime.exit_of))

    def find(self, prefix: str, *, visible: bool = False) -> ContainerRecord:
        """The container ``prefix`` names; with ``visible``, only among ``store.visible()``."""
        ids = [r.id for r in self.store.visible()] if visible else self.store.ids()
        cid = resolve_prefix(ids, prefix, "container")
        rec = self.store.get(cid)
        assert rec is not None
        return rec

    def current(self, cid: str) -> ContainerRecord:
        rec = self.store.get(cid)
        if rec is None:
            raise NotFound(f"container {cid} not found")
        return rec

    def of_sandbox(self, sandbox_id: str) -> list[ContainerRecord]:
        return [c for c in self.store.all() if c.sandbox_id == sandbox_id]
