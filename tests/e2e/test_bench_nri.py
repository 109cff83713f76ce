"""Smoke test of ``bench.nri``: two rounds end to end, well-formed JSON, nothing left behind."""

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
PHASES = {"0 plugins": 0, "1 plugin": 1, "5 plugins": 5}


def test_bench_nri_smoke(tmp_path: Path) -> None:
    out = tmp_path / "out.json"
    # TMPDIR: the benchmark's daemon, registry and logs live under this test's directory,
    # so the session's leak checks (mounts under the pytest base) cover them too.
    r = subprocess.run([sys.executable, "-m", "bench.nri", "--runs", "2", "--json", str(out)],
                       cwd=PROJECT, env={**os.environ, "TMPDIR": str(tmp_path)},
                       stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=240,
                       check=False)
    assert r.returncode == 0, f"stdout:\n{r.stdout}\nstderr:\n{r.stderr[-4000:]}"
    for name in PHASES:
        assert name in r.stdout

    result = json.loads(out.read_text())
    assert result["runs"] == 2
    assert set(result["phases"]) == set(PHASES)
    assert set(result["samples_ms"]) == set(PHASES)
    for name, plugins in PHASES.items():
        phase = result["phases"][name]
        assert phase["plugins"] == plugins
        assert phase["n"] == 2
        samples = result["samples_ms"][name]
        assert len(samples) == 2 and all(s > 0 for s in samples)
        assert 0 < phase["min_ms"] <= phase["median_ms"] <= phase["p90_ms"] <= phase["max_ms"]
        assert math.isfinite(phase["ratio_to_0"]) and phase["ratio_to_0"] > 0
    assert result["phases"]["0 plugins"]["ratio_to_0"] == 1.0
    assert not list(tmp_path.glob("pycrid-bench-nri-*")), "benchmark left its temp dir"
