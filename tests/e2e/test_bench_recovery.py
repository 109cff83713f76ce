"""Smoke test of ``bench.recovery``: one round with two containers end to end, well-formed
JSON, nothing left behind."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

PROJECT = Path(__file__).resolve().parents[2]
CONTAINERS = 2
PHASES = ("ready (empty)", f"ready ({CONTAINERS} containers)",
          f"recovery (log, {CONTAINERS} containers)")


def test_bench_recovery(tmp_path: Path) -> None:
    out = tmp_path / "out.json"
    # TMPDIR: the benchmark's daemons, registry and logs live under this test's directory,
    # so the session's leak checks (mounts under the pytest base) cover them too.
    r = subprocess.run([sys.executable, "-m", "bench.recovery", "--containers", str(CONTAINERS),
                        "--per-pod", "1", "--rounds", "1", "--json", str(out)],
                       cwd=PROJECT, env={**os.environ, "TMPDIR": str(tmp_path)},
                       stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=300,
                       check=False)
    assert r.returncode == 0, f"stdout:\n{r.stdout}\nstderr:\n{r.stderr[-4000:]}"
    for name in PHASES:
        assert name in r.stdout

    result = json.loads(out.read_text())
    assert result["containers"] == CONTAINERS
    assert result["pods"] == CONTAINERS
    assert result["rounds"] == 1
    assert set(result["phases"]) == set(PHASES)
    assert set(result["samples_ms"]) == set(PHASES)
    ready_empty, ready_full, logged = PHASES
    for name in (ready_empty, ready_full):
        phase = result["phases"][name]
        assert phase["n"] == 1
        samples = result["samples_ms"][name]
        assert len(samples) == 1 and all(math.isfinite(s) and s > 0 for s in samples)
        assert 0 < phase["min_ms"] <= phase["median_ms"] <= phase["p90_ms"] <= phase["max_ms"]
    assert math.isfinite(result["ratio_full_to_empty"]) and result["ratio_full_to_empty"] > 0
    assert math.isfinite(result["per_container_ms"])
    # The daemon's own "recovered ... in X ms" line may not exist (yet): null then.
    samples = result["samples_ms"][logged]
    assert len(samples) == 1
    present = [s for s in samples if s is not None]
    for s in present:
        assert isinstance(s, int | float) and math.isfinite(s) and s > 0
    phase = result["phases"][logged]
    assert phase["n"] == len(present)
    if present:
        assert 0 < phase["min_ms"] <= phase["median_ms"] <= phase["p90_ms"] <= phase["max_ms"]
    else:
        assert phase["median_ms"] is None
        assert "n/a" in r.stdout
    assert not list(tmp_path.glob("pycrid-bench-rec-*")), "benchmark left its temp dir"
