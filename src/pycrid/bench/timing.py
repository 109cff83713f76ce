"""Timing and the statistics every figure is reported with."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


def p90(vals: list[float]) -> float:
    """The 90th percentile (inclusive method: it never lies outside the samples)."""
    if len(vals) < 2:
        return vals[0]
    return statistics.quantiles(vals, n=10, method="inclusive")[8]


def stats(vals: list[float]) -> dict[str, Any]:
    """median, p90, min, max and n of a non-empty list."""
    if not vals:
        raise ValueError("no samples")
    return {"median": statistics.median(vals), "p90": p90(vals), "min": min(vals),
            "max": max(vals), "n": len(vals)}


def timed(fn: Callable[[], T]) -> tuple[float, T]:
    """Milliseconds ``fn`` took, and what it returned."""
    t0 = time.perf_counter()
    out = fn()
    return (time.perf_counter() - t0) * 1000.0, out
