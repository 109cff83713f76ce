"""Each pod's sandbox controller, chosen by its record: a pause container, or pinned
namespaces (a pod without a pause process)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from pycrid.oci.spec import Namespaces
from pycrid.oci.spec_mounts import SandboxFiles
from pycrid.runtime.exits import Exit
from pycrid.runtime.interface import RuncState
from pycrid.sandbox.controller import (
    SandboxAnchor,
    SandboxController,
    SandboxRequest,
    SandboxStatus,
)
from pycrid.store.records import SandboxRecord

#: The controller of pods recorded before pods could have another.
DEFAULT = "pause"


class SandboxRouter(SandboxController):
    def __init__(self, controllers: Mapping[str, SandboxController],
                 kind_of: Callable[[str], str | None]) -> None:
        self.controllers = dict(controllers)
        #: The controller a pod's record names (None: no record, e.g. an orphan).
        self.kind_of = kind_of

    def _of(self, sid: str) -> SandboxController:
        return self.controllers[self.kind_of(sid) or DEFAULT]

    async def create(self, req: SandboxRequest) -> None:
        await self._of(req.id).create(req)

    async def start(self, sandbox_id: str) -> int:
        return await self._of(sandbox_id).start(sandbox_id)

    async def stop(self, sandbox_id: str, grace: float = 0) -> None:
        await self._of(sandbox_id).stop(sandbox_id, grace)

    async def status(self, sandbox_id: str, verbose: bool = False) -> SandboxStatus:
        return await self._of(sandbox_id).status(sandbox_id, verbose)

    def recovered_status(self, sandbox_id: str,
                         runtime_states: dict[str, RuncState]) -> SandboxStatus:
        return self._of(sandbox_id).recovered_status(sandbox_id, runtime_states)

    async def shutdown(self, sandbox_id: str) -> Sequence[str]:
        """By the pod's own controller; an id without a record by every controller (each
        shutdown is idempotent and ignores what it did not make)."""
        kind = self.kind_of(sandbox_id)
        released: list[str] = []
        # The default last: the pause controller removes the pod's whole directory, where
        # another controller keeps the list of what it made.
        for name, controller in sorted(self.controllers.items(), key=lambda c: c[0] == DEFAULT):
            if kind is None or name == kind:
                released += await controller.shutdown(sandbox_id)
        return released

    def files(self, sandbox_id: str) -> SandboxFiles:
        return self._of(sandbox_id).files(sandbox_id)

    def exited(self, sandbox_id: str, exit_: Exit) -> None:
        self._of(sandbox_id).exited(sandbox_id, exit_)

    async def watch(self, sandbox_id: str, lost: Callable[[str], None]) -> Exit | None:
        return await self._of(sandbox_id).watch(sandbox_id, lost)

    def stand_in(self, sandbox: SandboxRecord, pid: int) -> None:
        self.controllers[sandbox.controller].stand_in(sandbox, pid)

    def namespaces(self, rec: SandboxRecord) -> Namespaces:
        return self.controllers[rec.controller].namespaces(rec)

    def anchor(self, sandbox: SandboxRecord) -> SandboxAnchor:
        return self.controllers[sandbox.controller].anchor(sandbox)
