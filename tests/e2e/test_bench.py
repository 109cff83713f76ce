"""Smoke tests of ``python -m bench``: every section with tiny numbers end to end, the table
printed, the JSON well formed, nothing left behind; and ``--endpoint`` against a runtime it
did not start. Never a speed assertion."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from bench.pull_kinds import KIND_NAMES
from cri_api.v1 import api_pb2 as pb

from tests.support import interop
from tests.support.daemon import nri_paths, running_daemon
from tests.support.images import TestImages
from tests.support.pods import daemon_config
from tests.support.registry import LocalRegistry

pytestmark = pytest.mark.e2e

PROJECT = Path(__file__).resolve().parents[2]
ITERATIONS, PULL_ROUNDS, RSS_PODS, LIST_CALLS = 2, 1, 2, 3
LIST_SIZES = (3, 6)
#: partial needs skopeo (../shared/interop): without it the run leaves that section out.
SECTIONS = ("lifecycle", "nri", "pull", "rss", "list") + (
    ("partial",) if interop.binary("skopeo") else ())
#: The endpoint test also times gVisor's pod start where runsc is installed.
RUNSC = shutil.which("runsc") is not None
#: The pull section makes its zstd:chunked image with upstream skopeo, where it is.
SKOPEO = interop.binary("skopeo") is not None


def _positive(v: Any) -> bool:
    return isinstance(v, int | float) and math.isfinite(v) and v > 0


def _check_stats(name: str, s: dict[str, Any], n: int) -> None:
    assert s["n"] == n, (name, s)
    for key in ("median", "p90", "min", "max"):
        assert _positive(s[key]), (name, key, s)
    assert s["min"] <= s["median"] <= s["p90"] <= s["max"], (name, s)


def _expected_n(section: str, figure: str) -> int:
    return {"lifecycle": ITERATIONS, "nri": ITERATIONS, "pull": PULL_ROUNDS, "rss": 1,
            "list": LIST_CALLS, "partial": 1}[section]


def test_bench(tmp_path: Path) -> None:
    out = tmp_path / "out.json"
    # TMPDIR: the benchmark's daemon, registry and logs live under this test's directory,
    # so the session's leak checks (mounts under the pytest base) cover them too.
    r = subprocess.run([sys.executable, "-m", "bench", "--iterations", str(ITERATIONS),
                        "--list-sizes", ",".join(map(str, LIST_SIZES)),
                        "--list-calls", str(LIST_CALLS), "--rss-pods", str(RSS_PODS),
                        "--pull-mb", "2", "--pull-layers", "2",
                        "--pull-rounds", str(PULL_ROUNDS), "--nri-plugins", "0,1",
                        "--partial-mb", "2", "--partial-layers", "2", "--partial-files", "20",
                        "--partial-rounds", "1", "--sections", ",".join(SECTIONS),
                        "--json", str(out)],
                       cwd=PROJECT, env={**os.environ, "TMPDIR": str(tmp_path)},
                       stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=240,
                       check=False)
    assert r.returncode == 0, f"stdout:\n{r.stdout}\nstderr:\n{r.stderr[-4000:]}"
    header = next(line for line in r.stdout.splitlines() if line.startswith("section"))
    assert header.split() == ["section", "figure", "unit", "median", "p90", "floor", "ratio"]

    result = json.loads(out.read_text())
    assert result["ok"] is True and result["errors"] == [] and result["leftovers"] == []
    rt = result["runtime"]
    assert rt["name"] == "pycrid" and rt["version"] and rt["started_by_bench"] is True
    assert isinstance(rt["daemon_pid"], int) and rt["endpoint"].startswith("unix://")
    env = result["environment"]
    assert env["cpus"] >= 1 and env["kernel"] and "runc" in env["runc"]
    assert "conmon" in env["conmon"]
    assert set(result["sections"]) == set(SECTIONS)

    for name in SECTIONS:
        sec = result["sections"][name]
        assert sec["skipped"] is None, (name, sec["skipped"])
        assert sec["figures"] and sec["floors"], name
        for fname, floor in sec["floors"].items():
            _check_stats(fname, floor, _expected_n(name, fname))
            assert floor["unit"] in ("ms", "MB/s", "KiB")
            assert f"floor: {fname}" in r.stdout
        for fname, fig in sec["figures"].items():
            assert fname in r.stdout, fname
            _check_stats(fname, fig, _expected_n(name, fname))
            samples = sec["samples"][fname]
            assert len(samples) == fig["n"] and all(_positive(v) for v in samples)
            if fig["floor"] is None:
                assert fig["ratio"] is None
                continue
            base = sec["floors"][fig["floor"]]
            assert fig["unit"] == base["unit"]
            assert fig["ratio"] == pytest.approx(fig["median"] / base["median"], rel=1e-9)

    lc = result["sections"]["lifecycle"]["figures"]
    assert lc["pod start (Run+Create+Start)"]["floor"] == "runc create+start"
    assert lc["CreateContainer+StartContainer"]["floor"] == "runc create+start"
    assert lc["pod start hostNetwork (Run+Create+Start)"]["floor"] == "runc create+start"
    # A whole pod start is its parts, round by round.
    samples = result["sections"]["lifecycle"]["samples"]
    for i in range(ITERATIONS):
        parts = sum(samples[k][i] for k in ("RunPodSandbox", "CreateContainer",
                                            "StartContainer"))
        assert samples["pod start (Run+Create+Start)"][i] == pytest.approx(parts)
        # The hostNetwork start has its own Create and Start, untabled: more than its Run.
        assert samples["pod start hostNetwork (Run+Create+Start)"][i] > \
            samples["RunPodSandbox hostNetwork"][i]

    nri = result["sections"]["nri"]
    assert set(nri["figures"]) == {"CreateContainer, 1 NRI plugin"}
    assert set(nri["floors"]) == {"CreateContainer, 0 NRI plugins"}

    pull = result["sections"]["pull"]
    assert pull["image"]["layers"] == 2 and pull["image"]["bytes"] > 2 << 20
    assert not any("did not fetch" in n for n in pull["notes"])
    # One image per layer kind (zstd:chunked only where skopeo is there to make it), each
    # PullImage shown against the minimal pull of the same image, timed each round.
    kinds = [i["kind"] for i in pull["images"]]
    assert kinds == [k for k in KIND_NAMES if k != "zstd:chunked text" or SKOPEO]
    text = next(i for i in pull["images"] if i["kind"] == "gzip text")
    assert text["content"] == "text" and text["bytes"] < pull["image"]["bytes"]  # compresses
    for kind in kinds:
        suffix = "" if kind == "gzip" else f" {kind}"
        fig = pull["figures"][f"PullImage{suffix} against the minimal pull"]
        assert fig["floor"] == f"minimal pull{suffix}"
        assert len(pull["samples"][f"minimal pull{suffix}"]) == PULL_ROUNDS

    rss = result["sections"]["rss"]["figures"]
    # pycrid: one conmon per container; the bench's pods (the kubelet's usual ones: no
    # shared PID namespace) have no pause.
    assert rss["monitor processes"]["median"] == RSS_PODS
    assert rss[f"daemon RSS, {RSS_PODS} pods"]["ratio"] > 0

    if "partial" in SECTIONS:
        part = result["sections"]["partial"]
        # v2 after v1 fetched a part of v2; the hard-linked pair takes less disk.
        fetched = part["figures"]["bytes fetched v2 after v1 (vs a whole v2)"]
        assert fetched["floor"] == "bytes of v2 (a whole pull)" and fetched["ratio"] < 1
        assert part["figures"]["disk of the old version and v2, use_hard_links"]["median"] < \
            part["figures"]["disk of the old version and v2"]["median"]
        # The unpack floor was timed in the run, and the pulls are compared with it.
        alone = part["figures"]["PullImage v2 after v1 (vs unpacking v2's tars alone)"]
        assert alone["floor"] == "unpack v2's tars from memory, nothing fetched"
        assert part["floors"][alone["floor"]]["median"] > 0 and alone["ratio"] > 0

    lst = result["sections"]["list"]
    assert set(lst["figures"]) == {f"ListContainers ({n} containers)" for n in LIST_SIZES} | {
        f"ListPodSandbox ({RSS_PODS} pods, {n} containers)" for n in LIST_SIZES}
    assert lst["exited_containers"] == LIST_SIZES[-1] - RSS_PODS
    assert not list(tmp_path.glob("pycrid-bench-*")), "benchmark left its temp dir"


def test_bench_endpoint(tmp_path: Path, registry: LocalRegistry,
                        test_images: TestImages) -> None:
    """``--endpoint``: a runtime the benchmark did not start (a pycrid of this test's, on
    its own registry) is measured through its socket; its pid is found from the socket,
    NRI goes through ``--nri-socket``, and it is handed back with no pod and no image of
    the benchmark's left."""
    base = tmp_path / "rt"
    with running_daemon(str(base), daemon_config(registry, test_images, base)) as d:
        images_before = {i.id for i in d.client.list()}
        out = tmp_path / "out.json"
        r = subprocess.run([sys.executable, "-m", "bench", "--endpoint", f"unix://{d.address}",
                            "--nri-socket", nri_paths(str(base))["socket_path"],
                            "--sections", "lifecycle,nri,rss", "--iterations", "1",
                            "--rss-pods", "1", "--nri-plugins", "1", "--json", str(out),
                            *(["--runtime-handler", "runsc"] if RUNSC else [])],
                           cwd=PROJECT, env={**os.environ, "TMPDIR": str(tmp_path)},
                           stdin=subprocess.DEVNULL, capture_output=True, text=True,
                           timeout=240, check=False)
        assert r.returncode == 0, f"stdout:\n{r.stdout}\nstderr:\n{r.stderr[-4000:]}"
        result = json.loads(out.read_text())
        assert result["ok"] is True
        assert result["runtime"] == {"endpoint": f"unix://{d.address}", "name": "pycrid",
                                     "version": result["runtime"]["version"],
                                     "api_version": "v1", "daemon_pid": d.proc.pid,
                                     "started_by_bench": False}
        assert set(result["sections"]) == {"lifecycle", "nri", "rss"}
        for name, sec in result["sections"].items():
            assert sec["skipped"] is None, (name, sec["skipped"])
        if RUNSC:  # gVisor's pod start beside the default handler's
            lc = result["sections"]["lifecycle"]
            fig = lc["figures"]["pod start runsc (Run+Create+Start)"]
            assert fig["floor"] == "pod start (Run+Create+Start)" and _positive(fig["ratio"])
            assert lc["runtime_handler"] == "runsc"
        nri = result["sections"]["nri"]["figures"]["CreateContainer, 1 NRI plugin"]
        assert _positive(nri["ratio"])
        assert result["sections"]["rss"]["figures"]["monitor processes"]["median"] == 1
        assert d.client.runtime.ListPodSandbox(pb.ListPodSandboxRequest(), timeout=30).items \
            == []
        # Only the runtime's own sandbox image (from its registry) may have appeared.
        left = {t for i in d.client.list() if i.id not in images_before for t in i.repo_tags}
        assert left <= {test_images.pause.ref(registry)}, left


def test_bench_pull_against(tmp_path: Path) -> None:
    """``--pull-against``: another runtime (a second pycrid here) pulls the same images in
    the same rounds; every kind shows the runtime under test against it, wall time and the
    daemons' CPU, and ``--registry-config-dir`` leaves no hosts.toml behind."""
    base, certs = tmp_path / "other", tmp_path / "certs.d"
    certs.mkdir()
    with running_daemon(str(base), "version = 2\n"
                        f'[plugins."pycrid.cri.v1.images".registry]\nconfig_path = "{certs}"\n'
                        ) as d:
        out = tmp_path / "out.json"
        r = subprocess.run([sys.executable, "-m", "bench", "--sections", "pull",
                            "--pull-mb", "2", "--pull-layers", "2", "--pull-rounds", "1",
                            "--pull-kinds", "gzip,uncompressed text",
                            "--pull-against", f"unix://{d.address}",
                            "--registry-config-dir", str(certs), "--json", str(out)],
                           cwd=PROJECT, env={**os.environ, "TMPDIR": str(tmp_path)},
                           stdin=subprocess.DEVNULL, capture_output=True, text=True,
                           timeout=240, check=False)
        assert r.returncode == 0, f"stdout:\n{r.stdout}\nstderr:\n{r.stderr[-4000:]}"
        assert d.client.list() == []  # its pulls were removed
    pull = json.loads(out.read_text())["sections"]["pull"]
    assert pull["against"] == f"unix://{d.address}"
    other = f"pycrid (unix://{d.address})"  # the same name as the runtime under test's
    for suffix in ("", " uncompressed text"):
        fig = pull["figures"][f"PullImage{suffix} against {other}"]
        assert fig["floor"] == f"{other} PullImage{suffix}" and _positive(fig["ratio"])
        assert pull["samples"][f"{other} PullImage{suffix}"][0] > 0
        cpu = pull["figures"][f"PullImage{suffix} daemon CPU against {other}"]
        assert cpu["n"] == 1 and cpu["floor"] == f"{other} PullImage{suffix} daemon CPU"
    assert list(certs.iterdir()) == []
