"""Start-up that a broken CNI plugin cannot stall, and sockets that collide in the config.

A CNI plugin that never answers VERSION (and leaves a child holding its output, so
killing the plugin alone would not end the wait): the daemon is ready at once, Status
says which plugin does not answer (NetworkReady false, and ``pycrid status``), the
plugin is retried, and once it answers the network is ready and pods run; the hung
plugin and its child are killed. Two socket keys with one path stop start-up (exit 2)
naming both.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from cri_api.v1 import api_pb2 as pb

from tests.support import network
from tests.support.daemon import Daemon, running_daemon
from tests.support.images import TestImages
from tests.support.pods import (
    Pods,
    command_lines,
    daemon_config,
    leftovers,
    pod_config,
    wait_for,
)
from tests.support.registry import LocalRegistry

pytestmark = pytest.mark.e2e

#: Hangs on VERSION while ``$0.hang`` exists (its child keeps the output pipe open);
#: otherwise it is the bridge plugin.
FLAKY = """#!/bin/sh
if [ "$CNI_COMMAND" = VERSION ] && [ -e "$0.hang" ]; then
    sleep 3597 &
    wait
fi
exec /usr/lib/cni/bridge
"""


def _network_ready(d: Daemon) -> Any:
    st = d.client.runtime.Status(pb.StatusRequest(), timeout=30)
    return next(c for c in st.status.conditions if c.type == "NetworkReady")


def test_a_plugin_that_never_answers_version_stalls_nothing(
        tmp_path: Path, registry: LocalRegistry, test_images: TestImages) -> None:
    bin_dir = tmp_path / "cni-bin"
    bin_dir.mkdir()
    flaky = bin_dir / "flaky"
    flaky.write_text(FLAKY)
    flaky.chmod(0o755)
    hang = Path(f"{flaky}.hang")
    hang.touch()
    conf_dir = tmp_path / "net.d"
    doc = network.test_conflist(str(tmp_path))
    doc["plugins"][0]["type"] = "flaky"
    network.write_conflist(str(conf_dir), doc)
    config = (daemon_config(registry, test_images, tmp_path)
              + f'{network.CNI_SECTION}\nconf_dir = "{conf_dir}"\n'
              + f"bin_dirs = {json.dumps([str(bin_dir), *network.BIN_DIRS])}\n")
    with running_daemon(str(tmp_path), config) as d:
        cond = wait_for(lambda: (c := _network_ready(d)).message and c, 30,
                        "NetworkReady to say why it is false")
        assert (cond.status, cond.reason) == (False, "NetworkPluginNotReady")
        assert f"plugin type='flaky' ({flaky}) did not answer VERSION" in cond.message
        log = d.log()
        # Ready before the plugin's answer was given up on: start-up did not wait for it.
        assert log.index("pycrid is ready") < log.index("did not answer VERSION"), log[-3000:]
        shown = subprocess.run([sys.executable, "-m", "pycrid", "status", "--address",
                                d.address], capture_output=True, text=True, check=False)
        assert shown.returncode == 1 and "did not answer VERSION" in shown.stdout, shown
        hang.unlink()  # the plugin answers from now on: a retry finds it
        wait_for(lambda: _network_ready(d).status, 30, "NetworkReady once the plugin answers")
        pods = Pods(d.client)
        sid = pods.run(pod_config())
        assert pods.pod_status(sid).status.network.ip
        pods.remove_pod(sid)
        assert leftovers(d.root, d.state) == []
    assert not [c for _, c in command_lines() if c == "sleep 3597"], "a hung plugin's child"


def test_two_sockets_at_one_path_stop_start_up(tmp_path: Path, registry: LocalRegistry,
                                               test_images: TestImages) -> None:
    """The NRI socket and containerd's API socket given one path (the issue's case)."""
    sock = tmp_path / "same.sock"
    config = (daemon_config(registry, test_images, tmp_path)
              + f'[plugins."pycrid.nri.v1.nri"]\nsocket_path = "{sock}"\n'
              + f'[plugins."pycrid.cadvisor.v1.containerd"]\nsocket_path = "{sock}"\n')
    with pytest.raises(AssertionError, match="pycrid exited with 2"):
        with running_daemon(str(tmp_path), config):
            pass
    log = (tmp_path / "pycrid.log").read_text()
    assert 'plugins."pycrid.cadvisor.v1.containerd".socket_path' in log
    assert 'plugins."pycrid.nri.v1.nri".socket_path' in log
    assert not sock.exists() and not os.path.exists(tmp_path / "state" / "pycrid.sock")
