"""Field ownership of NRI adjustments: which plugin set which field (or key) of a container.

The facts are containerd/nri's (``pkg/api/owners.go``): a plain field belongs to
the first plugin that sets it, a keyed field per key; a removal is recorded as
``-plugin`` and lets only that plugin set the entry again; a second claim is a
conflict with upstream's message.
"""

from __future__ import annotations

import json

from pycrid.errors import FailedPrecondition
from pycrid.nri import api


def go_quote(text: str) -> str:
    """Roughly Go's ``%q``; exact for the characters plugin names may use."""
    return json.dumps(text, ensure_ascii=False)


class AdjustmentConflict(FailedPrecondition):
    """Two plugins claimed the same field (or the same key of a field).

    ``plugin`` is the one whose claim failed, ``other`` the earlier owner (for
    an entry that was removed: the plugin that removed it). The message has
    upstream's wording, e.g. ``plugins "20-b" and "10-a" both tried to set
    Annotations foo``.
    """

    def __init__(self, field: int, plugin: str, other: str, key: str | None = None) -> None:
        self.field = field
        self.plugin = plugin
        self.other = other
        self.key = key
        target = f"{api.Field.Name(field)} {'' if key is None else key}"
        super().__init__(
            f"plugins {go_quote(plugin)} and {go_quote(other)} both tried to set {target}"
        )


class OwnerTable:
    """Field ownership per container, kept in an :class:`api.OwningPlugins`.

    ``key=None`` addresses a plain field (``FieldOwners.simple``); a string key
    addresses one entry of a keyed field (``FieldOwners.compound``).
    """

    def __init__(self) -> None:
        self.message = api.OwningPlugins()

    def owner(self, container_id: str, field: int, key: str | None = None) -> str | None:
        if container_id not in self.message.owners:
            return None
        owners = self.message.owners[container_id]
        if key is None:
            return owners.simple.get(field)
        if field not in owners.compound:
            return None
        return owners.compound[field].owners.get(key)

    def _record(self, container_id: str, field: int, key: str | None, value: str) -> None:
        owners = self.message.owners[container_id]
        if key is None:
            owners.simple[field] = value
        else:
            owners.compound[field].owners[key] = value

    def claim(self, container_id: str, field: int, plugin: str, key: str | None = None) -> None:
        """Make ``plugin`` the owner, or raise if someone else got there first."""
        current = self.owner(container_id, field, key)
        if current is not None:
            if not api.is_marked_for_removal(current):
                raise AdjustmentConflict(field, plugin, current, key)
            remover = api.clear_removal_marker(current)
            if remover != plugin:
                raise AdjustmentConflict(field, plugin, remover, key)
        self._record(container_id, field, key, plugin)

    def clear(self, container_id: str, field: int, plugin: str, key: str | None = None) -> None:
        """Record that ``plugin`` removed the field or entry (never a conflict)."""
        self._record(container_id, field, key, api.mark_for_removal(plugin))

    def accumulate(self, container_id: str, field: int, plugin: str) -> None:
        """Add ``plugin`` to the comma-separated contributors of a plain field."""
        current = self.owner(container_id, field)
        value = plugin if current is None else f"{current},{plugin}"
        self._record(container_id, field, None, value)

    def snapshot(self, container_id: str) -> api.FieldOwners | None:
        if container_id not in self.message.owners:
            return None
        saved = api.FieldOwners()
        saved.CopyFrom(self.message.owners[container_id])
        return saved

    def restore(self, container_id: str, saved: api.FieldOwners | None) -> None:
        if saved is None:
            if container_id in self.message.owners:
                del self.message.owners[container_id]
        else:
            self.message.owners[container_id].CopyFrom(saved)
