"""The shipped default pod network and the CNI config keys."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from pycrid.builtins import _init_runtime_config
from pycrid.config.decode import ConfigError, decode
from pycrid.config.schema import RuntimeConfig
from pycrid.network.conf import parse

DEFAULT_CONF = Path(__file__).resolve().parents[2] / "contrib" / "cni" / "10-pycrid-net.conflist"


def test_default_network_keeps_pod_traffic_on_the_host() -> None:
    raw = DEFAULT_CONF.read_bytes()
    net = parse(raw, str(DEFAULT_CONF))
    assert net.types == ["bridge", "portmap"]
    bridge = net.plugins[0]
    assert bridge["ipMasq"] is False and not bridge.get("isDefaultGateway", False)
    assert bridge["ipam"]["routes"] == []  # no default route inside pods
    assert net.capabilities == {"portMappings"}
    assert json.loads(raw)["cniVersion"] == net.cni_version == "1.0.0"


def _runtime(data: dict[str, object]) -> RuntimeConfig:
    config, unknown = decode(RuntimeConfig, data, 'plugins."pycrid.cri.v1.runtime"')
    assert unknown == []
    return config


def test_cni_keys_and_handlers() -> None:
    config = _runtime({"cni": {"conf_dir": "/x/net.d", "max_conf_num": 0},
                       "runtimes": {"isolated": {"cni_conf_dir": "/y/net.d"}},
                       "discover_runsc": False})
    assert config.cni.conf_dir == "/x/net.d" and config.cni.max_conf_num == 0
    assert config.cni.bin_dirs == ["/opt/cni/bin", "/usr/lib/cni"]
    out = asyncio.run(_init_runtime_config(SimpleNamespace(config=config)))  # type: ignore[arg-type]
    # Adding a handler keeps the default runc one, as containerd's config merge does.
    assert sorted(out.runtimes) == ["isolated", "runc"]
    assert out.runtimes["isolated"].cni_conf_dir == "/y/net.d"


@pytest.mark.parametrize(("data", "key"), [
    ({"cni": {"bin_dirs": ["relative/bin"]}}, "cni.bin_dirs"),
    ({"cni": {"conf_dir": "net.d"}}, "cni.conf_dir"),
    ({"cni": {"max_conf_num": -1}}, "cni.max_conf_num"),
    ({"cni": {"ip_pref": "ipv5"}}, "cni.ip_pref"),
    ({"runtimes": {"kata": {"runtime_type": "io.containerd.kata.v2"}}},
     "runtimes.kata.runtime_type"),
])
def test_bad_cni_keys_are_named(data: dict[str, object], key: str) -> None:
    with pytest.raises(ConfigError) as e:
        _runtime(data)
    assert e.value.key == f'plugins."pycrid.cri.v1.runtime".{key}'


def test_default_runtime_must_be_a_handler() -> None:
    config = _runtime({"default_runtime_name": "kata"})
    with pytest.raises(ConfigError) as e:
        asyncio.run(_init_runtime_config(SimpleNamespace(config=config)))  # type: ignore[arg-type]
    assert "default_runtime_name" in str(e.value) and "'kata'" in str(e.value)
