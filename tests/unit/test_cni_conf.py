"""CNI config parsing, plugin stdin, result IPs and a pod's CNI arguments (no plugin runs)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from cri_api.v1 import api_pb2 as pb

from pycrid.errors import InvalidArgument
from pycrid.network import cni_args as pod
from pycrid.network.cache import CachedAttachment, ResultCache
from pycrid.network.cni import plugin_config
from pycrid.network.conf import ConfError, load_dir, parse
from pycrid.network.result import interface_ips, select_pod_ips


def conflist(name: Any = "net", **extra: Any) -> dict[str, Any]:
    return {"cniVersion": "1.0.0", "name": name, "plugins": [{"type": "bridge"}], **extra}


def raw(doc: Any) -> bytes:
    return json.dumps(doc).encode()


# ---- parse ---------------------------------------------------------------------------------


def test_parse_conflist() -> None:
    doc = conflist(plugins=[{"type": "bridge"},
                            {"type": "portmap", "capabilities": {"portMappings": True,
                                                                 "bandwidth": False}}])
    net = parse(raw(doc), "/etc/cni/net.d/10-net.conflist")
    assert net.name == "net"
    assert net.cni_version == "1.0.0"
    assert net.types == ["bridge", "portmap"]
    assert net.source == "/etc/cni/net.d/10-net.conflist"
    assert net.raw == raw(doc)
    assert net.capabilities == {"portMappings"}
    assert net.disable_check is False


def test_parse_single_conf_is_wrapped_in_a_list() -> None:
    plugin = {"cniVersion": "0.4.0", "name": "single", "type": "bridge", "bridge": "cni0"}
    net = parse(raw(plugin), "10-single.conf")
    assert net.types == ["bridge"]
    assert net.plugins[0]["bridge"] == "cni0"
    assert json.loads(net.raw) == {"cniVersion": "0.4.0", "name": "single",
                                   "plugins": [plugin]}
    assert parse(net.raw, ".conflist").plugins == net.plugins


def test_parse_json_extension_is_a_single_plugin() -> None:
    net = parse(raw({"cniVersion": "1.0.0", "name": "j", "type": "ptp"}), "x.json")
    assert net.types == ["ptp"]


def test_cni_version_defaults_to_0_1_0() -> None:
    doc = conflist()
    del doc["cniVersion"]
    net = parse(raw(doc), "a.conflist")
    assert net.cni_version == "0.1.0"


def test_cni_versions_picks_newest_supported() -> None:
    doc = conflist(cniVersions=["0.4.0", "1.1.0", "1.0.0", "2.0.0"])
    del doc["cniVersion"]
    assert parse(raw(doc), "a.conflist").cni_version == "1.1.0"


def test_cni_versions_and_cni_version_together() -> None:
    doc = conflist(cniVersion="0.3.1", cniVersions=["1.0.0", "9.9.9"])
    assert parse(raw(doc), "a.conflist").cni_version == "1.0.0"


@pytest.mark.parametrize("versions", [{"cniVersions": ["2.0.0", "1.2.0"]},
                                      {"cniVersion": "1.1.1"}])
def test_no_supported_version_is_refused(versions: dict[str, Any]) -> None:
    doc = {"name": "net", "plugins": [{"type": "bridge"}], **versions}
    with pytest.raises(ConfError, match="no cniVersion this runtime supports"):
        parse(raw(doc), "a.conflist")


@pytest.mark.parametrize(("data", "source", "message"), [
    (b"{not json", "a.conflist", "not valid JSON"),
    (b"[1, 2]", "a.conflist", "must be a JSON object"),
    (raw({"cniVersion": "1.0.0", "plugins": [{"type": "x"}]}), "a.conflist",
     'has no network "name"'),
    (raw(conflist(name="")), "a.conflist", 'has no network "name"'),
    (raw(conflist(name=7)), "a.conflist", 'has no network "name"'),
    (raw(conflist(name="bad name")), "a.conflist", "invalid network name 'bad name'"),
    (raw(conflist(name="-dash")), "a.conflist", "invalid network name"),
    (raw(conflist(plugins=[])), "a.conflist", 'non-empty "plugins" list'),
    (raw({"cniVersion": "1.0.0", "name": "n"}), "a.conflist", 'non-empty "plugins" list'),
    (raw(conflist(plugins=[{"type": "bridge"}, {"mtu": 1}])), "a.conflist",
     'plugin 1 has no "type"'),
    (raw(conflist(plugins=["bridge"])), "a.conflist", "plugin 0 must be a JSON object"),
    (raw({"cniVersion": "1.0.0", "name": "n"}), "a.conf", 'the network has no "type"'),
    (raw(conflist(plugins=[{"type": "../bin/sh"}])), "a.conflist", "invalid type '../bin/sh'"),
    (raw(conflist(plugins=[{"type": ".."}])), "a.conflist", "invalid type '..'"),
    (raw(conflist(plugins=[{"type": "p", "capabilities": {"portMappings": "yes"}}])),
     "a.conflist", "capabilities must map names to booleans"),
    (raw(conflist(plugins=[{"type": "p", "capabilities": ["portMappings"]}])),
     "a.conflist", "capabilities must map names to booleans"),
    (raw(conflist(disableCheck="yes")), "a.conflist", "disableCheck must be a boolean"),
    (raw(conflist(disableCheck=1)), "a.conflist", "disableCheck must be a boolean"),
    (raw(conflist(cniVersion="1.0")), "a.conflist", "invalid cniVersion '1.0'"),
])
def test_invalid_configs(data: bytes, source: str, message: str) -> None:
    with pytest.raises(ConfError, match=message.replace(".", r"\.")):
        parse(data, source)


@pytest.mark.parametrize(("value", "expected"), [(True, True), ("true", True), ("True", True),
                                                 ("false", False), (False, False)])
def test_disable_check(value: Any, expected: bool) -> None:
    assert parse(raw(conflist(disableCheck=value)), "a.conflist").disable_check is expected


# ---- load_dir ------------------------------------------------------------------------------


def write_nets(d: Path, *names: str) -> None:
    for n in names:
        stem = n.rsplit(".", 1)[0].split("-", 1)[-1]
        if n.endswith(".conflist"):
            doc = conflist(stem)
        else:
            doc = {"cniVersion": "1.0.0", "name": stem, "type": "bridge"}
        (d / n).write_text(json.dumps(doc))


def test_load_dir_orders_by_file_name(tmp_path: Path) -> None:
    write_nets(tmp_path, "30-c.conflist", "10-a.conf", "20-b.json")
    nets = load_dir(str(tmp_path), 0)
    assert [n.name for n in nets] == ["a", "b", "c"]
    assert nets[0].source == str(tmp_path / "10-a.conf")


@pytest.mark.parametrize(("max_conf_num", "names"), [(1, ["a"]), (2, ["a", "b"]),
                                                     (0, ["a", "b", "c"])])
def test_load_dir_max_conf_num(tmp_path: Path, max_conf_num: int, names: list[str]) -> None:
    write_nets(tmp_path, "10-a.conflist", "20-b.conflist", "30-c.conflist")
    assert [n.name for n in load_dir(str(tmp_path), max_conf_num)] == names


def test_load_dir_ignores_other_files_and_dotfiles(tmp_path: Path) -> None:
    write_nets(tmp_path, "20-b.conflist")
    (tmp_path / "05-x.conflist.bak").write_text("{broken")
    (tmp_path / "06-x.yaml").write_text("{broken")
    (tmp_path / ".01-hidden.conflist").write_text("{broken")
    (tmp_path / "00-dir.conf").mkdir()
    assert [n.name for n in load_dir(str(tmp_path), 0)] == ["b"]


def test_load_dir_empty_or_missing(tmp_path: Path) -> None:
    (tmp_path / "readme.txt").write_text("hi")
    with pytest.raises(ConfError, match="no network config found in"):
        load_dir(str(tmp_path), 1)
    with pytest.raises(ConfError, match="no network config found in"):
        load_dir(str(tmp_path / "missing"), 1)


def test_load_dir_error_names_the_file(tmp_path: Path) -> None:
    write_nets(tmp_path, "10-a.conflist")
    (tmp_path / "20-bad.conflist").write_text(json.dumps(conflist(plugins=[])))
    with pytest.raises(ConfError) as info:
        load_dir(str(tmp_path), 0)
    assert str(info.value).startswith(f"invalid CNI config {tmp_path / '20-bad.conflist'}: ")
    assert "plugins" in str(info.value)


# ---- plugin_config -------------------------------------------------------------------------


def chain_net() -> Any:
    return parse(raw(conflist(name="chain", plugins=[
        {"type": "bridge", "name": "ignored", "cniVersion": "0.1.0"},
        {"type": "portmap", "capabilities": {"portMappings": True, "bandwidth": False,
                                             "dns": True},
         "runtimeConfig": {"portMappings": ["from-file"], "other": 1}},
    ])), "a.conflist")


def test_plugin_config_injects_name_and_version() -> None:
    net = chain_net()
    conf = json.loads(plugin_config(net, net.plugins[0], None, {"portMappings": [1]}))
    assert conf == {"type": "bridge", "name": "chain", "cniVersion": "1.0.0"}


def test_plugin_config_prev_result_only_when_given() -> None:
    net = chain_net()
    prev = {"cniVersion": "1.0.0", "ips": [{"address": "10.0.0.2/24"}]}
    assert json.loads(plugin_config(net, net.plugins[0], prev, {}))["prevResult"] == prev
    assert "prevResult" not in json.loads(plugin_config(net, net.plugins[0], None, {}))


def test_plugin_config_runtime_config_filtered_and_replaced() -> None:
    net = chain_net()
    caps = {"portMappings": [{"hostPort": 80}], "bandwidth": {"ingressRate": 1000},
            "ipRanges": [[{"subnet": "10.0.0.0/24"}]]}
    conf = json.loads(plugin_config(net, net.plugins[1], None, caps))
    # bandwidth is declared false, dns was not passed, ipRanges is not declared.
    assert conf["runtimeConfig"] == {"portMappings": [{"hostPort": 80}]}
    assert conf["capabilities"] == net.plugins[1]["capabilities"]


def test_plugin_config_without_capabilities_has_no_runtime_config() -> None:
    net = chain_net()
    conf = json.loads(plugin_config(net, net.plugins[0], None, {"portMappings": [1]}))
    assert "runtimeConfig" not in conf


# ---- result IPs ----------------------------------------------------------------------------


def test_interface_ips_of_1_0_0_result() -> None:
    result = {"cniVersion": "1.0.0",
              "interfaces": [{"name": "cni0"}, {"name": "veth1"},
                             {"name": "eth0", "sandbox": "/var/run/netns/x"}],
              "ips": [{"interface": 2, "address": "10.1.0.5/24"},
                      {"interface": 0, "address": "10.1.0.1/24"},
                      {"interface": 2, "address": "fd00::5/64"}]}
    assert interface_ips(result, "eth0") == ["10.1.0.5", "fd00::5"]
    assert interface_ips(result, "cni0") == ["10.1.0.1"]


def test_interface_ips_without_interface_index() -> None:
    result = {"cniVersion": "0.3.1", "ips": [{"version": "4", "address": "10.2.0.7/16"},
                                             {"address": "not-an-ip"}]}
    assert interface_ips(result, "eth0") == ["10.2.0.7"]


def test_interface_ips_of_0_2_0_result() -> None:
    result = {"cniVersion": "0.2.0", "ip4": {"ip": "10.3.0.9/24", "gateway": "10.3.0.1"},
              "ip6": {"ip": "fd03::9/64"}}
    assert interface_ips(result, "eth0") == ["10.3.0.9", "fd03::9"]
    assert interface_ips({"cniVersion": "0.2.0"}, "eth0") == []


@pytest.mark.parametrize(("pref", "expected"), [
    ("ipv4", ["10.0.0.1", "fd00::1", "fd00::2", "10.0.0.2"]),
    ("ipv6", ["fd00::1", "10.0.0.1", "fd00::2", "10.0.0.2"]),
    ("cni", ["10.0.0.1", "fd00::1", "fd00::2", "10.0.0.2"]),
])
def test_select_pod_ips_v4_first(pref: str, expected: list[str]) -> None:
    assert select_pod_ips(["10.0.0.1", "fd00::1", "fd00::2", "10.0.0.2"], pref) == expected


@pytest.mark.parametrize(("pref", "expected"), [
    # containerd: the primary, then the ones before it, then the ones after it.
    ("ipv4", ["10.0.0.1", "fd00::1", "fd00::2", "10.0.0.2"]),
    ("ipv6", ["fd00::1", "fd00::2", "10.0.0.1", "10.0.0.2"]),
    ("cni", ["fd00::1", "fd00::2", "10.0.0.1", "10.0.0.2"]),
])
def test_select_pod_ips_v6_first(pref: str, expected: list[str]) -> None:
    assert select_pod_ips(["fd00::1", "fd00::2", "10.0.0.1", "10.0.0.2"], pref) == expected


def test_select_pod_ips_without_preferred_family() -> None:
    assert select_pod_ips(["fd00::1", "fd00::2"], "ipv4") == ["fd00::1", "fd00::2"]
    assert select_pod_ips(["10.0.0.1"], "ipv6") == ["10.0.0.1"]
    assert select_pod_ips([], "ipv4") == []


# ---- pod arguments -------------------------------------------------------------------------


@pytest.mark.parametrize(("text", "value"), [
    ("10M", 10_000_000), ("1Gi", 2**30), ("1e6", 1_000_000), ("500k", 500_000),
    ("1.5M", 1_500_000), ("100m", 1), ("1500m", 2), ("2Ki", 2048), ("7", 7), (" 1k ", 1000),
])
def test_quantity(text: str, value: int) -> None:
    assert pod.quantity(text) == value


@pytest.mark.parametrize("text", ["", "M", "10MB", "1.2.3k", "ten", "1 k", "10mi", "."])
def test_quantity_refuses(text: str) -> None:
    with pytest.raises(ValueError, match="is not a quantity"):
        pod.quantity(text)


def test_bandwidth() -> None:
    assert pod.bandwidth({}) is None
    assert pod.bandwidth({"other": "1M"}) is None
    assert pod.bandwidth({pod.INGRESS_ANNOTATION: "10M", pod.EGRESS_ANNOTATION: "1k"}) == {
        "ingressRate": 10_000_000, "ingressBurst": 2**32 - 1,
        "egressRate": 1000, "egressBurst": 2**32 - 1}
    assert pod.bandwidth({pod.EGRESS_ANNOTATION: "1P"}) == {"egressRate": 10**15,
                                                           "egressBurst": 2**32 - 1}


@pytest.mark.parametrize(("annotation", "value", "message"), [
    (pod.INGRESS_ANNOTATION, "999", "unreasonably small"),
    (pod.EGRESS_ANNOTATION, "999", "unreasonably small"),
    (pod.INGRESS_ANNOTATION, "1001T", "unreasonably large"),
    (pod.EGRESS_ANNOTATION, "2P", "unreasonably large"),
    (pod.INGRESS_ANNOTATION, "lots", "is not a quantity"),
])
def test_bandwidth_out_of_bounds(annotation: str, value: str, message: str) -> None:
    with pytest.raises(InvalidArgument, match=message) as info:
        pod.bandwidth({annotation: value})
    assert str(info.value).startswith(f"pod annotation {annotation}: ")


def sandbox_config(**kwargs: Any) -> pb.PodSandboxConfig:
    return pb.PodSandboxConfig(
        metadata=pb.PodSandboxMetadata(name="web", namespace="prod", uid="uid-1", attempt=0),
        **kwargs)


def test_port_mappings() -> None:
    config = sandbox_config(port_mappings=[
        pb.PortMapping(protocol=pb.TCP, container_port=80, host_port=8080, host_ip="127.0.0.1"),
        pb.PortMapping(protocol=pb.UDP, container_port=53, host_port=0),
        pb.PortMapping(protocol=pb.SCTP, container_port=9, host_port=9009),
    ])
    assert pod.port_mappings(config) == [
        {"hostPort": 8080, "containerPort": 80, "protocol": "tcp", "hostIP": "127.0.0.1"},
        {"hostPort": 9009, "containerPort": 9, "protocol": "sctp", "hostIP": ""},
    ]


def test_attachment_minimal() -> None:
    att = pod.attachment("sb1", "/var/run/netns/n1", sandbox_config(annotations={"a": "b"}))
    assert att.container_id == "sb1"
    assert att.netns == "/var/run/netns/n1"
    assert att.args == (("K8S_POD_NAMESPACE", "prod"), ("K8S_POD_NAME", "web"),
                        ("K8S_POD_INFRA_CONTAINER_ID", "sb1"), ("K8S_POD_UID", "uid-1"),
                        ("IgnoreUnknown", "1"))
    assert att.capabilities == {pod.POD_ANNOTATIONS_CAPABILITY: {"a": "b"}}


def test_attachment_with_everything() -> None:
    config = sandbox_config(
        annotations={pod.INGRESS_ANNOTATION: "1M"},
        port_mappings=[pb.PortMapping(protocol=pb.UDP, container_port=53, host_port=5353)],
        dns_config=pb.DNSConfig(servers=["10.96.0.10"], searches=["svc.local"],
                                options=["ndots:5"]),
        linux=pb.LinuxPodSandboxConfig(cgroup_parent="/kubepods/pod1"))
    att = pod.attachment("sb2", "/ns", config, ["10.244.1.0/24", "fd00:1::/64"])
    assert att.capabilities == {
        pod.POD_ANNOTATIONS_CAPABILITY: {pod.INGRESS_ANNOTATION: "1M"},
        "portMappings": [{"hostPort": 5353, "containerPort": 53, "protocol": "udp",
                          "hostIP": ""}],
        "bandwidth": {"ingressRate": 1_000_000, "ingressBurst": 2**32 - 1},
        "dns": {"servers": ["10.96.0.10"], "searches": ["svc.local"], "options": ["ndots:5"]},
        "cgroupPath": "/kubepods/pod1",
        "ipRanges": [[{"subnet": "10.244.1.0/24"}], [{"subnet": "fd00:1::/64"}]],
    }


def test_attachment_only_port_mappings_with_host_port() -> None:
    config = sandbox_config(port_mappings=[pb.PortMapping(container_port=80)])
    assert "portMappings" not in pod.attachment("sb", "/ns", config).capabilities


def test_attachment_bad_bandwidth_is_invalid_argument() -> None:
    config = sandbox_config(annotations={pod.EGRESS_ANNOTATION: "10"})
    with pytest.raises(InvalidArgument, match=pod.EGRESS_ANNOTATION):
        pod.attachment("sb", "/ns", config)


def test_huge_quantities_are_refused_quickly() -> None:
    for text in ("1e999999", "1e1000000", "-1e40"):
        with pytest.raises(ValueError, match="out of range"):
            pod.quantity(text)


def test_purge_keeps_another_pods_entry(tmp_path: Path) -> None:
    cache = ResultCache(str(tmp_path))
    other = CachedAttachment(network="my-abc-net", container_id="xyz", ifname="eth0",
                             netns="", config=b"{}", args=(), capabilities={}, result={})
    mine = CachedAttachment(network="net", container_id="abc", ifname="eth0",
                            netns="", config=b"{}", args=(), capabilities={}, result={})
    cache.put(other)
    cache.put(mine)
    cache.purge("abc")
    assert [e.container_id for e in cache.of("xyz")] == ["xyz"]
    assert cache.of("abc") == []


def test_disable_check_survives_wrapping_a_single_conf() -> None:
    net = parse(b'{"cniVersion":"1.0.0","name":"n","type":"bridge","disableCheck":true}', "a.conf")
    assert parse(net.raw, ".conflist").disable_check is True


def test_check_prev_result_gets_the_host_side_macs_of_now() -> None:
    from pycrid.network.result import with_current_host_macs

    result = {"cniVersion": "1.0.0", "interfaces": [
        {"name": "cni0", "mac": "aa:aa:aa:aa:aa:01"},
        {"name": "veth1", "mac": "aa:aa:aa:aa:aa:02"},
        {"name": "gone0", "mac": "aa:aa:aa:aa:aa:03"},
        {"name": "eth0", "mac": "aa:aa:aa:aa:aa:04", "sandbox": "/run/netns/p"}],
        "ips": [{"interface": 3, "address": "10.0.0.2/24"}]}
    now = {"cni0": "02:00:00:00:00:01", "veth1": "02:00:00:00:00:02",
           "eth0": "02:00:00:00:00:09"}
    got = with_current_host_macs(result, now.get)
    assert [i["mac"] for i in got["interfaces"]] == [
        "02:00:00:00:00:01", "02:00:00:00:00:02", "aa:aa:aa:aa:aa:03", "aa:aa:aa:aa:aa:04"]
    assert got["ips"] == result["ips"]
    assert result["interfaces"][0]["mac"] == "aa:aa:aa:aa:aa:01"  # the cache is untouched
