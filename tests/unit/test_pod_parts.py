"""Small pod and container helpers: DNS files, stop signals, runc output, netns."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from cri_api.v1 import api_pb2 as pb

from pycrid.core.containers import labels_match
from pycrid.core.containers.create import parse_signal
from pycrid.errors import InvalidArgument
from pycrid.host.facts import own_oom_score_adj
from pycrid.network.netns import create_netns, is_pinned, remove_netns
from pycrid.runtime.runc_cli import CappedSink as _CappedSink
from pycrid.runtime.runc_cli import runc_message as _runc_message
from pycrid.sandbox.files import resolv_conf

# ---- pause: resolv.conf and oom_score_adj --------------------------------------------


def test_resolv_conf_without_dns_copies_host_file(tmp_path: Path) -> None:
    host = tmp_path / "resolv.conf"
    host.write_bytes(b"nameserver 10.0.0.1\n# comment\n")
    assert resolv_conf(None, str(host)) == b"nameserver 10.0.0.1\n# comment\n"


def test_resolv_conf_without_dns_and_host_file_is_empty(tmp_path: Path) -> None:
    assert resolv_conf(None, str(tmp_path / "missing")) == b""


def test_resolv_conf_from_dns_config(tmp_path: Path) -> None:
    host = tmp_path / "resolv.conf"
    host.write_bytes(b"nameserver 9.9.9.9\n")
    dns = pb.DNSConfig(servers=["10.96.0.10", "8.8.8.8"],
                       searches=["ns.svc.cluster.local", "svc.cluster.local"],
                       options=["ndots:5", "edns0"])
    assert resolv_conf(dns, str(host)) == (
        b"search ns.svc.cluster.local svc.cluster.local\n"
        b"nameserver 10.96.0.10\n"
        b"nameserver 8.8.8.8\n"
        b"options ndots:5 edns0\n")


def test_resolv_conf_servers_only() -> None:
    assert resolv_conf(pb.DNSConfig(servers=["1.1.1.1"])) == b"nameserver 1.1.1.1\n"


def test_resolv_conf_empty_dns_config_is_empty(tmp_path: Path) -> None:
    host = tmp_path / "resolv.conf"
    host.write_bytes(b"nameserver 9.9.9.9\n")
    assert resolv_conf(pb.DNSConfig(), str(host)) == b""


def test_own_oom_score_adj_matches_proc() -> None:
    value = own_oom_score_adj()
    assert isinstance(value, int)
    assert value == int(Path("/proc/self/oom_score_adj").read_text())
    assert -1000 <= value <= 1000


# ---- containers: stop signals and label selectors ------------------------------------


@pytest.mark.parametrize(("given_", "name"), [
    ("SIGINT", "SIGINT"), ("INT", "SIGINT"), ("2", "SIGINT"), ("sigquit", "SIGQUIT"),
    (" SIGKILL ", "SIGKILL"), ("9", "SIGKILL"), ("", "SIGTERM"), ("  ", "SIGTERM"),
])
def test_parse_signal(given_: str, name: str) -> None:
    assert parse_signal(given_) == name


@pytest.mark.parametrize("bad", ["SIGNOPE", "NOPE", "0", "999", "-1", "SIG", "2x"])
def test_parse_signal_rejects(bad: str) -> None:
    with pytest.raises(InvalidArgument, match="invalid stop signal"):
        parse_signal(bad)


def test_labels_match() -> None:
    labels = {"app": "web", "tier": "front"}
    assert labels_match({}, labels)
    assert labels_match({"app": "web"}, labels)
    assert labels_match({"app": "web", "tier": "front"}, labels)
    assert not labels_match({"app": "db"}, labels)
    assert not labels_match({"missing": "x"}, labels)
    assert not labels_match({"app": "web", "tier": "back"}, labels)
    assert not labels_match({"app": ""}, labels)



# ---- conmon helpers ------------------------------------------------------------------


def test_runc_message_extracts_logrus_msg() -> None:
    raw = (b'time="2024-01-01T00:00:00Z" level=error '
           b'msg="container \\"x\\" does not exist"\n')
    assert _runc_message(raw) == 'container "x" does not exist'


def test_runc_message_joins_lines_and_keeps_plain_text() -> None:
    raw = b'time="t" level=warning msg="first"\nplain failure\n\n'
    assert _runc_message(raw) == "first; plain failure"


def test_runc_message_of_empty_output() -> None:
    assert _runc_message(b"") == ""


async def test_capped_sink_keeps_first_cap_bytes() -> None:
    sink = _CappedSink(1000)
    data = bytes(range(256)) * 1000  # 256000 bytes in 64 KiB writes
    for i in range(0, len(data), 65536):
        await sink.write(data[i:i + 65536])
    assert bytes(sink.data) == data[:1000]


async def test_capped_sink_short_output_is_whole() -> None:
    sink = _CappedSink(1000)
    await sink.write(b"hel")
    await sink.write(b"lo")
    await sink.close()
    assert bytes(sink.data) == b"hello"


# ---- network namespaces --------------------------------------------------------------


def lo_line(path: str) -> str:
    out = subprocess.run(["nsenter", f"--net={path}", "ip", "-o", "link", "show", "lo"],
                         capture_output=True, text=True, check=True)
    return out.stdout


def mounts_mentioning(path: Path) -> list[str]:
    return [line for line in Path("/proc/self/mountinfo").read_text().splitlines()
            if str(path) in line]


@pytest.fixture
def netns_dir(tmp_path: Path):  # type: ignore[no-untyped-def]
    d = tmp_path / "netns"
    yield d
    for p in d.glob("*") if d.exists() else []:
        remove_netns(str(p))
    assert mounts_mentioning(tmp_path) == []


def test_create_netns_pins_with_lo_up(netns_dir: Path) -> None:
    path = str(netns_dir / "pod1")
    create_netns(path)
    assert is_pinned(path)
    line = lo_line(path)
    assert "lo:" in line
    assert "UP" in line.split(">", 1)[0]  # flags such as <LOOPBACK,UP,LOWER_UP>
    # A different namespace from ours.
    assert os.stat(path).st_ino != os.stat("/proc/self/ns/net").st_ino


def test_remove_netns_unpins_and_deletes(netns_dir: Path, tmp_path: Path) -> None:
    path = str(netns_dir / "pod1")
    create_netns(path)
    remove_netns(path)
    assert not is_pinned(path)
    assert not os.path.exists(path)
    assert mounts_mentioning(tmp_path) == []
    remove_netns(path)  # a second remove is a no-op


def test_remove_netns_of_plain_file_deletes_it(tmp_path: Path) -> None:
    path = tmp_path / "plain"
    path.write_text("")
    assert not is_pinned(str(path))
    remove_netns(str(path))
    assert not path.exists()


def test_create_netns_on_existing_path_fails_and_keeps_it(netns_dir: Path) -> None:
    path = str(netns_dir / "pod1")
    create_netns(path)
    ino = os.stat(path).st_ino
    with pytest.raises(FileExistsError):
        create_netns(path)
    assert is_pinned(path)
    assert os.stat(path).st_ino == ino


def test_two_netns_are_distinct(netns_dir: Path) -> None:
    a, b = str(netns_dir / "a"), str(netns_dir / "b")
    create_netns(a)
    create_netns(b)
    assert os.stat(a).st_ino != os.stat(b).st_ino
    remove_netns(a)
    assert not is_pinned(a)
    assert is_pinned(b)
