"""``pycrid bench``, the installed command, against a pycrid it did not start: every
section beside its floor, the JSON, and afterwards nothing of its own left while what was
there before (a pod, the sandbox image) is untouched. Never a speed assertion."""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cri_api.v1 import api_pb2 as pb

from tests.support.daemon import Daemon, nri_paths, running_daemon
from tests.support.images import TestImages
from tests.support.pods import Pods, daemon_config, pod_config
from tests.support.registry import LocalRegistry

pytestmark = pytest.mark.e2e

ITERATIONS, RSS_PODS, LIST_CALLS = 2, 2, 3
LIST_SIZES = (3, 5)
SECTIONS = ("lifecycle", "nri", "rss", "list")
HEADER = ["section", "figure", "unit", "median", "p90", "floor", "ratio"]


def _positive(v: Any) -> bool:
    return isinstance(v, int | float) and math.isfinite(v) and v > 0


def _pycrid() -> str:
    """The console script installed beside this interpreter (as an operator runs it)."""
    script = Path(sys.executable).parent / "pycrid"
    assert script.exists(), f"no installed pycrid entry point at {script}"
    return str(script)


@contextlib.contextmanager
def someone_elses_pod(d: Daemon) -> Iterator[str]:
    pods = Pods(d.client)
    try:
        yield pods.run(pod_config("not-the-benchmarks"))
    finally:
        pods.cleanup()


def _check_sections(result: dict[str, Any], stdout: str) -> None:
    """Every section ran, each figure is printed and its ratio is over its floor."""
    lines = stdout.splitlines()
    assert next(line for line in lines if line.startswith("section")).split() == HEADER
    assert set(result["sections"]) == set(SECTIONS)
    for name, sec in result["sections"].items():
        assert sec["skipped"] is None, (name, sec["skipped"])
        assert sec["floors"] and sec["figures"], name
        assert any(line.startswith(f"{name} ") and "floor: " in line for line in lines), name
        for fname, fig in sec["figures"].items():
            assert fname in stdout, fname
            assert len(sec["samples"][fname]) == fig["n"]
            if fig["floor"] is not None:
                base = sec["floors"][fig["floor"]]["median"]
                assert _positive(base), (name, fname)
                assert fig["ratio"] == pytest.approx(fig["median"] / base)
        for fname, floor in sec["floors"].items():
            assert f"floor: {fname}" in stdout
            assert _positive(floor["median"]) and floor["n"] == len(sec["samples"][fname])
    lc = result["sections"]["lifecycle"]
    assert lc["figures"]["CreateContainer+StartContainer"]["floor"] == "runc create+start"
    assert lc["floors"]["runc create+start"]["n"] == ITERATIONS
    assert set(result["sections"]["nri"]["figures"]) == {"CreateContainer, 1 NRI plugin"}
    rss = result["sections"]["rss"]
    assert _positive(rss["floors"]["daemon PSS idle"]["median"])
    assert rss["figures"]["monitor processes"]["median"] >= RSS_PODS
    # The other pod has no container: the sizes are reached with the run's own.
    assert result["sections"]["list"]["exited_containers"] == LIST_SIZES[-1] - RSS_PODS


def test_pycrid_bench(tmp_path: Path, registry: LocalRegistry,
                      test_images: TestImages) -> None:
    base = tmp_path / "rt"
    pause, busybox = test_images.pause.ref(registry), test_images.busybox.ref(registry)
    out = tmp_path / "out.json"
    with running_daemon(str(base), daemon_config(registry, test_images, base)) as d, \
            someone_elses_pod(d) as their_pod:
        d.client.pull(pause)  # there before: the benchmark must leave it
        assert not d.client.status(busybox).image.id
        # TMPDIR: the run's directory is under this test's, kept (--keep) to be looked at.
        r = subprocess.run(
            [_pycrid(), "bench", "--endpoint", f"unix://{d.address}", "--image", busybox,
             "--nri-socket", nri_paths(str(base))["socket_path"], "--nri-plugins", "1",
             "--iterations", str(ITERATIONS), "--rss-pods", str(RSS_PODS),
             "--list-sizes", ",".join(map(str, LIST_SIZES)), "--list-calls", str(LIST_CALLS),
             "--json", str(out), "--keep"],
            env={**os.environ, "TMPDIR": str(tmp_path)}, stdin=subprocess.DEVNULL,
            capture_output=True, text=True, timeout=180, check=False)
        assert r.returncode == 0, f"stdout:\n{r.stdout}\nstderr:\n{r.stderr[-4000:]}"

        result = json.loads(out.read_text())
        assert set(result) == {"schema", "runtime", "environment", "options", "images",
                               "sections", "errors", "leftovers", "cleanup", "wall_seconds",
                               "ok"}
        assert result["schema"] == "pycrid-bench/1"
        assert result["ok"] is True and result["errors"] == [] and result["leftovers"] == []
        assert result["runtime"] == {"endpoint": f"unix://{d.address}", "name": "pycrid",
                                     "version": result["runtime"]["version"],
                                     "api_version": "v1", "daemon_pid": d.proc.pid,
                                     "started_by_bench": False}
        # The sandbox image is the one the daemon reports; only busybox was missing.
        assert result["images"] == {"sandbox": pause, "container": busybox,
                                    "pulled": [busybox], "kept": [pause]}
        _check_sections(result, r.stdout)
        # It says what it removed: 3 pods a lifecycle round (one warm-up: the pod, the
        # hostNetwork one, the shared-PID one), the rss pods and the nri pod; busybox, which
        # it pulled.
        assert result["cleanup"]["pods"] == 3 * (ITERATIONS + 1) + RSS_PODS + 1
        assert result["cleanup"]["images_removed"] == [busybox]
        assert f"removed the images this run pulled: {busybox}" in r.stdout
        assert f"left alone the images that were there before: {pause}" in r.stdout

        # Independently of its own check: only the other pod is left, no container,
        # busybox gone, the sandbox image still there.
        pods = d.client.runtime.ListPodSandbox(pb.ListPodSandboxRequest(), timeout=30).items
        assert [p.id for p in pods] == [their_pod]
        assert not d.client.runtime.ListContainers(pb.ListContainersRequest(),
                                                   timeout=30).containers
        assert not d.client.status(busybox).image.id
        assert d.client.status(pause).image.id
    # The runc floor: no container in its private root, no cgroup of the run's.
    (run_dir,) = tmp_path.glob("pycrid-bench-*")
    assert list((run_dir / "floor" / "runc").iterdir()) == []
    assert not list(Path("/sys/fs/cgroup").glob(f"*/{run_dir.name}"))
    assert not Path("/sys/fs/cgroup", run_dir.name).exists()
    shutil.rmtree(run_dir)
