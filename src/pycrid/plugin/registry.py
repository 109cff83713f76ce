"""Plugin registry: declare subsystems, initialise them in dependency order.

A registration is wiring only: it names its type and id, the plugin types it
needs, its config dataclass and an async ``init`` that pulls its dependencies
out of an :class:`InitContext` and hands them to a constructor.  The registry
knows nothing of the subsystems themselves, so tests can build the same
objects without it.  The shape follows containerd's plugin package; the
differences are deliberate: cycles and unknown requirements are reported by
name instead of being silently mis-ordered, and an init context only hands out
types the plugin declared, so a forgotten ``requires`` fails at once rather
than depending on registration order.
"""

from __future__ import annotations

import asyncio
import builtins
import dataclasses
import enum
import inspect
import logging
import time
import types
from collections.abc import Awaitable, Callable, Collection, Iterator, Mapping
from dataclasses import KW_ONLY, dataclass
from typing import Any

from pycrid.errors import AlreadyExists, FailedPrecondition, InvalidArgument, NotFound

__all__ = [
    "ALL",
    "InitContext",
    "PluginInitError",
    "PluginRecord",
    "Plugins",
    "Registration",
    "Registry",
    "SkipPlugin",
    "Status",
    "init_all",
]

log = logging.getLogger(__name__)

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


class Status(enum.Enum):
    INITIALISED = "initialised"
    SKIPPED = "skipped"
    FAILED = "failed"
    DISABLED = "disabled"


@dataclass(frozen=True)
class PluginRecord:
    """What happened to one plugin at start-up, for a status command."""

    registration: Registration
    status: Status
    instance: Any = None
    error: str = ""
    duration: float = 0.0
    """Seconds spent in ``init``."""

    @property
    def uri(self) -> str:
        return self.registration.uri


class PluginInitError(FailedPrecondition):
    """A plugin's init failed; start-up stops and the cause is chained."""

    def __init__(self, uri: str, cause: BaseException, records: list[PluginRecord]) -> None:
        super().__init__(f"plugin {uri} failed to initialise: {cause}")
        self.uri = uri
        self.records = records
        """Every plugin's outcome up to and including the failed one."""


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


class _State:
    """Outcomes so far, shared by every init context and the final result."""

    def __init__(self, regs: list[Registration]) -> None:
        self.regs = {r.uri: r for r in regs}
        self.records: dict[str, PluginRecord] = {}
        self.readiness: dict[str, list[asyncio.Event]] = {}

    def by_id(self, type_: str, id_: str) -> Any:
        uri = f"{type_}.{id_}"
        rec = self.records.get(uri)
        if rec is None:
            if uri in self.regs:
                raise FailedPrecondition(f"plugin {uri} is not initialised yet")
            raise NotFound(f"no plugin {uri} is registered")
        if rec.status is not Status.INITIALISED:
            raise FailedPrecondition(_unavailable(rec))
        return rec.instance

    def by_type(self, type_: str) -> dict[str, Any]:
        found = {
            r.registration.id: r.instance
            for r in self.records.values()
            if r.registration.type == type_ and r.status is Status.INITIALISED
        }
        if found:
            return found
        others = [r for r in self.records.values() if r.registration.type == type_]
        if others:
            reasons = "; ".join(_unavailable(r) for r in others)
            raise FailedPrecondition(f"no plugin of type {type_} is available: {reasons}")
        if any(r.type == type_ for r in self.regs.values()):
            raise FailedPrecondition(f"no plugin of type {type_} is initialised yet")
        raise NotFound(f"no plugin of type {type_} is registered")

    def single(self, type_: str) -> Any:
        found = self.by_type(type_)
        if len(found) != 1:
            raise FailedPrecondition(
                f"expected one plugin of type {type_}, found {len(found)}: "
                + ", ".join(sorted(found))
            )
        return next(iter(found.values()))

    def all(self) -> dict[str, Any]:
        return {
            uri: r.instance for uri, r in self.records.items() if r.status is Status.INITIALISED
        }

    async def close(self) -> None:
        for rec in reversed(list(self.records.values())):
            if rec.status is not Status.INITIALISED:
                continue
            closer = getattr(rec.instance, "close", None)
            if not callable(closer):
                continue
            try:
                result = closer()
                if inspect.isawaitable(result):
                    await result
            except Exception:
                log.exception("closing plugin %s failed", rec.uri)


def _unavailable(rec: PluginRecord) -> str:
    text = f"plugin {rec.uri} is {rec.status.value}"
    return f"{text}: {rec.error}" if rec.error else text


class InitContext:
    """What a plugin's init sees: its config, the daemon's properties, its dependencies.

    Lookups only reach types named in the registration's ``requires`` (or
    anything, with ``"*"``); asking for an undeclared type is a wiring bug that
    would otherwise work or not depending on registration order.
    """

    def __init__(
        self, reg: Registration, config: Any, properties: Mapping[str, Any], state: _State
    ) -> None:
        self.registration = reg
        self.config = config
        self.properties: Mapping[str, Any] = types.MappingProxyType(dict(properties))
        self._state = state

    def _check_declared(self, type_: str) -> None:
        req = self.registration.requires
        if ALL not in req and type_ not in req:
            raise FailedPrecondition(
                f"plugin {self.registration.uri} looked up type {type_} without "
                "declaring it in requires"
            )

    def get_by_id(self, type_: str, id_: str) -> Any:
        self._check_declared(type_)
        return self._state.by_id(type_, id_)

    def get_by_type(self, type_: str) -> dict[str, Any]:
        self._check_declared(type_)
        return self._state.by_type(type_)

    def get_single(self, type_: str) -> Any:
        self._check_declared(type_)
        return self._state.single(type_)

    def get_all(self) -> dict[str, Any]:
        """Every plugin initialised so far, by uri; complete only with ``requires=("*",)``."""
        return self._state.all()

    def register_readiness(self) -> Callable[[], None]:
        """Return a callback to call (on the event loop) once this plugin is ready."""
        event = asyncio.Event()
        self._state.readiness.setdefault(self.registration.uri, []).append(event)
        return event.set


class Plugins:
    """The initialised plugins, in init order, and the record of every outcome."""

    def __init__(self, state: _State) -> None:
        self._state = state
        self._closed = False

    def get_by_id(self, type_: str, id_: str) -> Any:
        return self._state.by_id(type_, id_)

    def get_by_type(self, type_: str) -> dict[str, Any]:
        return self._state.by_type(type_)

    def get_single(self, type_: str) -> Any:
        return self._state.single(type_)

    def get_all(self) -> dict[str, Any]:
        return self._state.all()

    def items(self) -> list[tuple[Registration, Any]]:
        """Initialised plugins with their instances, in init order."""
        return [
            (r.registration, r.instance)
            for r in self._state.records.values()
            if r.status is Status.INITIALISED
        ]

    def records(self) -> list[PluginRecord]:
        """Every enabled plugin in init order, then the disabled ones."""
        recs = list(self._state.records.values())
        return sorted(recs, key=lambda r: r.status is Status.DISABLED)

    def not_ready(self) -> list[str]:
        """Uris whose readiness callback has not been called yet."""
        return [
            uri
            for uri, events in self._state.readiness.items()
            if not all(e.is_set() for e in events)
        ]

    async def wait_ready(self) -> None:
        """Return once every registered readiness callback has been called."""
        for events in list(self._state.readiness.values()):
            for event in events:
                await event.wait()

    async def close(self) -> None:
        """Close instances in reverse init order; errors are logged, not raised."""
        if self._closed:
            return
        self._closed = True
        await self._state.close()


def _resolve_configs(regs: list[Registration], configs: Mapping[str, Any]) -> dict[str, Any]:
    """Pair each plugin with its config, defaulting absent ones, before any init runs."""
    known = {r.uri for r in regs}
    for uri in configs:
        if uri not in known:
            log.warning("config given for plugin %s, which is not enabled or not registered", uri)
    out: dict[str, Any] = {}
    for reg in regs:
        cfg = configs.get(reg.uri)
        if reg.config is None:
            if cfg is not None:
                log.warning("plugin %s takes no config; its section is ignored", reg.uri)
            out[reg.uri] = None
        elif cfg is None:
            out[reg.uri] = reg.config()
        elif not isinstance(cfg, reg.config):
            raise InvalidArgument(
                f"plugin {reg.uri}: config is {builtins.type(cfg).__name__}, "
                f"expected {reg.config.__name__}"
            )
        else:
            out[reg.uri] = cfg
    return out


async def init_all(
    registry: Registry,
    *,
    configs: Mapping[str, Any],
    disabled: Collection[str],
    properties: Mapping[str, Any],
) -> Plugins:
    """Initialise every enabled plugin in dependency order.

    A :class:`SkipPlugin` is recorded and start-up goes on; any other error
    closes what was built so far (newest first) and raises
    :class:`PluginInitError` naming the plugin.
    """
    off = set(disabled)
    all_regs = registry.registrations()
    for uri in sorted(off - {r.uri for r in all_regs}):
        log.warning("disabled plugin %s is not registered", uri)
    order = registry.graph(off)
    cfgs = _resolve_configs(order, configs)
    state = _State(all_regs)
    for reg in all_regs:
        if reg.uri in off:
            state.records[reg.uri] = PluginRecord(reg, Status.DISABLED)

    for reg in order:
        ctx = InitContext(reg, cfgs[reg.uri], properties, state)
        start = time.monotonic()
        try:
            instance = await reg.init(ctx)
        except SkipPlugin as exc:
            took = time.monotonic() - start
            state.readiness.pop(reg.uri, None)
            state.records[reg.uri] = PluginRecord(reg, Status.SKIPPED, None, str(exc), took)
            log.info("skipping plugin %s: %s", reg.uri, exc)
            continue
        except BaseException as exc:
            took = time.monotonic() - start
            state.readiness.pop(reg.uri, None)
            state.records[reg.uri] = PluginRecord(reg, Status.FAILED, None, str(exc), took)
            await state.close()
            if not isinstance(exc, Exception):
                raise
            raise PluginInitError(reg.uri, exc, list(state.records.values())) from exc
        took = time.monotonic() - start
        state.records[reg.uri] = PluginRecord(reg, Status.INITIALISED, instance, "", took)
        log.debug("initialised plugin %s in %.3fs", reg.uri, took)
    return Plugins(state)
