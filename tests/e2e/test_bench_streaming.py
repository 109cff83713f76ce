"""Smoke test of ``bench.streaming``: a few round trips and small transfers end to end,
well-formed JSON, nothing left behind. Never a speed assertion."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.e2e

PROJECT = Path(__file__).resolve().parents[2]
ITERATIONS, SHORT_EXECS, MB, ROUNDS = 5, 2, 2, 2
ROUND_TRIPS = ("exec spdy v4", "exec websocket v5", "tcp loopback echo")
TRANSFERS = ("port-forward spdy", "pod IP direct", "tcp loopback")


def _positive(v: Any) -> bool:
    return isinstance(v, int | float) and math.isfinite(v) and v > 0


def _check_latency(s: dict[str, Any], n: int) -> None:
    assert s["n"] == n
    for key in ("median_ms", "p90_ms", "p99_ms", "min_ms", "max_ms"):
        assert _positive(s[key]), (key, s)
    assert s["min_ms"] <= s["median_ms"] <= s["p90_ms"] <= s["p99_ms"] <= s["max_ms"]


def test_bench_streaming(tmp_path: Path) -> None:
    out = tmp_path / "out.json"
    # TMPDIR: the benchmark's daemon, registry and logs live under this test's directory,
    # so the session's leak checks (mounts under the pytest base) cover them too.
    r = subprocess.run([sys.executable, "-m", "bench.streaming", "--iterations", str(ITERATIONS),
                        "--warmup", "2", "--short-execs", str(SHORT_EXECS), "--mb", str(MB),
                        "--rounds", str(ROUNDS), "--json", str(out)],
                       cwd=PROJECT, env={**os.environ, "TMPDIR": str(tmp_path)},
                       stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=300,
                       check=False)
    assert r.returncode == 0, f"stdout:\n{r.stdout}\nstderr:\n{r.stderr[-4000:]}"
    for name in (*ROUND_TRIPS, *TRANSFERS):
        assert name in r.stdout

    result = json.loads(out.read_text())
    assert (result["iterations"], result["short_execs"], result["mb"], result["rounds"]) == (
        ITERATIONS, SHORT_EXECS, MB, ROUNDS)
    assert result["protocols"] == {"spdy": "v4.channel.k8s.io",
                                   "websocket": "v5.channel.k8s.io"}
    assert set(result["round_trip"]) == set(ROUND_TRIPS)
    for name in ROUND_TRIPS:
        _check_latency(result["round_trip"][name], ITERATIONS)
        samples = result["samples_ms"][name]
        assert len(samples) == ITERATIONS and all(_positive(s) for s in samples)
    _check_latency(result["short_exec"], SHORT_EXECS)
    assert set(result["round_trip_ratio"]) == {f"{n} / tcp loopback echo"
                                               for n in ROUND_TRIPS[:2]}
    assert all(_positive(v) for v in result["round_trip_ratio"].values())

    assert set(result["throughput"]) == set(TRANSFERS)
    for name in TRANSFERS:
        tp = result["throughput"][name]
        if tp is None:  # only the direct path to the pod IP may be unreachable
            assert name == "pod IP direct" and result["notes"]
            continue
        assert tp["n"] == ROUNDS and len(tp["seconds"]) == ROUNDS
        assert all(_positive(s) for s in tp["seconds"])
        for key in ("mb_per_s", "min_mb_per_s", "max_mb_per_s"):
            assert _positive(tp[key]), (name, key, tp)
        assert tp["min_mb_per_s"] <= tp["mb_per_s"] <= tp["max_mb_per_s"]
    ratio = result["throughput_ratio"]["port-forward spdy / tcp loopback"]
    assert _positive(ratio)
    direct = result["throughput_ratio"]["port-forward spdy / pod IP direct"]
    assert direct is None or _positive(direct)
    assert _positive(result["wall_seconds"])
    assert not list(tmp_path.glob("pycrid-bs-*")), "benchmark left its temp dir"
