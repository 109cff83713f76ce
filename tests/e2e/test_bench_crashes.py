"""Smoke test of ``bench.crashes``: one run with one kill end to end, well-formed JSON,
nothing left behind."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

PROJECT = Path(__file__).resolve().parents[2]


def test_bench_crashes(tmp_path: Path) -> None:
    out = tmp_path / "out.json"
    # TMPDIR: the benchmark's daemon, registry and logs live under this test's directory,
    # so the session's leak checks (mounts under the pytest base) cover them too.
    r = subprocess.run([sys.executable, "-m", "bench.crashes", "--runs", "1", "--kills", "1",
                        "--workers", "2", "--json", str(out)],
                       cwd=PROJECT, env={**os.environ, "TMPDIR": str(tmp_path)},
                       stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=300,
                       check=False)
    assert r.returncode == 0, f"stdout:\n{r.stdout}\nstderr:\n{r.stderr[-4000:]}"
    assert "every run clean" in r.stdout
    result = json.loads(out.read_text())
    [run] = result["runs"]
    assert run["kills"] == 1
    assert run["operations"] == sum(run["counts"].values()) > 0
    assert run["disagreements"] == run["errors"] == run["leftovers"] == []
    assert any(k.startswith("RunPodSandbox ") for k in run["counts"])
