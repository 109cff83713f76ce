"""A CNI plugin that does not answer VERSION never holds anything up (network/cni.py):
loading is bounded and runs in the background, the plugin is named and retried."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

import pytest

from pycrid.network import cni, invoke
from pycrid.network.cache import ResultCache
from pycrid.network.cni import CNINetwork
from pycrid.tasks import Owner

#: A plugin that answers VERSION unless ``$0.hang`` exists; then it hangs on it, with a
#: child that holds its output open.
PLUGIN = """#!/bin/sh
if [ "$CNI_COMMAND" = VERSION ]; then
    if [ -e "$0.hang" ]; then
        sleep 3598 &
        wait
    fi
    echo '{"cniVersion":"1.0.0","supportedVersions":["0.4.0","1.0.0"]}'
fi
"""


def _children_left() -> list[str]:
    found = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    if f.read() == b"sleep\x003598\x00":
                        found.append(pid)
            except OSError:
                pass
    return found


@pytest.fixture
def net(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> CNINetwork:
    monkeypatch.setattr(invoke, "VERSION_TIMEOUT", 0.5)
    monkeypatch.setattr(cni, "RETRY_LOAD_EVERY", 0.2)
    bin_dir, conf_dir = tmp_path / "bin", tmp_path / "net.d"
    bin_dir.mkdir()
    conf_dir.mkdir()
    for kind in ("slow", "quick"):
        (bin_dir / kind).write_text(PLUGIN)
        (bin_dir / kind).chmod(0o755)
    (bin_dir / "slow.hang").touch()
    (conf_dir / "10-net.conflist").write_text(json.dumps(
        {"cniVersion": "1.0.0", "name": "net",
         "plugins": [{"type": "quick"}, {"type": "slow"}]}))
    return CNINetwork(conf_dir=str(conf_dir), bin_dirs=[str(bin_dir)], max_conf_num=1,
                      cache=ResultCache(str(tmp_path / "cache")), owner=Owner("test cni"))


async def test_a_hung_plugin_is_named_killed_and_retried(
        net: CNINetwork, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    net.load_soon()  # start-up: returns before any plugin has answered
    assert net.error == "CNI config not loaded yet"
    reason = await net.status()  # waits for that first load, which is bounded
    assert reason is not None
    assert f"plugin type='slow' ({tmp_path / 'bin' / 'slow'}) did not answer VERSION" in reason
    assert not _children_left(), "the hung plugin's child was not killed"
    # A retry under way (the plugin still hanging) does not hold up the answer.
    monkeypatch.setattr(invoke, "VERSION_TIMEOUT", 5.0)
    await asyncio.sleep(0.3)
    assert await net.status() == reason  # due: starts a retry in the background
    for _ in range(200):
        if _children_left():
            break
        await asyncio.sleep(0.05)
    assert _children_left(), "the retry did not ask the plugin again"
    assert await net.status() == reason
    assert _children_left(), "the answer waited for the hung plugin"
    (tmp_path / "bin" / "slow.hang").unlink()  # it answers from now on
    for _ in range(300):
        if await net.status() is None:
            break
        await asyncio.sleep(0.05)
    assert await net.status() is None
    assert [n.name for n in net.networks] == ["net"]
    assert not _children_left()
