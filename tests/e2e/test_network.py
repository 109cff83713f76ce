"""Pod networking with the real CNI plugins (bridge, host-local, portmap, tuning).

Every daemon here runs on its own test bridge and /24 (tests/support/network.py);
traffic stays between pods, the host's loopback and the bridge.
"""

from __future__ import annotations

import ipaddress
import json
import os
import socket
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from cri_api.v1 import api_pb2 as pb

from tests.support import network
from tests.support.daemon import Daemon, running_daemon
from tests.support.images import TestImages
from tests.support.pods import (
    Pods,
    busybox_daemon,
    container_config,
    daemon_config,
    leftovers,
    pod_config,
    wait_for,
)
from tests.support.registry import LocalRegistry

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory, registry: LocalRegistry,
           test_images: TestImages) -> Iterator[Daemon]:
    base = tmp_path_factory.mktemp("net")
    with busybox_daemon(base, registry, test_images) as d:
        yield d


@pytest.fixture
def pods(daemon: Daemon) -> Iterator[Pods]:
    p = Pods(daemon.client)
    yield p
    p.cleanup()
    assert leftovers(daemon.root, daemon.state) == []


def _httpd(daemon: Daemon, port: int, page: str) -> Any:
    script = (f"mkdir -p /www && echo {page} > /www/index.html && "
              f"exec busybox httpd -f -p {port} -h /www")
    return container_config(daemon.extra["busybox"], "web", command=["sh", "-c", script])


def _sleeper(daemon: Daemon, name: str = "client") -> Any:
    return container_config(daemon.extra["busybox"], name, command=["sleep", "3600"])


def _ips(pods: Pods, sid: str) -> list[str]:
    net = pods.pod_status(sid).status.network
    return [net.ip] + [a.ip for a in net.additional_ips] if net.ip else []


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _network_ready(d: Daemon) -> Any:
    st = d.client.runtime.Status(pb.StatusRequest(), timeout=10)
    return next(c for c in st.status.conditions if c.type == "NetworkReady")


def test_two_pods_reach_each_other(daemon: Daemon, pods: Pods) -> None:
    web_pod, client_pod = pod_config(), pod_config()
    web = pods.run(web_pod)
    pods.run_container(web, _httpd(daemon, 8080, "hello-from-web"), web_pod)
    client = pods.run(client_pod)
    cid = pods.run_container(client, _sleeper(daemon), client_pod)

    subnet = ipaddress.ip_network(network.subnet_of(daemon.extra["base"]))
    (web_ip,), (client_ip,) = _ips(pods, web), _ips(pods, client)
    assert ipaddress.ip_address(web_ip) in subnet and ipaddress.ip_address(client_ip) in subnet
    assert web_ip != client_ip
    # The address is the one the pod's eth0 really has.
    shown = pods.exec(cid, ["busybox", "ip", "addr", "show", "eth0"]).stdout.decode()
    assert f"inet {client_ip}/24" in shown

    def fetch() -> bytes:
        # busybox's wget dies with SIGSEGV inside these containers; nc does the job.
        get = f"printf 'GET / HTTP/1.0\\r\\n\\r\\n' | busybox nc -w 2 {web_ip} 8080"
        r = pods.exec(cid, ["sh", "-c", get], timeout=10)
        return bytes(r.stdout).rsplit(b"\r\n\r\n", 1)[-1] if r.exit_code == 0 else b""

    assert wait_for(fetch, 20, "the web pod to answer") == b"hello-from-web\n"
    # No route leaves the pod subnet: pod traffic cannot be forwarded off the host.
    routes = pods.exec(cid, ["busybox", "ip", "route"]).stdout.decode()
    assert "default" not in routes, routes
    # NRI and verbose status see the same IPs; the cached CNI result is reported.
    info = json.loads(pods.pod_status(client, verbose=True).info["info"])
    assert [ip["address"] for ip in info["cniResult"]["eth0"]["ips"]] == [f"{client_ip}/24"]


def test_host_port_reachable_on_loopback(daemon: Daemon, pods: Pods) -> None:
    port = _free_port()
    pod = pod_config(port_mappings=[pb.PortMapping(protocol=pb.TCP, container_port=8080,
                                                   host_port=port, host_ip="127.0.0.1")])
    sid = pods.run(pod)
    pods.run_container(sid, _httpd(daemon, 8080, "via-hostport"), pod)

    def fetch() -> bytes:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=2) as r:
                return bytes(r.read())
        except OSError:
            return b""

    assert wait_for(fetch, 20, "the host port to answer") == b"via-hostport\n"
    assert any(f"--dport {port}" in r for r in network.pod_nat_rules())
    pods.remove_pod(sid)
    assert not [r for r in network.pod_nat_rules() if f"--dport {port}" in r]


def test_host_network_pod_skips_cni(daemon: Daemon, pods: Pods) -> None:
    pod = pod_config(linux=pb.LinuxPodSandboxConfig(security_context=pb.LinuxSandboxSecurityContext(
        namespace_options=pb.NamespaceOption(network=pb.NODE))))
    sid = pods.run(pod)
    cid = pods.run_container(sid, _sleeper(daemon), pod)
    # The node's own network namespace (its interface list may change meanwhile: other
    # runtimes' pods come and go on a busy node).
    inside = pods.exec(cid, ["readlink", "/proc/self/ns/net"]).stdout.decode().strip()
    assert inside == os.readlink("/proc/self/ns/net")
    assert {"lo", "eth0"} <= set(pods.exec(cid, ["ls", "/sys/class/net"]).stdout.decode().split())
    assert _ips(pods, sid) == []
    assert network.allocated_ips(daemon.extra["base"]) == []


def test_bad_bandwidth_annotation_is_refused(daemon: Daemon, pods: Pods) -> None:
    pod = pod_config(annotations={"kubernetes.io/ingress-bandwidth": "lots"})
    with pytest.raises(grpc.RpcError) as e:
        pods.run(pod)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "kubernetes.io/ingress-bandwidth" in (e.value.details() or "")


# ---- daemons of their own: config changes, restarts, failures -------------------------------


@pytest.fixture
def own(tmp_path: Path, registry: LocalRegistry, test_images: TestImages) -> tuple[str, str]:
    """(base, daemon config) for a test that starts its own daemon(s)."""
    base = str(tmp_path / "d")
    return base, daemon_config(registry, test_images, base)


def _not_ready(d: Daemon) -> Any:
    cond = _network_ready(d)
    return None if cond.status else cond


def test_conf_hot_reload(own: tuple[str, str]) -> None:
    base, config = own
    with running_daemon(base, config) as d:
        p = Pods(d.client)
        try:
            assert _network_ready(d).status is True
            conf = os.path.join(network.conf_dir(base), "10-test.conflist")
            saved = Path(conf).read_bytes()
            os.unlink(conf)
            cond = wait_for(lambda: _not_ready(d), 10, "NetworkReady to turn false")
            assert cond.reason == "NetworkPluginNotReady"
            assert "no network config found" in cond.message
            with pytest.raises(grpc.RpcError) as e:
                p.run(pod_config())
            assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION
            assert "no network config found" in (e.value.details() or "")
            assert leftovers(d.root, d.state) == []

            Path(conf).write_bytes(saved)
            wait_for(lambda: _network_ready(d).status, 10, "NetworkReady to turn true")
            sid = p.run(pod_config())
            assert len(_ips(p, sid)) == 1
        finally:
            p.cleanup()
        assert leftovers(d.root, d.state) == []


def test_broken_conflist_gets_a_clear_error(own: tuple[str, str]) -> None:
    base, config = own
    conf_dir = network.conf_dir(base)
    network.write_conflist(conf_dir, {"cniVersion": "1.0.0", "name": "broken",
                                      "plugins": [{"type": "bridge"}, {"bridge": "x"}]},
                           "05-broken.conflist")
    with running_daemon(base, config) as d:
        cond = _network_ready(d)
        assert cond.status is False
        assert "05-broken.conflist" in cond.message and "no \"type\"" in cond.message
        with pytest.raises(grpc.RpcError) as e:
            Pods(d.client).run(pod_config())
        assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "05-broken.conflist" in (e.value.details() or "")
        # A plugin that does not exist is named too.
        network.write_conflist(conf_dir, {"cniVersion": "1.0.0", "name": "broken",
                                          "plugins": [{"type": "no-such-plugin"}]},
                               "05-broken.conflist")
        wait_for(lambda: "no-such-plugin" in _network_ready(d).message, 10,
                 "the missing plugin to be reported")
        os.unlink(os.path.join(conf_dir, "05-broken.conflist"))
        wait_for(lambda: _network_ready(d).status, 10, "NetworkReady once the file is gone")
        assert leftovers(d.root, d.state) == []


def test_failed_add_is_undone(own: tuple[str, str]) -> None:
    """bridge and host-local succeed, then tuning fails: DEL runs, nothing is left."""
    base, config = own
    doc = network.test_conflist(base)
    doc["plugins"].insert(1, {"type": "tuning",
                              "sysctl": {"net.ipv4.conf.eth0.no_such_sysctl": "1"}})
    network.write_conflist(network.conf_dir(base), doc)
    veths = network.veths(network.our_bridges())
    with running_daemon(base, config) as d:
        with pytest.raises(grpc.RpcError) as e:
            Pods(d.client).run(pod_config())
        assert e.value.code() == grpc.StatusCode.UNKNOWN
        assert "type='tuning' failed (add)" in (e.value.details() or "")
        assert "no_such_sysctl" in (e.value.details() or "")
        assert leftovers(d.root, d.state) == []
        assert network.veths(network.our_bridges()) == veths


def test_restart_then_stop_releases_the_ip(own: tuple[str, str]) -> None:
    base, config = own
    with running_daemon(base, config) as d:
        pod = pod_config()
        sid = Pods(d.client).run(pod)
        ips = _ips(Pods(d.client), sid)
        assert len(network.allocated_ips(base)) == 1
    # Down: the pod's netns, veth and IP stay. The config directory changes meanwhile;
    # DEL must still use what ADD used (the cached result and config).
    conf = os.path.join(network.conf_dir(base), "10-test.conflist")
    os.rename(conf, conf + ".off")
    try:
        with running_daemon(base, config) as d:
            p = Pods(d.client)
            st = p.pod_status(sid).status
            assert st.state == pb.SANDBOX_READY and _ips(p, sid) == ips
            d.client.runtime.StopPodSandbox(pb.StopPodSandboxRequest(pod_sandbox_id=sid),
                                            timeout=30)
            assert network.allocated_ips(base) == []
            d.client.runtime.StopPodSandbox(pb.StopPodSandboxRequest(pod_sandbox_id=sid),
                                            timeout=30)  # idempotent
            d.client.runtime.RemovePodSandbox(pb.RemovePodSandboxRequest(pod_sandbox_id=sid),
                                              timeout=30)
            assert leftovers(d.root, d.state) == []
    finally:
        os.rename(conf + ".off", conf)


def test_update_runtime_config_writes_conf_from_template(own: tuple[str, str],
                                                         tmp_path: Path) -> None:
    base, config = own
    cidr = network.subnet_of(base)
    doc = network.test_conflist(base, name="from-template")
    doc["plugins"][0]["ipam"]["ranges"] = "RANGES"
    template = tmp_path / "cni.template"
    template.write_text(json.dumps(doc, indent=2).replace(
        '"RANGES"', '[{{range $i, $r := .PodCIDRRanges}}{{if $i}}, {{end}}'
                    '[{"subnet": "{{$r}}"}]{{end}}]'))
    conf_dir = tmp_path / "empty-net.d"
    config += (f'{network.CNI_SECTION}\nconf_dir = "{conf_dir}"\n'
               f'bin_dirs = {json.dumps(network.BIN_DIRS)}\nconf_template = "{template}"\n')
    with running_daemon(base, config) as d:
        assert _network_ready(d).status is False
        d.client.runtime.UpdateRuntimeConfig(pb.UpdateRuntimeConfigRequest(
            runtime_config=pb.RuntimeConfig(network_config=pb.NetworkConfig(pod_cidr=cidr))),
            timeout=10)
        written = json.loads((conf_dir / "10-pycrid-net.conflist").read_text())
        assert written["plugins"][0]["ipam"]["ranges"] == [[{"subnet": cidr}]]
        assert _network_ready(d).status is True
        p = Pods(d.client)
        try:
            sid = p.run(pod_config())
            assert ipaddress.ip_address(_ips(p, sid)[0]) in ipaddress.ip_network(cidr)
        finally:
            p.cleanup()
        with pytest.raises(grpc.RpcError) as e:
            d.client.runtime.UpdateRuntimeConfig(pb.UpdateRuntimeConfigRequest(
                runtime_config=pb.RuntimeConfig(
                    network_config=pb.NetworkConfig(pod_cidr="10.1.2.3/99"))), timeout=10)
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert leftovers(d.root, d.state) == []


RECORDER = '''#!{python}
"""A pass-through CNI plugin that logs what it was called with."""
import json, os, sys
conf = json.load(sys.stdin)
env = {{k: v for k, v in os.environ.items() if k.startswith("CNI_")}}
if env["CNI_COMMAND"] == "VERSION":
    print(json.dumps({{"cniVersion": "1.0.0", "supportedVersions": ["1.0.0"]}}))
    sys.exit(0)
with open(conf["log"], "a") as f:
    f.write(json.dumps({{"env": env, "conf": conf}}) + "\\n")
if env["CNI_COMMAND"] == "ADD":
    print(json.dumps(conf["prevResult"]))
'''


def test_pod_identity_and_capabilities_reach_plugins(own: tuple[str, str],
                                                     tmp_path: Path) -> None:
    """CNI_ARGS and the runtimeConfig a plugin declares come from the CRI request."""
    base, config = own
    bin_dir, log = tmp_path / "bin", tmp_path / "calls.jsonl"
    bin_dir.mkdir()
    (bin_dir / "recorder").write_text(RECORDER.format(python=sys.executable))
    (bin_dir / "recorder").chmod(0o755)
    doc = network.test_conflist(base)
    doc["plugins"].append({"type": "recorder", "log": str(log),
                           "capabilities": {"portMappings": True, "dns": True,
                                            "bandwidth": True}})
    conf_dir = tmp_path / "net.d"
    network.write_conflist(str(conf_dir), doc)
    config += (f'{network.CNI_SECTION}\nconf_dir = "{conf_dir}"\n'
               f'bin_dirs = {json.dumps([str(bin_dir), *network.BIN_DIRS])}\n')
    port = _free_port()
    pod = pod_config(
        "ident", "team-a",
        port_mappings=[pb.PortMapping(protocol=pb.UDP, container_port=53, host_port=port,
                                      host_ip="127.0.0.1"),
                       pb.PortMapping(protocol=pb.TCP, container_port=80)],  # no host port
        dns_config=pb.DNSConfig(servers=["10.0.0.10"], searches=["svc.local"]),
        annotations={"kubernetes.io/egress-bandwidth": "10M"})
    with running_daemon(base, config) as d:
        p = Pods(d.client)
        try:
            sid = p.run(pod)
            ip = _ips(p, sid)[0]
        finally:
            p.cleanup()
        assert leftovers(d.root, d.state) == []
    calls = [json.loads(line) for line in log.read_text().splitlines()]
    add = next(c for c in calls if c["env"]["CNI_COMMAND"] == "ADD")
    assert dict(kv.split("=", 1) for kv in add["env"]["CNI_ARGS"].split(";")) == {
        "K8S_POD_NAMESPACE": "team-a", "K8S_POD_NAME": "ident",
        "K8S_POD_INFRA_CONTAINER_ID": sid, "K8S_POD_UID": "uid-ident", "IgnoreUnknown": "1"}
    assert add["env"]["CNI_IFNAME"] == "eth0" and add["env"]["CNI_CONTAINERID"] == sid
    assert add["conf"]["name"] == "pycrid-test" and add["conf"]["cniVersion"] == "1.0.0"
    assert add["conf"]["prevResult"]["ips"][0]["address"] == f"{ip}/24"
    # Only what the plugin declared, in containerd's shapes.
    assert add["conf"]["runtimeConfig"] == {
        "portMappings": [{"hostPort": port, "containerPort": 53, "protocol": "udp",
                          "hostIP": "127.0.0.1"}],
        "dns": {"servers": ["10.0.0.10"], "searches": ["svc.local"], "options": []},
        "bandwidth": {"egressRate": 10_000_000, "egressBurst": 2**32 - 1}}
    # DEL came once, with the cached result as prevResult, after the pod was stopped.
    dels = [c for c in calls if c["env"]["CNI_COMMAND"] == "DEL"]
    assert len(dels) == 1 and dels[0]["conf"]["prevResult"]["ips"][0]["address"] == f"{ip}/24"
