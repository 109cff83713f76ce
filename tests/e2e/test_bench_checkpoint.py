"""Smoke test of ``bench.checkpoint``: one round end to end with the interop CRIU,
well-formed JSON, nothing left behind."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import interop

pytestmark = pytest.mark.e2e

PROJECT = Path(__file__).resolve().parents[2]


def test_bench_checkpoint(tmp_path: Path) -> None:
    criu = interop.require("criu")
    out = tmp_path / "out.json"
    # TMPDIR: the benchmark's daemon, registry and logs live under this test's directory,
    # so the session's leak checks (mounts under the pytest base) cover them too.
    r = subprocess.run([sys.executable, "-m", "bench.checkpoint", "--rounds", "1",
                        "--criu", str(criu), "--json", str(out)],
                       cwd=PROJECT, env={**os.environ, "TMPDIR": str(tmp_path)},
                       stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=300,
                       check=False)
    assert r.returncode == 0, f"stdout:\n{r.stdout}\nstderr:\n{r.stderr[-4000:]}"
    result = json.loads(out.read_text())
    assert result["rounds"] == 1 and result["criu"]["version"] == "4.2"
    assert set(result["figures"]) == {
        "CheckpointContainer", "restore: CreateContainer+StartContainer",
        "restore: CreateContainer", "restore: StartContainer"}
    assert set(result["floors"]) == {"runc pause+checkpoint+resume",
                                     "CreateContainer+StartContainer"}
    for name, fig in result["figures"].items():
        assert fig["n"] == 1 and fig["median_ms"] > 0, name
        if fig["floor"] is not None:
            assert math.isfinite(fig["ratio"]) and fig["ratio"] > 0
        assert name in r.stdout
    [size] = result["archive_bytes"]
    assert size > 10_000  # CRIU's images of a shell and a sleep, at least
    [frozen] = result["criu_frozen_ms"]
    assert 0 < frozen < 60_000
