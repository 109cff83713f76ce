"""Results of one run: sections of figures, each beside a floor measured in the same run,
printed as one table and written as one JSON document."""

from __future__ import annotations

import contextlib
import math
import sys
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pycrid.bench.timing import stats


@dataclass
class Section:
    """Figures and floors of one section. A figure's ``ratio`` is always its median over
    its floor's median (so > 1 is slower for times, < 1 is slower for MB/s)."""

    name: str
    figures: dict[str, dict[str, Any]] = field(default_factory=dict)
    floors: dict[str, dict[str, Any]] = field(default_factory=dict)
    samples: dict[str, list[float]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)
    skipped: str | None = None

    def floor(self, name: str, values: list[float], unit: str = "ms") -> None:
        self.floors[name] = {"unit": unit, **stats(values)}
        self.samples[name] = list(values)

    def figure(self, name: str, values: list[float], unit: str = "ms",
               floor: str | None = None) -> None:
        """Add a figure; ``floor`` names an entry of ``floors`` (added before or after)."""
        self.figures[name] = {"unit": unit, **stats(values), "floor": floor, "ratio": None}
        self.samples[name] = list(values)

    def finish(self) -> None:
        for fig in self.figures.values():
            base = self.floors.get(fig["floor"]) if fig["floor"] else None
            if base is None:
                fig["floor"] = None
            elif base["median"] and math.isfinite(base["median"]):
                fig["ratio"] = fig["median"] / base["median"]

    def as_json(self) -> dict[str, Any]:
        return {"skipped": self.skipped, "figures": self.figures, "floors": self.floors,
                "samples": self.samples, "notes": self.notes, **self.extra}


def describe(e: BaseException) -> str:
    """One line for a person: a gRPC error's code and details, else the exception's text."""
    code, details = getattr(e, "code", None), getattr(e, "details", None)
    if callable(code) and callable(details):
        with contextlib.suppress(Exception):
            return f"{code().name}: {details()}"
    text = str(e)
    return text.splitlines()[0] if text else repr(e)


def guarded(name: str, fn: Callable[[], Section], errors: list[str]) -> Section:
    """Run one section; a failure is recorded in ``errors`` and the run goes on."""
    print(f"== {name}", file=sys.stderr)
    try:
        sec = fn()
    except KeyboardInterrupt:
        raise
    except Exception as e:
        traceback.print_exc()
        errors.append(f"{name}: {describe(e)}")
        sec = Section(name, skipped=f"error: {describe(e)}")
    sec.finish()
    return sec


def _num(v: float | None, unit: str) -> str:
    if v is None:
        return "-"
    if unit in ("KiB", "count"):
        return f"{v:,.0f}"
    return f"{v:.2f}" if abs(v) < 10 else f"{v:.1f}"


def table(sections: list[Section]) -> str:
    """section | figure | unit | median | p90 | floor (its median) | ratio, then notes."""
    rows: list[tuple[str, ...]] = []
    for sec in sections:
        if sec.skipped:
            rows.append((sec.name, f"skipped: {sec.skipped}", "", "", "", "", ""))
            continue
        for name, f in sec.figures.items():
            base = sec.floors.get(f["floor"]) if f["floor"] else None
            rows.append((sec.name, name, f["unit"], _num(f["median"], f["unit"]),
                         _num(f["p90"], f["unit"]) if f["n"] > 1 else "-",
                         _num(base["median"], base["unit"]) if base else "-",
                         f"{f['ratio']:.2f}x" if f["ratio"] is not None else "-"))
        for name, f in sec.floors.items():
            rows.append((sec.name, f"floor: {name}", f["unit"], _num(f["median"], f["unit"]),
                         _num(f["p90"], f["unit"]) if f["n"] > 1 else "-", "", ""))
    head = ("section", "figure", "unit", "median", "p90", "floor", "ratio")
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    lines = []
    for r in [head, *rows]:
        left = [r[0].ljust(widths[0]), r[1].ljust(widths[1]), r[2].ljust(widths[2])]
        right = [r[i].rjust(widths[i]) for i in range(3, len(head))]
        lines.append("  ".join(left + right).rstrip())
        if r is head:
            lines.append("-" * len(lines[0]))
    notes = [f"{sec.name}: {n}" for sec in sections for n in sec.notes]
    if notes:
        lines += ["", "notes:", *(f"  {n}" for n in notes)]
    return "\n".join(lines)
