"""CNINetwork and the plugin protocol, against small real plugin executables."""

from __future__ import annotations

import base64
import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from pycrid.network.cache import ResultCache
from pycrid.network.cni import Attachment, CNINetwork, NotReady
from pycrid.network.invoke import Invocation, PluginError, run_plugin, supported_versions

# A CNI plugin that records each call (to the file named by "log" in its config) and
# fails on request: "fail" names a command, "statusMarker" a file that fails STATUS.
RECORDER = """\
#!{python}
import json, os, sys, time

SUPPORTED = {supported}
cmd = os.environ["CNI_COMMAND"]
conf = json.loads(sys.stdin.read() or "{{}}")
if conf.get("hang"):
    with open(conf["hang"], "w") as f:
        f.write(str(os.getpid()))
    time.sleep(60)
if "log" in conf:
    env = {{k: v for k, v in os.environ.items() if k.startswith("CNI_")}}
    with open(conf["log"], "a") as f:
        f.write(json.dumps({{"command": cmd, "env": env, "stdin": conf}}) + "\\n")
failing = conf.get("fail") == cmd or (
    cmd == "STATUS" and os.path.exists(conf.get("statusMarker", "/nonexistent")))
if failing:
    print(json.dumps({{"code": 7, "msg": f"{{conf['type']}} broke", "details": "see logs"}}))
    sys.exit(1)
if cmd == "VERSION":
    print(json.dumps({{"cniVersion": conf.get("cniVersion"), "supportedVersions": SUPPORTED}}))
elif cmd == "ADD":
    result = conf.get("prevResult") or {{
        "cniVersion": "1.0.0",
        "interfaces": [{{"name": "eth0", "sandbox": os.environ["CNI_NETNS"]}}],
        "ips": [{{"interface": 0, "address": "10.9.0.5/24"}}]}}
    print(json.dumps(result))
"""

ALL_VERSIONS = ["0.1.0", "0.2.0", "0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"]
RESULT = {"cniVersion": "1.0.0", "interfaces": [{"name": "eth0", "sandbox": "/run/netns/pod"}],
          "ips": [{"interface": 0, "address": "10.9.0.5/24"}]}
ARGS = (("K8S_POD_NAMESPACE", "prod"), ("K8S_POD_NAME", "web"), ("IgnoreUnknown", "1"))
CAPS = {"portMappings": [{"hostPort": 80, "containerPort": 8080, "protocol": "tcp"}],
        "bandwidth": {"ingressRate": 1000}}
ATT = Attachment("cid1", "/run/netns/pod", ARGS, CAPS)


def write_plugin(bin_dir: Path, kind: str, supported: list[str] | None = None) -> None:
    path = bin_dir / kind
    path.write_text(RECORDER.format(python=sys.executable, supported=supported or ALL_VERSIONS))
    path.chmod(0o755)


@dataclass
class Env:
    tmp: Path
    conf_dir: Path
    bin_dir: Path
    cache_dir: Path
    log: Path

    def write_conf(self, *plugins: dict[str, Any], version: str = "1.0.0",
                   **extra: Any) -> bytes:
        doc = {"cniVersion": version, "name": "net", **extra,
               "plugins": [{**p, "log": str(self.log)} for p in plugins]}
        data = json.dumps(doc).encode()
        (self.conf_dir / "10-net.conflist").write_bytes(data)
        return data

    async def network(self) -> CNINetwork:
        net = CNINetwork(conf_dir=str(self.conf_dir), bin_dirs=[str(self.bin_dir)],
                         max_conf_num=1, cache=ResultCache(str(self.cache_dir)))
        await net.load()
        return net

    def calls(self) -> list[dict[str, Any]]:
        if not self.log.exists():
            return []
        return [json.loads(line) for line in self.log.read_text().splitlines()]

    def summary(self) -> list[tuple[str, str]]:
        return [(c["command"], c["stdin"]["type"]) for c in self.calls()]

    def cache_files(self) -> list[str]:
        results = self.cache_dir / "results"
        return sorted(os.listdir(results)) if results.exists() else []


@pytest.fixture
def env(tmp_path: Path) -> Env:
    e = Env(tmp_path, tmp_path / "net.d", tmp_path / "bin", tmp_path / "cache",
            tmp_path / "calls.log")
    e.conf_dir.mkdir()
    e.bin_dir.mkdir()
    for kind in ("rec-a", "rec-b"):
        write_plugin(e.bin_dir, kind)
    return e


async def test_supported_versions(env: Env) -> None:
    assert await supported_versions("rec-a", [str(env.bin_dir)]) == ALL_VERSIONS


async def test_setup_returns_pod_ip(env: Env) -> None:
    env.write_conf({"type": "rec-a"})
    net = await env.network()
    assert net.error is None
    assert await net.setup(ATT) == ["10.9.0.5"]


async def test_add_runs_chain_in_order_with_prev_result(env: Env) -> None:
    env.write_conf({"type": "rec-a"}, {"type": "rec-b"})
    await (await env.network()).setup(ATT)
    first, second = env.calls()
    assert env.summary() == [("ADD", "rec-a"), ("ADD", "rec-b")]
    assert "prevResult" not in first["stdin"]
    assert second["stdin"]["prevResult"] == RESULT
    assert {c["stdin"]["name"] for c in env.calls()} == {"net"}
    assert {c["stdin"]["cniVersion"] for c in env.calls()} == {"1.0.0"}


async def test_runtime_config_per_plugin(env: Env) -> None:
    env.write_conf({"type": "rec-a", "capabilities": {"portMappings": True, "bandwidth": False}},
                   {"type": "rec-b", "capabilities": {"bandwidth": True, "dns": True}},
                   {"type": "rec-a", "runtimeConfig": {"stale": 1}})
    await (await env.network()).setup(ATT)
    configs = [c["stdin"].get("runtimeConfig") for c in env.calls()]
    # A plugin given nothing keeps the file's own runtimeConfig (as libcni does).
    assert configs == [{"portMappings": CAPS["portMappings"]},
                       {"bandwidth": {"ingressRate": 1000}},
                       {"stale": 1}]


async def test_cni_environment(env: Env) -> None:
    env.write_conf({"type": "rec-a"})
    await (await env.network()).setup(ATT)
    (call,) = env.calls()
    assert call["env"] == {
        "CNI_COMMAND": "ADD", "CNI_CONTAINERID": "cid1", "CNI_NETNS": "/run/netns/pod",
        "CNI_IFNAME": "eth0", "CNI_PATH": str(env.bin_dir),
        "CNI_ARGS": "K8S_POD_NAMESPACE=prod;K8S_POD_NAME=web;IgnoreUnknown=1"}


async def test_cache_file_is_libcni_format(env: Env) -> None:
    raw = env.write_conf({"type": "rec-a"})
    await (await env.network()).setup(ATT)
    assert env.cache_files() == ["net-cid1-eth0"]
    doc = json.loads((env.cache_dir / "results" / "net-cid1-eth0").read_text())
    assert doc["kind"] == "cniCacheV1"
    assert base64.b64decode(doc["config"]) == raw
    assert doc["containerId"] == "cid1"
    assert doc["ifName"] == "eth0"
    assert doc["networkName"] == "net"
    assert doc["cniArgs"] == [list(a) for a in ARGS]
    assert doc["capabilityArgs"] == CAPS
    assert doc["result"] == RESULT


async def test_teardown_after_restart_uses_the_cache(env: Env) -> None:
    env.write_conf({"type": "rec-a"}, {"type": "rec-b"})
    await (await env.network()).setup(ATT)
    (env.conf_dir / "10-net.conflist").unlink()
    restarted = await env.network()
    assert restarted.error is not None
    env.log.unlink()
    await restarted.teardown(Attachment("cid1", "/run/netns/pod", (), {}))
    assert env.summary() == [("DEL", "rec-b"), ("DEL", "rec-a")]
    for call in env.calls():
        assert call["stdin"]["prevResult"] == RESULT
        assert call["env"]["CNI_ARGS"] == "K8S_POD_NAMESPACE=prod;K8S_POD_NAME=web;IgnoreUnknown=1"
        assert call["env"]["CNI_IFNAME"] == "eth0"
    assert env.cache_files() == []


async def test_teardown_without_cache(env: Env) -> None:
    env.write_conf({"type": "rec-a"}, {"type": "rec-b"})
    net = await env.network()
    await net.teardown(ATT, fallback=False)
    assert env.calls() == []
    await net.teardown(ATT)  # fallback: the current config, without prevResult
    assert env.summary() == [("DEL", "rec-b"), ("DEL", "rec-a")]
    assert all("prevResult" not in c["stdin"] for c in env.calls())


async def test_failing_add_is_undone(env: Env) -> None:
    env.write_conf({"type": "rec-a"}, {"type": "rec-b", "fail": "ADD"})
    net = await env.network()
    with pytest.raises(PluginError) as info:
        await net.setup(ATT)
    assert "rec-b broke" in str(info.value)
    assert "see logs" in str(info.value)
    assert info.value.code == 7
    assert env.summary() == [("ADD", "rec-a"), ("ADD", "rec-b"),
                             ("DEL", "rec-b"), ("DEL", "rec-a")]
    assert env.cache_files() == []


async def test_failing_del_still_dels_the_rest(env: Env) -> None:
    env.write_conf({"type": "rec-a"}, {"type": "rec-b", "fail": "DEL"})
    net = await env.network()
    await net.setup(ATT)
    with pytest.raises(PluginError, match="rec-b broke"):
        await net.teardown(ATT)
    assert env.summary()[2:] == [("DEL", "rec-b"), ("DEL", "rec-a")]
    assert env.cache_files() == ["net-cid1-eth0"]  # kept for the retry


async def test_load_refuses_unsupported_version(env: Env) -> None:
    write_plugin(env.bin_dir, "old", ["0.3.1", "0.4.0"])
    env.write_conf({"type": "rec-a"}, {"type": "old"})
    net = await env.network()
    assert net.networks == []
    assert net.error is not None
    assert "plugin 'old' does not support config version '1.0.0'" in net.error
    with pytest.raises(NotReady):
        await net.setup(ATT)


async def test_load_missing_plugin(env: Env) -> None:
    env.write_conf({"type": "rec-a"}, {"type": "nope"})
    net = await env.network()
    assert net.error is not None
    assert "failed to find plugin 'nope'" in net.error


async def test_status_runs_for_1_1_0(env: Env) -> None:
    marker = env.tmp / "broken"
    env.write_conf({"type": "rec-a"}, {"type": "rec-b", "statusMarker": str(marker)},
                   version="1.1.0")
    net = await env.network()
    assert await net.status() is None
    assert env.summary() == [("STATUS", "rec-a"), ("STATUS", "rec-b")]
    marker.touch()
    reason = await net.status()
    assert reason is not None
    assert reason.startswith("network 'net': ")
    assert "rec-b broke; see logs" in reason
    marker.unlink()
    assert await net.status() is None


async def test_status_not_run_before_1_1_0(env: Env) -> None:
    env.write_conf({"type": "rec-a", "statusMarker": str(env.tmp)}, version="1.0.0")
    net = await env.network()
    assert await net.status() is None
    assert env.calls() == []


async def test_check_with_prev_result(env: Env) -> None:
    env.write_conf({"type": "rec-a"}, {"type": "rec-b"}, version="0.4.0")
    net = await env.network()
    await net.setup(ATT)
    await net.check(ATT.container_id, ATT.netns)
    checks = [c for c in env.calls() if c["command"] == "CHECK"]
    assert [c["stdin"]["type"] for c in checks] == ["rec-a", "rec-b"]
    assert all(c["stdin"]["prevResult"] == RESULT for c in checks)


@pytest.mark.parametrize(("version", "extra"), [("1.0.0", {"disableCheck": True}),
                                                ("0.3.1", {})])
async def test_check_skipped(env: Env, version: str, extra: dict[str, Any]) -> None:
    env.write_conf({"type": "rec-a"}, version=version, **extra)
    net = await env.network()
    await net.setup(ATT)
    await net.check(ATT.container_id, ATT.netns)
    assert env.summary() == [("ADD", "rec-a")]


async def test_plugin_error_without_json(env: Env) -> None:
    (env.bin_dir / "bad").write_text(f"#!{sys.executable}\nimport sys\n"
                                     "sys.stderr.write('no bridge here\\n')\nsys.exit(3)\n")
    (env.bin_dir / "bad").chmod(0o755)
    with pytest.raises(PluginError, match=r"plugin type='bad' failed \(add\): no bridge here"):
        await run_plugin("bad", [str(env.bin_dir)], Invocation("ADD"), b"{}")


async def test_hung_plugin_is_killed(env: Env) -> None:
    pidfile = env.tmp / "pid"
    config = json.dumps({"type": "rec-a", "hang": str(pidfile)}).encode()
    start = time.monotonic()
    with pytest.raises(PluginError, match="did not answer"):
        await run_plugin("rec-a", [str(env.bin_dir)], Invocation("ADD"), config, limit=1.0)
    assert time.monotonic() - start < 10
    pid = int(pidfile.read_text())
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
