"""docs/quickstart.md is executable: its runnable blocks run, in order, in one bash session.

Substitutions (the only differences from what a reader types):
- step 1 (``bash scripts/setup.sh serve``) is replaced by a test daemon from
  ``running_daemon`` with the local registry (``daemon_config``), its own root, state, CNI
  network and NRI socket;
- the strings in ``SUBSTITUTIONS`` are rewritten in the blocks' text: the socket path, the
  image name (the local registry's busybox) and the scratch directory (a pytest tmp dir);
- ``crictl`` is a wrapper script first on PATH that runs the real crictl: the one
  PYCRID_QUICKSTART_CRICTL names, else ../shared/interop's (``tests.support.interop``); a
  checkout with neither gets ``tests/support/crictl.py``, a stand-in over the real CRI gRPC
  API for the subcommands the quickstart uses.

After the block that runs ``crictl logs`` the test copies the container's log file aside
(``crictl rm`` deletes it). Each block must exit 0; every line of a block marked
``<!-- quickstart: output -->`` must equal a line printed by the runnable block before it
(``<...>`` matches one word). The quickstart's own teardown must leave no pod, container or
leftover behind.
"""

from __future__ import annotations

import os
import re
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from cri_api.v1 import api_pb2 as pb

from tests.support import interop
from tests.support.daemon import Daemon, running_daemon
from tests.support.images import TestImages
from tests.support.pods import daemon_config, leftovers
from tests.support.registry import LocalRegistry

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
QUICKSTART = REPO / "docs" / "quickstart.md"
RUN_MARK = "<!-- quickstart: run -->"
OUTPUT_MARK = "<!-- quickstart: output -->"
BLOCK = re.compile(r"(<!-- quickstart: (?:run|output) -->)\n```(\w*)\n(.*?)\n```", re.S)


def substitutions(socket: str, busybox: str, scratch: str) -> dict[str, str]:
    """What the test rewrites in the blocks' text, and nothing else."""
    return {
        "/run/pycrid/pycrid.sock": socket,
        "docker.io/library/busybox:1.36": busybox,
        "/tmp/pycrid-quickstart": scratch,
        # pycrid status reads the default socket from /etc/pycrid/config.toml or the
        # built-in default; point it at the test daemon instead.
        ".venv/bin/pycrid status": f".venv/bin/pycrid status --address {socket}",
    }


def blocks(text: str) -> list[tuple[str, str]]:
    """(kind, body) of every marked block, in document order; kind is 'run' or 'output'."""
    out = []
    for mark, lang, body in BLOCK.findall(text):
        kind = "run" if mark == RUN_MARK else "output"
        assert lang == ("sh" if kind == "run" else "text"), f"{mark} block is ```{lang}"
        out.append((kind, body))
    return out


def _expect(line: str) -> re.Pattern[str]:
    parts = re.split(r"<[^>]+>", line.strip())
    return re.compile(r"\S+".join(re.escape(re.sub(r"\s+", " ", p)) for p in parts))


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory, registry: LocalRegistry,
           test_images: TestImages) -> Iterator[Daemon]:
    base = tmp_path_factory.mktemp("quickstart")
    with running_daemon(str(base), daemon_config(registry, test_images, base)) as d:
        d.extra["busybox"] = test_images.busybox.ref(registry)
        yield d


def _crictl_dir(tmp: Path) -> Path:
    bindir = tmp / "bin"
    bindir.mkdir()
    wrapper = bindir / "crictl"
    real = os.environ.get("PYCRID_QUICKSTART_CRICTL") or interop.binary("crictl")
    # The stand-in runs from the caller's cwd (the scratch files are relative to it).
    target = (f'exec {real} "$@"' if real else
              f'export PYTHONPATH={REPO}${{PYTHONPATH:+:$PYTHONPATH}}\n'
              f'exec {sys.executable} -m tests.support.crictl "$@"')
    wrapper.write_text(f"#!/bin/sh\n{target}\n")
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR)
    return bindir


def test_quickstart_runs_as_written(daemon: Daemon, tmp_path: Path) -> None:
    doc = QUICKSTART.read_text()
    assert "bash scripts/setup.sh serve" in doc  # the step the test daemon stands in for
    subs = substitutions(daemon.address, daemon.extra["busybox"], str(tmp_path / "scratch"))
    parsed = blocks(doc)
    runs = [b for k, b in parsed if k == "run"]
    assert len(runs) >= 5, "the quickstart lost its runnable blocks"
    for old in subs:
        assert old in doc, f"substitution {old!r} no longer matches the quickstart"

    log = tmp_path / "scratch" / "logs" / "busybox.log"
    log_seen = tmp_path / "log-before-teardown"
    script = ["set -euo pipefail"]
    for i, body in enumerate(runs):
        for old, new in subs.items():
            body = body.replace(old, new)
        script += [f"echo '@@@ block {i} start'", body, f"echo '@@@ block {i} end'"]
        if "crictl logs" in body:  # the log, while the container still exists
            script.append(f"cp {log} {log_seen}")
    env = {**os.environ, "PATH": f"{_crictl_dir(tmp_path)}:{os.environ['PATH']}"}
    for k in ("CONTAINER_RUNTIME_ENDPOINT", "IMAGE_SERVICE_ENDPOINT", "CRI_CONFIG_FILE"):
        env.pop(k, None)
    # A config file that names nothing, so a host /etc/crictl.yaml is never read.
    (tmp_path / "crictl.yaml").write_text("")
    env["CRI_CONFIG_FILE"] = str(tmp_path / "crictl.yaml")
    try:
        proc = subprocess.run(["bash", "-c", "\n".join(script)], cwd=REPO, env=env,
                              capture_output=True, text=True, timeout=300)
    finally:
        _remove_all(daemon)  # only does something when the quickstart failed half-way
    out = proc.stdout
    outputs: dict[int, list[str]] = {}
    for m in re.finditer(r"@@@ block (\d+) start\n(.*?)@@@ block \1 end\n", out, re.S):
        outputs[int(m.group(1))] = [" ".join(line.split()) for line in m.group(2).splitlines()]
    failed = len(outputs)
    assert proc.returncode == 0 and failed == len(runs), (
        f"quickstart block {failed} failed (exit {proc.returncode}):\n"
        f"{runs[min(failed, len(runs) - 1)]}"
        f"\n--- stdout\n{out}\n--- stderr\n{proc.stderr}\n--- daemon\n{daemon.log()[-3000:]}")

    # Each output block's lines appear in what the runnable block before it printed.
    run_index = -1
    for kind, body in parsed:
        if kind == "run":
            run_index += 1
            continue
        seen = outputs[run_index]
        for line in body.splitlines():
            pattern = _expect(line)
            assert any(pattern.fullmatch(s) for s in seen), (
                f"the quickstart says block {run_index} prints {line!r}; it printed {seen}")

    # What the prose promises about `crictl ps`: the container, running.
    ps_block = next(i for i, b in enumerate(runs) if "crictl ps" in b)
    assert any("busybox" in s and "Running" in s for s in outputs[ps_block]), outputs[ps_block]
    # The log file is where step 4 says it is, and `crictl rm` deleted it, as step 7 says.
    assert "hello from pycrid" in log_seen.read_text()
    assert not log.exists()

    # The quickstart's own teardown removed everything (checked before _remove_all ran).
    assert remaining == ([], [])
    assert leftovers(daemon.root, daemon.state) == []


def _listed(daemon: Daemon) -> tuple[list[str], list[str]]:
    rt = daemon.client.runtime
    return ([p.id for p in rt.ListPodSandbox(pb.ListPodSandboxRequest(), timeout=10).items],
            [c.id for c in rt.ListContainers(pb.ListContainersRequest(), timeout=10).containers])


remaining: tuple[list[str], list[str]] = ([], [])


def _remove_all(daemon: Daemon) -> None:
    """Record what the quickstart left, then remove it so a failure leaks nothing."""
    global remaining
    remaining = _listed(daemon)
    rt = daemon.client.runtime
    for sid in remaining[0]:
        rt.StopPodSandbox(pb.StopPodSandboxRequest(pod_sandbox_id=sid), timeout=60)
        rt.RemovePodSandbox(pb.RemovePodSandboxRequest(pod_sandbox_id=sid), timeout=60)
