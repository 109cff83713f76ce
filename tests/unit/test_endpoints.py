"""Two config keys naming one socket (or port) stop start-up, naming both (endpoints.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from pycrid.builtins import registry
from pycrid.config.decode import ConfigError
from pycrid.config.loader import LoadedConfig, load
from pycrid.endpoints import check_distinct, endpoints

REGS = registry().registrations()
NRI = '[plugins."pycrid.nri.v1.nri"]'
CADVISOR = '[plugins."pycrid.cadvisor.v1.containerd"]'
CRI = '[plugins."pycrid.grpc.v1.cri"]'


def _load(tmp_path: Path, body: str) -> LoadedConfig:
    path = tmp_path / "config.toml"
    path.write_text("version = 2\n" + body)
    return load(str(path), REGS)


def test_the_defaults_do_not_collide() -> None:
    loaded = load(None, REGS)
    check_distinct(loaded)
    assert {e.key for e in endpoints(loaded)} == {
        "[grpc] address (--address)", 'plugins."pycrid.nri.v1.nri".socket_path',
        'plugins."pycrid.cadvisor.v1.containerd".socket_path'}


def test_nri_and_cadvisor_at_one_path(tmp_path: Path) -> None:
    sock = tmp_path / "same.sock"
    loaded = _load(tmp_path, f'{NRI}\nsocket_path = "{sock}"\n'
                             f'{CADVISOR}\nsocket_path = "{sock}"\n')
    with pytest.raises(ConfigError) as e:
        check_distinct(loaded)
    text = str(e.value)
    assert 'plugins."pycrid.cadvisor.v1.containerd".socket_path' in text
    assert 'plugins."pycrid.nri.v1.nri".socket_path' in text and str(sock) in text


def test_one_path_by_two_names_collides(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    os.symlink(tmp_path / "real", tmp_path / "link")
    loaded = _load(tmp_path, f'[grpc]\naddress = "unix://{tmp_path}/link/s.sock"\n'
                             f'{NRI}\nsocket_path = "{tmp_path}/real/s.sock"\n')
    with pytest.raises(ConfigError, match=r"\[grpc\] address"):
        check_distinct(loaded)


def test_a_socket_that_is_not_served_does_not_count(tmp_path: Path) -> None:
    sock = tmp_path / "same.sock"
    body = f'{NRI}\nsocket_path = "{sock}"\n{CADVISOR}\nsocket_path = "{sock}"\n'
    check_distinct(_load(tmp_path, body + "disable = true\n"))  # cadvisor off
    check_distinct(_load(tmp_path, f'{NRI}\nsocket_path = "{sock}"\ndisable_connections = true\n'
                                   f'{CADVISOR}\nsocket_path = "{sock}"\n'))
    check_distinct(_load(tmp_path, 'disabled_plugins = ["pycrid.cadvisor.v1.containerd"]\n'
                                   + body))


def test_ports_collide_on_one_host_or_a_wildcard(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"\[metrics\] address"):
        check_distinct(_load(tmp_path, '[metrics]\naddress = "127.0.0.1:10010"\n'
                                       f'{CRI}\nstream_server_port = "10010"\n'))
    with pytest.raises(ConfigError, match="tcp_address"):
        check_distinct(_load(tmp_path, '[grpc]\ntcp_address = "0.0.0.0:10010"\n'
                                       f'[metrics]\naddress = "127.0.0.1:10010"\n'
                                       f'{CRI}\ndisable_tcp_service = false\n'))
    check_distinct(_load(tmp_path, '[metrics]\naddress = "127.0.0.1:10011"\n'
                                   f'{CRI}\nstream_server_port = "10010"\n'))
    check_distinct(_load(tmp_path, '[metrics]\naddress = "127.0.0.1:0"\n'
                                   f'{CRI}\nstream_server_port = "0"\n'))
