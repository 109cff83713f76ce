"""Plugin start-up: initialise the registered plugins in dependency order, record each
outcome, and hand out the instances.

An init context only hands out types the plugin declared, so a forgotten
``requires`` fails at once rather than depending on registration order (containerd's
plugin package does not check this).
"""

from __future__ import annotations

import asyncio
import builtins
import enum
import inspect
import logging
import time
import types
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any

from pycrid.errors import FailedPrecondition, InvalidArgument, NotFound
from pycrid.plugin.registry import ALL, Registration, Registry, SkipPlugin

__all__ = [
    "InitContext",
    "PluginInitError",
    "PluginRecord",
    "Plugins",
    "Status",
    "init_all",
]

log = logging.getLogger(__name__)


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
