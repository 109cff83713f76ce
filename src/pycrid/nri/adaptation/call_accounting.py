"""What is counted and traced about the calls to NRI plugins.

Each plugin keeps ``CallStats`` per method for ``pycrid nri plugins``; the daemon's
metrics (a ``PluginObserver``) and tracer (a ``SpanTracer``) come in together as the
``PluginInstruments`` the adaptation is built with, absent when tests build one by hand.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Protocol


@dataclass
class CallStats:
    """One plugin's calls of one method, for ``pycrid nri plugins``."""

    count: int = 0
    errors: int = 0
    total: float = 0.0  # seconds
    max: float = 0.0
    last: float = 0.0


class PluginObserver(Protocol):
    """Where plugin calls, registrations and drops are counted (pycrid.metrics.Metrics)."""

    def nri_call(self, plugin: str, event: str, seconds: float, failed: bool) -> None: ...

    def nri_registered(self, plugin: str) -> None: ...

    def nri_dropped(self, plugin: str, reason: str) -> None: ...


class SpanTracer(Protocol):
    """Makes a span, a child of the current one (pycrid.tracing)."""

    def span(self, name: str, attributes: dict[str, Any]) -> AbstractContextManager[Any]: ...


@dataclass(frozen=True)
class PluginInstruments:
    """The daemon's metrics and tracing of plugin calls; each may be absent."""

    observer: PluginObserver | None = None
    tracer: SpanTracer | None = None
