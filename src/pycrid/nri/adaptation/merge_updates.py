"""Merging plugins' updates of existing containers and their evictions: UpdateContainer
and StopContainer replies, and the updates that ride along CreateContainer replies."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from pycrid.errors import InvalidArgument
from pycrid.nri import api
from pycrid.nri.adaptation.keyed_entries import clone
from pycrid.nri.adaptation.merge_resources import merge_resources
from pycrid.nri.adaptation.owners import AdjustmentConflict, OwnerTable, go_quote


def merge_evictions(
    collected: list[api.ContainerEviction],
    plugin: str,
    evictions: Iterable[api.ContainerEviction],
    created_id: str | None,
) -> None:
    seen = {e.container_id for e in collected}
    for eviction in evictions:
        if created_id is not None and eviction.container_id == created_id:
            raise InvalidArgument(
                f"plugin {go_quote(plugin)} asked eviction of "
                f"{go_quote(created_id)} during creation"
            )
        if eviction.container_id not in seen:
            seen.add(eviction.container_id)
            collected.append(clone(eviction))


class ContainerUpdates:
    """Updates of existing containers, merged per container ID."""

    def __init__(
        self,
        owners: OwnerTable,
        *,
        created_id: str | None = None,
        target_id: str | None = None,
        requested: api.LinuxResources | None = None,
    ) -> None:
        self._owners = owners
        self._created_id = created_id
        self._target_id = target_id
        self._requested = requested
        self._by_id: dict[str, api.ContainerUpdate] = {}

    def _entry(self, plugin: str, update: api.ContainerUpdate) -> api.ContainerUpdate:
        cid = update.container_id
        if self._created_id is not None and cid == self._created_id:
            # upstream's wording for the same mistake
            raise InvalidArgument(
                f"plugin {go_quote(plugin)} asked update of {go_quote(cid)} during creation"
            )
        merged = self._by_id.get(cid)
        if merged is None:
            merged = api.ContainerUpdate(container_id=cid, ignore_failure=update.ignore_failure)
            merged.linux.resources.SetInParent()
            if cid == self._target_id and self._requested is not None:
                merged.linux.resources.CopyFrom(self._requested)
            self._by_id[cid] = merged
        else:
            merged.ignore_failure = merged.ignore_failure and update.ignore_failure
        return merged

    def apply(self, plugin: str, updates: Iterable[api.ContainerUpdate]) -> None:
        for update in updates:
            merged = self._entry(plugin, update)
            if not (update.HasField("linux") and update.linux.HasField("resources")):
                continue
            cid = update.container_id
            saved = self._owners.snapshot(cid)
            work = clone(merged.linux.resources)
            try:
                merge_resources(
                    self._owners, cid, plugin, update.linux.resources, [work], device_rules=False
                )
            except AdjustmentConflict:
                # all or nothing per update: drop its claims along with its changes
                self._owners.restore(cid, saved)
                if update.ignore_failure:
                    continue
                raise
            merged.linux.resources.CopyFrom(work)

    def result(self) -> list[api.ContainerUpdate]:
        others = [clone(u) for cid, u in self._by_id.items() if cid != self._target_id]
        target = self._by_id.get(self._target_id) if self._target_id is not None else None
        return others if target is None else [*others, clone(target)]


class UpdateMerger:
    """Folds the UpdateContainer or StopContainer replies of all plugins.

    ``target_id`` is the container whose update the runtime asked about (None
    for StopContainer): its merged update comes last in :meth:`result`, as
    upstream returns it, so the runtime can take it as the new resources.
    With ``requested`` (the resources the CRI asked for) the target's merged
    update starts from those, as upstream's does. The target's update appears
    only when some plugin updated it.
    """

    def __init__(
        self, target_id: str | None = None, *, requested: api.LinuxResources | None = None
    ) -> None:
        self._owners = OwnerTable()
        self._updates = ContainerUpdates(self._owners, target_id=target_id, requested=requested)
        self._evictions: list[api.ContainerEviction] = []

    @property
    def owners(self) -> OwnerTable:
        return self._owners

    def apply(
        self,
        plugin: str,
        updates: Sequence[api.ContainerUpdate],
        evictions: Sequence[api.ContainerEviction] = (),
    ) -> None:
        """Merge one plugin's updates; a conflicting update whose
        ``ignore_failure`` is set is dropped instead of raising."""
        self._updates.apply(plugin, updates)
        merge_evictions(self._evictions, plugin, evictions, None)

    def result(self) -> tuple[list[api.ContainerUpdate], list[api.ContainerEviction]]:
        """``ignore_failure`` of a merged update is the AND of its parts'."""
        return self._updates.result(), [clone(e) for e in self._evictions]
