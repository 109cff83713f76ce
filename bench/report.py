"""The report (``pycrid.bench.report``) and this benchmark's sections: the installed ones
plus pull and partial, which need the test registry."""

from __future__ import annotations

from pycrid.bench.report import Section, table

__all__ = ["SECTIONS", "Section", "table"]

SECTIONS = ("lifecycle", "nri", "pull", "rss", "list", "partial")
