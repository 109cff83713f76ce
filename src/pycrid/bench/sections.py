"""The order the sections run in, shared by ``pycrid bench`` and ``python -m bench``."""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass

from pycrid.bench import lifecycle, listing, partial, rss
from pycrid.bench import nri_load as nri
from pycrid.bench.report import Section, guarded
from pycrid.bench.target import Target

SECTIONS = ("lifecycle", "nri", "rss", "list", "partial")


@dataclass
class Plan:
    """What to measure and how much."""

    sections: list[str]
    iterations: int
    nri_plugins: list[int]
    seed: int
    rss_pods: int
    list_sizes: list[int]
    list_calls: int
    #: A runtime handler whose pod start the lifecycle section times beside the default
    #: one's (e.g. runsc); "" for none.
    handler: str = ""
    #: The partial section's (old, new) images; None: skipped.
    partial_images: tuple[str, str] | None = None
    partial_rounds: int = 3


def run_sections(target: Target, idle: rss.Idle | None, plan: Plan, runc: str,
                 errors: list[str],
                 after: dict[str, Callable[[], Section]] | None = None) -> dict[str, Section]:
    """rss and list first, so the memory with N pods is not the memory after the pulls;
    then lifecycle and nri on a runtime with none of the run's pods left; then ``after``
    (sections of the caller's own, by name) when asked for."""
    done: dict[str, Section] = {}
    want = plan.sections
    if "rss" in want or "list" in want:
        fleet = rss.Fleet(target)
        try:
            buildup: list[float] = []

            def build_and_measure() -> Section:
                buildup.append(fleet.build(plan.rss_pods))
                return rss.run(target, idle, fleet, plan.rss_pods, buildup[0])

            sec = guarded("rss", build_and_measure, errors)
            if "rss" in want:
                done["rss"] = sec
            if "list" in want:
                if buildup:
                    done["list"] = guarded("list", lambda: listing.run(
                        target, fleet, plan.list_sizes, plan.list_calls), errors)
                else:
                    done["list"] = Section("list", skipped="error: no pods to list")
        finally:
            print("removing pods ...", file=sys.stderr)
            fleet.remove()
    if "lifecycle" in want:
        done["lifecycle"] = guarded("lifecycle", lambda: lifecycle.run(
            target, runc, plan.iterations, handler=plan.handler), errors)
    if "nri" in want:
        done["nri"] = guarded("nri", lambda: nri.run(
            target, plan.nri_plugins, plan.iterations, plan.seed), errors)
    if "partial" in want and "partial" not in (after or {}):
        if plan.partial_images is None:
            done["partial"] = Section("partial", skipped="give --partial-images OLD,NEW")
        else:
            old, new = plan.partial_images
            done["partial"] = guarded("partial", lambda: partial.run(
                target, old, new, plan.partial_rounds), errors)
    for name, fn in (after or {}).items():
        if name in want:
            done[name] = guarded(name, fn, errors)
    return done
