"""Fail point specs (``PYCRID_FAILPOINTS``)."""

from __future__ import annotations

import pytest

from pycrid import faults
from pycrid.errors import Internal


def test_parse_always_counted_and_kill() -> None:
    always, counted = faults._parse(" a, b#2 ,c:kill,,d#x")
    assert always == {"a", "c:kill", "d#x"}
    assert counted == {"b": 2}


def test_counted_fail_point_fails_n_times_then_passes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(faults, "_ACTIVE", frozenset())
    monkeypatch.setattr(faults, "_COUNTED", {"step": 2})
    for left in (1, 0):
        with pytest.raises(Internal, match=f"failpoint step triggered \\({left} more\\)"):
            faults.failpoint("step")
    faults.failpoint("step")
    faults.failpoint("other")
