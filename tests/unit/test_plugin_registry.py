"""Plugin registry: ordering, failures, lookups, readiness and shutdown order."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

from pycrid.errors import AlreadyExists, FailedPrecondition, InvalidArgument, NotFound
from pycrid.plugin.registry import Registration, Registry, SkipPlugin
from pycrid.plugin.startup import InitContext, PluginInitError, Plugins, Status, init_all

Init = Callable[[InitContext], Awaitable[Any]]


@dataclass
class Thing:
    """A plugin instance that remembers its name and logs when it is closed."""

    uri: str
    journal: list[str]
    deps: dict[str, Any] = field(default_factory=dict)

    async def close(self) -> None:
        self.journal.append(f"close {self.uri}")


class SyncThing(Thing):
    def close(self) -> None:  # type: ignore[override]
        self.journal.append(f"sync-close {self.uri}")


def make_init(journal: list[str]) -> Init:
    async def init(ctx: InitContext) -> Thing:
        uri = ctx.registration.uri
        journal.append(f"init {uri}")
        return Thing(uri, journal)

    return init


def build(*specs: tuple[str, tuple[str, ...]], journal: list[str] | None = None) -> Registry:
    """Register ``("type.id", requires)`` pairs with a recording init."""
    journal = [] if journal is None else journal
    reg = Registry()
    for uri, requires in specs:
        type_, _, id_ = uri.rpartition(".")
        reg.register(Registration(type_, id_, init=make_init(journal), requires=requires))
    return reg


def uris(regs: list[Registration]) -> list[str]:
    return [r.uri for r in regs]


async def run(reg: Registry, **kw: Any) -> Plugins:
    kw.setdefault("configs", {})
    kw.setdefault("disabled", ())
    kw.setdefault("properties", {})
    return await init_all(reg, **kw)


# --- registration ----------------------------------------------------------


def test_uri_and_duplicate_rejected() -> None:
    reg = build(("t.v1.a", ()))
    assert uris(reg.registrations()) == ["t.v1.a"]
    with pytest.raises(AlreadyExists, match=r"t\.v1\.a"):
        reg.register(Registration("t.v1", "a", init=make_init([])))


def test_bad_registrations_rejected() -> None:
    reg = Registry()
    with pytest.raises(InvalidArgument):
        reg.register(Registration("", "a", init=make_init([])))
    with pytest.raises(InvalidArgument):
        reg.register(Registration("t", "a", init=make_init([]), config=dict))
    assert reg.registrations() == []


# --- graph ordering ---------------------------------------------------------


def test_independent_plugins_keep_registration_order() -> None:
    reg = build(("c.x", ()), ("a.x", ()), ("b.x", ()))
    assert uris(reg.graph()) == ["c.x", "a.x", "b.x"]


def test_dependency_registered_later_moves_before_dependant() -> None:
    reg = build(("app.x", ("db",)), ("other.x", ()), ("db.x", ()))
    assert uris(reg.graph()) == ["db.x", "app.x", "other.x"]


def test_every_plugin_of_required_type_comes_first() -> None:
    reg = build(("svc.x", ("snap",)), ("snap.a", ()), ("snap.b", ()))
    order = uris(reg.graph())
    assert order == ["snap.a", "snap.b", "svc.x"]


def test_diamond_and_chain() -> None:
    # top -> (left, right) -> base ; base registered last
    reg = build(
        ("top.x", ("left", "right")),
        ("left.x", ("base",)),
        ("right.x", ("base",)),
        ("base.x", ()),
    )
    order = uris(reg.graph())
    assert order == ["base.x", "left.x", "right.x", "top.x"]
    for before, after in [("base.x", "left.x"), ("base.x", "right.x"), ("left.x", "top.x")]:
        assert order.index(before) < order.index(after)


def test_star_requires_every_other_plugin() -> None:
    reg = build(("cri.x", ("*",)), ("a.x", ()), ("b.x", ("a",)), ("c.x", ()))
    order = uris(reg.graph())
    assert order[-1] == "cri.x"
    assert order == ["a.x", "b.x", "c.x", "cri.x"]


def test_star_skips_disabled_plugins() -> None:
    reg = build(("cri.x", ("*",)), ("a.x", ()), ("b.x", ()))
    assert uris(reg.graph(disabled={"a.x"})) == ["b.x", "cri.x"]


def test_plugin_requiring_its_own_type_does_not_depend_on_itself() -> None:
    reg = build(("snap.b", ("snap",)), ("snap.a", ()))
    assert uris(reg.graph()) == ["snap.a", "snap.b"]


def test_cycle_is_named() -> None:
    reg = build(("a.x", ("b",)), ("b.y", ("a",)))
    with pytest.raises(FailedPrecondition) as err:
        reg.graph()
    assert str(err.value) == "plugin dependency cycle: a.x -> b.y -> a.x"


def test_longer_cycle_is_named_without_its_lead_in() -> None:
    reg = build(("entry.x", ("a",)), ("a.x", ("b",)), ("b.x", ("c",)), ("c.x", ("a",)))
    with pytest.raises(FailedPrecondition) as err:
        reg.graph()
    assert str(err.value) == "plugin dependency cycle: a.x -> b.x -> c.x -> a.x"


def test_two_star_plugins_form_a_cycle() -> None:
    reg = build(("a.x", ("*",)), ("b.x", ("*",)))
    with pytest.raises(FailedPrecondition, match=r"cycle: a\.x -> b\.x -> a\.x"):
        reg.graph()


def test_cycle_broken_by_disabling() -> None:
    reg = build(("a.x", ("b",)), ("b.y", ("a",)))
    assert uris(reg.graph(disabled={"b.y"})) == ["a.x"]


def test_missing_type_names_plugin_and_type() -> None:
    reg = build(("app.x", ("nosuch.v1",)))
    with pytest.raises(FailedPrecondition) as err:
        reg.graph()
    assert "app.x" in str(err.value)
    assert "nosuch.v1" in str(err.value)


def test_missing_type_of_disabled_plugin_is_ignored() -> None:
    reg = build(("app.x", ("nosuch",)), ("ok.x", ()))
    assert uris(reg.graph(disabled=["app.x"])) == ["ok.x"]


def test_requiring_only_disabled_type_is_not_a_graph_error() -> None:
    reg = build(("app.x", ("db",)), ("db.x", ()))
    assert uris(reg.graph(disabled={"db.x"})) == ["app.x"]


# --- init_all ---------------------------------------------------------------


async def test_init_in_graph_order_and_lookup_dependencies() -> None:
    journal: list[str] = []
    reg = Registry()

    async def init_db(ctx: InitContext) -> Thing:
        journal.append("init db")
        return Thing("db.v1.sqlite", journal)

    async def init_app(ctx: InitContext) -> Thing:
        journal.append("init app")
        db = ctx.get_by_id("db.v1", "sqlite")
        return Thing("app.v1.main", journal, {"db": db})

    reg.register(Registration("app.v1", "main", init=init_app, requires=("db.v1",)))
    reg.register(Registration("db.v1", "sqlite", init=init_db))
    plugins = await run(reg)

    assert journal == ["init db", "init app"]
    app = plugins.get_by_id("app.v1", "main")
    assert app.deps["db"] is plugins.get_by_id("db.v1", "sqlite")
    assert [r.uri for r, _ in plugins.items()] == ["db.v1.sqlite", "app.v1.main"]
    assert list(plugins.get_all()) == ["db.v1.sqlite", "app.v1.main"]


async def test_context_carries_config_properties_and_registration() -> None:
    @dataclass
    class Cfg:
        path: str = "/default"
        n: int = 1

    seen: dict[str, Any] = {}

    async def init(ctx: InitContext) -> None:
        seen[ctx.registration.uri] = (ctx.config, dict(ctx.properties))

    reg = Registry()
    reg.register(Registration("t", "given", init=init, config=Cfg))
    reg.register(Registration("t", "default", init=init, config=Cfg))
    reg.register(Registration("t", "none", init=init))
    props = {"root": "/var/lib/pycrid", "state": "/run/pycrid"}
    await run(reg, configs={"t.given": Cfg("/x", 5)}, properties=props)

    assert seen["t.given"] == (Cfg("/x", 5), props)
    assert seen["t.default"] == (Cfg(), props)
    assert seen["t.none"] == (None, props)


async def test_config_of_wrong_type_rejected_before_any_init() -> None:
    @dataclass
    class Cfg:
        a: int = 0

    journal: list[str] = []
    reg = Registry()
    reg.register(Registration("first", "x", init=make_init(journal)))
    reg.register(Registration("t", "x", init=make_init(journal), config=Cfg))
    with pytest.raises(InvalidArgument, match=r"t\.x"):
        await run(reg, configs={"t.x": {"a": 1}})
    assert journal == []


async def test_properties_are_read_only() -> None:
    holder: list[InitContext] = []

    async def init(ctx: InitContext) -> None:
        holder.append(ctx)

    reg = Registry()
    reg.register(Registration("t", "x", init=init))
    await run(reg, properties={"root": "/r"})
    with pytest.raises(TypeError):
        holder[0].properties["root"] = "/elsewhere"  # type: ignore[index]


async def test_disabled_plugins_are_not_initialised() -> None:
    journal: list[str] = []
    reg = build(("a.x", ()), ("b.x", ()), ("c.x", ()), journal=journal)
    plugins = await run(reg, disabled={"b.x"})
    assert journal == ["init a.x", "init c.x"]
    with pytest.raises(FailedPrecondition, match=r"b\.x is disabled"):
        plugins.get_by_id("b", "x")
    status = {r.uri: r.status for r in plugins.records()}
    assert status == {"a.x": Status.INITIALISED, "c.x": Status.INITIALISED,
                      "b.x": Status.DISABLED}


async def test_needing_a_disabled_dependency_fails_at_lookup() -> None:
    journal: list[str] = []
    reg = Registry()
    reg.register(Registration("db", "x", init=make_init(journal)))

    async def needs_db(ctx: InitContext) -> None:
        ctx.get_single("db")

    async def tolerates_no_db(ctx: InitContext) -> str:
        try:
            ctx.get_single("db")
        except FailedPrecondition:
            return "degraded"
        return "full"

    reg.register(Registration("opt", "x", init=tolerates_no_db, requires=("db",)))
    plugins = await run(reg, disabled={"db.x"})
    assert plugins.get_by_id("opt", "x") == "degraded"

    reg.register(Registration("app", "x", init=needs_db, requires=("db",)))
    with pytest.raises(PluginInitError) as err:
        await run(reg, disabled={"db.x"})
    assert err.value.uri == "app.x"
    assert "db.x is disabled" in str(err.value)


async def test_skip_plugin_is_recorded_and_logged_and_others_continue(
    caplog: pytest.LogCaptureFixture,
) -> None:
    journal: list[str] = []

    async def skip(ctx: InitContext) -> None:
        ctx.register_readiness()  # never called: a skipped plugin must not block readiness
        raise SkipPlugin("no btrfs here")

    reg = Registry()
    reg.register(Registration("snap", "btrfs", init=skip))
    reg.register(Registration("snap", "overlay", init=make_init(journal)))
    reg.register(Registration("svc", "x", init=make_init(journal), requires=("snap",)))
    with caplog.at_level(logging.INFO, logger="pycrid.plugin.startup"):
        plugins = await run(reg)

    assert journal == ["init snap.overlay", "init svc.x"]
    assert list(plugins.get_by_type("snap")) == ["overlay"]
    rec = {r.uri: r for r in plugins.records()}["snap.btrfs"]
    assert rec.status is Status.SKIPPED
    assert rec.error == "no btrfs here"
    assert any(
        r.levelno == logging.INFO and "snap.btrfs" in r.getMessage()
        and "no btrfs here" in r.getMessage()
        for r in caplog.records
    )
    with pytest.raises(FailedPrecondition, match="skipped: no btrfs here"):
        plugins.get_by_id("snap", "btrfs")
    await asyncio.wait_for(plugins.wait_ready(), 1)


async def test_failure_closes_earlier_plugins_in_reverse_and_names_plugin() -> None:
    journal: list[str] = []

    async def boom(ctx: InitContext) -> None:
        raise OSError("disk on fire")

    async def sync_init(ctx: InitContext) -> SyncThing:
        journal.append("init b.x")
        return SyncThing("b.x", journal)

    reg = Registry()
    reg.register(Registration("a", "x", init=make_init(journal)))
    reg.register(Registration("b", "x", init=sync_init))
    reg.register(Registration("c", "x", init=make_init(journal)))
    reg.register(Registration("bad", "x", init=boom))
    reg.register(Registration("d", "x", init=make_init(journal)))

    with pytest.raises(PluginInitError) as err:
        await run(reg)

    assert journal == [
        "init a.x", "init b.x", "init c.x",
        "close c.x", "sync-close b.x", "close a.x",
    ]
    assert isinstance(err.value, FailedPrecondition)
    assert "bad.x" in str(err.value) and "disk on fire" in str(err.value)
    assert isinstance(err.value.__cause__, OSError)
    statuses = [(r.uri, r.status) for r in err.value.records]
    assert statuses[-1] == ("bad.x", Status.FAILED)
    assert "d.x" not in [u for u, _ in statuses]


async def test_close_errors_during_failure_cleanup_do_not_hide_cause() -> None:
    journal: list[str] = []

    class BadClose:
        async def close(self) -> None:
            raise RuntimeError("close failed")

    async def bad_close(ctx: InitContext) -> BadClose:
        return BadClose()

    async def boom(ctx: InitContext) -> None:
        raise ValueError("real cause")

    reg = Registry()
    reg.register(Registration("a", "x", init=make_init(journal)))
    reg.register(Registration("b", "x", init=bad_close))
    reg.register(Registration("c", "x", init=boom))
    with pytest.raises(PluginInitError, match="real cause"):
        await run(reg)
    assert journal == ["init a.x", "close a.x"]


async def test_cancellation_during_init_closes_and_propagates() -> None:
    journal: list[str] = []

    async def hang(ctx: InitContext) -> None:
        await asyncio.sleep(3600)

    reg = Registry()
    reg.register(Registration("a", "x", init=make_init(journal)))
    reg.register(Registration("b", "x", init=hang))
    task = asyncio.ensure_future(run(reg))
    await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert journal == ["init a.x", "close a.x"]


# --- lookups ----------------------------------------------------------------


async def test_lookups_by_id_type_and_single() -> None:
    journal: list[str] = []
    reg = build(("one.x", ()), ("two.a", ()), ("two.b", ()), journal=journal)
    reg.register(Registration("zero", "x", init=make_init(journal)))
    plugins = await run(reg, disabled={"zero.x"})

    assert plugins.get_by_id("one", "x").uri == "one.x"
    with pytest.raises(NotFound):
        plugins.get_by_id("one", "nope")

    assert {k: v.uri for k, v in plugins.get_by_type("two").items()} == {
        "a": "two.a", "b": "two.b"}
    with pytest.raises(NotFound):
        plugins.get_by_type("unknown")

    assert plugins.get_single("one").uri == "one.x"
    with pytest.raises(FailedPrecondition, match="found 2: a, b"):
        plugins.get_single("two")
    with pytest.raises(FailedPrecondition, match=r"zero\.x is disabled"):
        plugins.get_single("zero")
    with pytest.raises(NotFound):
        plugins.get_single("unknown")


async def test_context_refuses_undeclared_types() -> None:
    journal: list[str] = []
    errors: list[Exception] = []

    async def sneaky(ctx: InitContext) -> None:
        try:
            ctx.get_by_type("dep")
        except FailedPrecondition as exc:
            errors.append(exc)

    reg = Registry()
    reg.register(Registration("dep", "x", init=make_init(journal)))
    reg.register(Registration("s", "x", init=sneaky))
    await run(reg)
    assert len(errors) == 1 and "requires" in str(errors[0])


async def test_star_plugin_sees_everything_in_get_all() -> None:
    journal: list[str] = []
    seen: list[list[str]] = []

    async def collector(ctx: InitContext) -> None:
        seen.append(list(ctx.get_all()))
        assert ctx.get_by_id("a", "x").uri == "a.x"

    reg = Registry()
    reg.register(Registration("all", "x", init=collector, requires=("*",)))
    reg.register(Registration("a", "x", init=make_init(journal)))
    reg.register(Registration("b", "x", init=make_init(journal)))
    await run(reg)
    assert seen == [["a.x", "b.x"]]


# --- readiness --------------------------------------------------------------


async def test_wait_ready_waits_for_every_callback() -> None:
    callbacks: dict[str, Callable[[], None]] = {}

    async def init(ctx: InitContext) -> None:
        callbacks[ctx.registration.uri] = ctx.register_readiness()

    reg = Registry()
    reg.register(Registration("a", "x", init=init))
    reg.register(Registration("b", "x", init=init))
    reg.register(Registration("c", "x", init=make_init([])))  # registers none
    plugins = await run(reg)

    waiter = asyncio.ensure_future(plugins.wait_ready())
    await asyncio.sleep(0)
    assert not waiter.done()
    assert plugins.not_ready() == ["a.x", "b.x"]

    callbacks["b.x"]()
    await asyncio.sleep(0.01)
    assert not waiter.done()
    assert plugins.not_ready() == ["a.x"]

    callbacks["a.x"]()
    await asyncio.wait_for(waiter, 1)
    assert plugins.not_ready() == []


async def test_wait_ready_with_no_readiness_returns_at_once() -> None:
    plugins = await run(build(("a.x", ())))
    await asyncio.wait_for(plugins.wait_ready(), 1)


async def test_readiness_called_during_init_counts() -> None:
    async def init(ctx: InitContext) -> None:
        ctx.register_readiness()()

    reg = Registry()
    reg.register(Registration("a", "x", init=init))
    plugins = await run(reg)
    await asyncio.wait_for(plugins.wait_ready(), 1)


# --- close ------------------------------------------------------------------


async def test_close_in_reverse_init_order_past_errors(
    caplog: pytest.LogCaptureFixture,
) -> None:
    journal: list[str] = []

    class Exploding:
        def close(self) -> None:
            journal.append("close boom.x")
            raise RuntimeError("nope")

    async def exploding(ctx: InitContext) -> Exploding:
        return Exploding()

    async def sync_init(ctx: InitContext) -> SyncThing:
        return SyncThing(ctx.registration.uri, journal)

    async def no_close(ctx: InitContext) -> object:
        return object()

    reg = Registry()
    reg.register(Registration("top", "x", init=make_init(journal), requires=("mid",)))
    reg.register(Registration("mid", "x", init=sync_init, requires=("base",)))
    reg.register(Registration("base", "x", init=make_init(journal)))
    reg.register(Registration("boom", "x", init=exploding, requires=("top",)))
    reg.register(Registration("plain", "x", init=no_close))
    plugins = await run(reg)
    journal.clear()

    with caplog.at_level(logging.ERROR, logger="pycrid.plugin.startup"):
        await plugins.close()
    assert journal == ["close boom.x", "close top.x", "sync-close mid.x", "close base.x"]
    assert any("boom.x" in r.getMessage() for r in caplog.records)

    await plugins.close()  # second close is a no-op
    assert len(journal) == 4


# --- records and migration ---------------------------------------------------


async def test_records_show_status_error_and_duration() -> None:
    async def slow(ctx: InitContext) -> str:
        await asyncio.sleep(0.02)
        return "slow"

    async def skip(ctx: InitContext) -> None:
        raise SkipPlugin("not on this kernel")

    reg = Registry()
    reg.register(Registration("s", "slow", init=slow))
    reg.register(Registration("s", "skip", init=skip))
    reg.register(Registration("s", "off", init=slow))
    plugins = await run(reg, disabled={"s.off"})
    recs = plugins.records()
    assert [(r.uri, r.status.value, r.error) for r in recs] == [
        ("s.slow", "initialised", ""),
        ("s.skip", "skipped", "not on this kernel"),
        ("s.off", "disabled", ""),
    ]
    assert recs[0].duration >= 0.015
    assert recs[0].instance == "slow"


def test_migrate_runs_every_registration_in_order() -> None:
    calls: list[tuple[str, int]] = []

    def move_key(version: int, table: dict[str, Any]) -> None:
        calls.append(("new", version))
        old = table.get("old.x", {})
        if "path" in old:
            table.setdefault("new.x", {})["path"] = old.pop("path")

    def noop(version: int, table: dict[str, Any]) -> None:
        calls.append(("other", version))

    reg = Registry()
    reg.register(Registration("new", "x", init=make_init([]), migrate=move_key))
    reg.register(Registration("plain", "x", init=make_init([])))
    reg.register(Registration("other", "x", init=make_init([]), migrate=noop))
    table: dict[str, Any] = {"old.x": {"path": "/p", "keep": 1}}
    reg.migrate(2, table)
    assert table == {"old.x": {"keep": 1}, "new.x": {"path": "/p"}}
    assert calls == [("new", 2), ("other", 2)]
