"""Plugin registry: declare subsystems, and the order their dependencies put them in.

A registration is wiring only: it names its type and id, the plugin types it
needs, its config dataclass and an async ``init`` that pulls its dependencies
out of an :class:`~pycrid.plugin.startup.InitContext` and hands them to a
constructor.  The registry knows nothing of the subsystems themselves, so tests
can build the same objects without it; ``startup`` initialises them.  The shape
follows containerd's plugin package; the differences are deliberate: cycles and
unknown requirements are reported by name instead of being silently mis-ordered.
"""

from __future__ import annotations

import builtins
import dataclasses
from collections.abc import Awaitable, Callable, Collection, Iterator
from dataclasses import KW_ONLY, dataclass
from typing import TYPE_CHECKING, Any

from pycrid.errors import AlreadyExists, FailedPrecondition, InvalidArgument

if TYPE_CHECKING:
    from pycrid.plugin.startup import InitContext

__all__ = ["ALL", "Registration", "Registry", "SkipPlugin"]

ALL = "*"
"""A ``requires`` entry meaning every other enabled plugin."""


@dataclass(frozen=True)
class Registration:
    """How to build one plugin; ``uri`` (``type.id``) is its unique name."""

    type: str
    id: str
    _: KW_ONLY
    init: Callable[[InitContext], Awaitable[Any]]
    requires: tuple[str, ...] = ()
    config: builtins.type[Any] | None = None
    migrate: Callable[[int, dict[str, Any]], None] | None = None

    @property
    def uri(self) -> str:
        return f"{self.type}.{self.id}"


class SkipPlugin(Exception):
    """Raised by an init that finds its plugin does not apply on this host.

    The plugin is recorded as skipped and start-up continues; plugins that
    need it then fail their lookup, so optional users should catch that.
    """


class Registry:
    """The set of known registrations, in registration order."""

    def __init__(self) -> None:
        self._regs: dict[str, Registration] = {}

    def register(self, reg: Registration) -> Registration:
        """Add ``reg``; returns it so it can be used as an expression."""
        if not reg.type or not reg.id:
            raise InvalidArgument(f"plugin registration needs a type and an id: {reg!r}")
        if any(not t for t in reg.requires):
            raise InvalidArgument(f"plugin {reg.uri} has an empty type in requires")
        if reg.config is not None and not (
            isinstance(reg.config, builtins.type) and dataclasses.is_dataclass(reg.config)
        ):
            raise InvalidArgument(f"plugin {reg.uri}: config must be a dataclass type")
        if reg.uri in self._regs:
            raise AlreadyExists(f"plugin {reg.uri} is already registered")
        self._regs[reg.uri] = reg
        return reg

    def registrations(self) -> list[Registration]:
        return list(self._regs.values())

    def migrate(self, from_version: int, plugins: dict[str, Any]) -> None:
        """Run every registration's config migration over the ``plugins`` table.

        Runs for disabled plugins too: the table is rewritten before anyone
        knows what will be enabled, and a later re-enable must find it current.
        """
        for reg in self._regs.values():
            if reg.migrate is not None:
                reg.migrate(from_version, plugins)

    def graph(self, disabled: Collection[str] = ()) -> list[Registration]:
        """Enabled registrations, each after every plugin of every type it requires.

        Depth-first in registration order, so a plugin's dependencies are
        pulled forward just ahead of it and unrelated plugins keep their
        registration order.  Disabled plugins still satisfy the "is this type
        known" check; needing them is reported when init looks them up.
        """
        off = set(disabled)
        known = {r.type for r in self._regs.values()}
        for reg in self._regs.values():
            if reg.uri in off:
                continue
            for t in reg.requires:
                if t != ALL and t not in known:
                    raise FailedPrecondition(
                        f"plugin {reg.uri} requires type {t}, but no plugin of that type "
                        "is registered"
                    )
        enabled = [r for r in self._regs.values() if r.uri not in off]
        order: list[Registration] = []
        done: set[str] = set()
        path: list[str] = []

        def deps(reg: Registration) -> Iterator[Registration]:
            for t in reg.requires:
                for other in enabled:
                    if other.uri != reg.uri and (t == ALL or other.type == t):
                        yield other

        def visit(reg: Registration) -> None:
            if reg.uri in done:
                return
            if reg.uri in path:
                cycle = [*path[path.index(reg.uri):], reg.uri]
                raise FailedPrecondition("plugin dependency cycle: " + " -> ".join(cycle))
            path.append(reg.uri)
            for dep in deps(reg):
                visit(dep)
            path.pop()
            done.add(reg.uri)
            order.append(reg)

        for reg in enabled:
            visit(reg)
        return order

